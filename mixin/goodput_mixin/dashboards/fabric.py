"""The fabric rows of level 2, Collectives and network: the RDMA ports and network interfaces of the selected
workloads' nodes (the fabric source), and which NIC each GPU talks through. Every query keeps the node label and is
narrowed to the workloads' nodes with kit.of_workload_nodes, so that a data link carrying a workload (from a slow
collective) shows the fabric of that job's nodes."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from .kit import Filters, Names, of_workload_gpus, of_workload_nodes, row, table_panel, timeseries_panel

RATE = "[$__rate_interval]"


def with_fabric(d: Dashboard, names: Names, f: Filters) -> Dashboard:
    s = names.settings
    c, n = names.cluster, names.node
    nf = f(workload=False)  # fabric series name ports and interfaces, not workloads
    node = "{{" + n + "}}"
    port = node + " {{device}}/{{port}}"
    iface = node + " {{interface}}"

    def nodes(expr: str) -> str:
        return of_workload_nodes(expr, names)

    def rate(metric: str, by: str = "") -> str:
        expr = f"rate({metric}{nf}{RATE})"
        return nodes(f"sum by ({c}, {n}, {by}) ({expr})" if by else expr)

    d = d.with_row(row("Fabric: RDMA ports and network interfaces (nodes of the selected workloads)"))
    d = d.with_panel(timeseries_panel(
        "Port throughput against link rate", "Bytes per second each RDMA port (InfiniBand, RoCE, EFA) sends and "
        "receives, beside the rate its link trained at. Collectives flat at the link rate are bound by the network; "
        "one port with a lower link rate than its peers is a degraded link (GoodputFabricLinkDown); a port near 0 "
        "while the others carry the job's traffic is unused (check NCCL_IB_HCA, the GPU to NIC map below).",
        "Bps", [(rate("goodput_fabric_port_transmit_bytes_total"), port + " tx"),
                (rate("goodput_fabric_port_receive_bytes_total"), port + " rx"),
                (nodes(f"goodput_fabric_port_rate_bytes_per_second{nf}"), port + " link rate")]))
    d = d.with_panel(timeseries_panel(
        "Link utilization", f"Share of each link's rate used, each way, over {names.short}: RDMA ports against their "
        "trained rate, interfaces against their negotiated speed. Near 100% during collectives: the wire is the "
        "limit; low while the job waits on communication: look at errors, congestion and retries instead.",
        "percentunit", [
            (nodes(f"{names.rule('port', 'goodput_fabric_port_utilization_ratio', 'rate')}{nf}"),
             port + " {{direction}}"),
            (nodes(f"{names.rule('interface', 'goodput_fabric_interface_utilization_ratio', 'rate')}{nf}"),
             iface + " {{direction}}")], max_value=1))
    d = d.with_panel(timeseries_panel(
        "Interface throughput against speed", "Bytes per second each network interface (physical or behind a RoCE "
        "port) sends and receives, beside its negotiated speed. A RoCE interface counts what went through the "
        "kernel (sockets, storage); its RDMA traffic shows on the port above.",
        "Bps", [(rate("goodput_fabric_interface_transmit_bytes_total"), iface + " tx"),
                (rate("goodput_fabric_interface_receive_bytes_total"), iface + " rx"),
                (nodes(f"goodput_fabric_interface_speed_bytes_per_second{nf}"), iface + " speed")]))
    d = d.with_panel(timeseries_panel(
        "Link errors per link", f"Link errors per second of each link, as GoodputFabricErrors judges them (over "
        f"{s.fabric_error_rate:g} a second for {s.fabric_errors_for}): an RDMA port's symbol, receive and integrity "
        "errors, or its interface's receive errors (RoCE); an interface's receive errors. A healthy link counts none: "
        "reseat or replace the cable or transceiver of one that does.",
        "cps", [(nodes(f"{names.rule('link', 'goodput_fabric_link_errors', 'rate')}{nf}"),
                 node + " {{device}}{{interface}} {{port}}")]))
    d = d.with_panel(timeseries_panel(
        "Errors and drops by counter", "Every error and drop counter per node, by the sysfs file that counts it "
        "(symbol_error, port_rcv_errors, port_xmit_discards, ... on RDMA ports; rx_errors, rx_crc_errors, rx_dropped, "
        "... on interfaces). Discards and drops without errors point at congestion or a full receive ring, errors at "
        "the link.",
        "cps", [(rate("goodput_fabric_port_errors_total", "counter"), node + " {{counter}}"),
                (rate("goodput_fabric_interface_errors_total", "counter"), node + " {{counter}}")]))
    d = d.with_panel(timeseries_panel(
        "Congestion: ECN marks and CNPs", "RoCE congestion control per port: packets the switches marked with ECN "
        "on the way in (np_ecn_marked_roce_packets), notifications the port sent back (np_cnp_sent), and "
        "notifications it received and slowed down for (rp_cnp_handled). Rising while the job waits on "
        "communication: the fabric is congested (GoodputFabricCongestion); check PFC/ECN settings and routing.",
        "pps", [(rate("goodput_fabric_port_congestion_packets_total"), port + " {{counter}}")]))
    d = d.with_panel(timeseries_panel(
        "Congested share of packets", f"Per RoCE port, the larger of: the share of received packets that were "
        f"ECN-marked or answered with a CNP, and CNPs handled per packet sent. Over {s.fabric_congestion_ratio:.1%} "
        f"while the node's workloads wait over {s.fabric_congestion_comm_wait_ratio:.0%} of their time on "
        f"communication pages as GoodputFabricCongestion.",
        "percentunit", [(nodes(f"{names.rule('link', 'goodput_fabric_congestion_ratio', 'rate')}{nf}"), port)]))
    d = d.with_panel(timeseries_panel(
        "Transmit wait (InfiniBand back-pressure)", "Ticks per second during which an RDMA port had data to send but "
        "the link partner had no buffer for it (port_xmit_wait; the tick is the adapter's). InfiniBand's sign of "
        "congestion, where RoCE has ECN: rising on the ports of one switch points at that switch or its routing.",
        "short", [(rate("goodput_fabric_port_transmit_wait_total"), port)]))
    d = d.with_panel(timeseries_panel(
        "Retransmissions and timeouts", "Transport retries per second per node, by kind: out-of-sequence packets, "
        "sequence errors, local ACK timeouts, RNR NAK retries, adaptive retransmissions (RoCE hw_counters, EFA). "
        "Each is a packet lost or reordered and sent again; timeouts stall a queue pair for milliseconds.",
        "cps", [(rate("goodput_fabric_port_retransmission_events_total", "counter"), node + " {{counter}}")]))
    d = d.with_panel(timeseries_panel(
        "Links not up", "1 while an RDMA port is not ACTIVE (goodput_fabric_port_state other than 4) or a network "
        "interface is not up. Ports and interfaces nobody cabled stay at 1: GoodputFabricLinkDown only judges links "
        "that had a carrier, on nodes whose GPUs were in use.",
        "none", [(nodes(f"goodput_fabric_port_state{nf} != bool 4"), port),
                 (nodes(f"goodput_fabric_interface_up{nf} == bool 0"), iface)], max_value=1))
    d = d.with_panel(timeseries_panel(
        "Link losses", "Times per interval each link went down (link_downed), retrained without going down "
        "(link_error_recovery) or changed carrier (an interface: one loss is a down and an up). Repeated losses are "
        f"a flapping link (GoodputFabricLinkFlapping: {s.fabric_flaps} in {s.fabric_flap_window}).",
        "short", [(nodes(f"increase(goodput_fabric_port_link_downed_total{nf}{RATE})"), port + " down"),
                  (nodes(f"increase(goodput_fabric_port_link_error_recovery_total{nf}{RATE})"), port + " retrained"),
                  (nodes(f"increase(goodput_fabric_interface_carrier_changes_total{nf}{RATE})"),
                   iface + " carrier changes")]))
    d = d.with_row(row("Which NIC each GPU talks through"))
    d = d.with_panel(table_panel(
        "Closest NIC of each GPU", "For each GPU, the NIC ports closest to it on the PCI tree (several on a tie) and "
        "how it reaches them, as nvidia-smi topo -m prints it: PIX (one PCIe switch), PXB (several switches), PHB "
        "(the host bridge), NODE (between host bridges of a NUMA node), SYS (across sockets). NCCL should use these.",
        "none", [(nodes(f"goodput_gpu_preferred_nic_info{nf}"), "")]))
    d = d.with_panel(table_panel(
        "NCCL keeps a GPU off its closest NIC", "Processes holding the selected workloads' GPUs whose NCCL_IB_HCA or "
        "NCCL_SOCKET_IFNAME leaves out every NIC closest to the GPU (value 1; 0 where the setting allows one). Their "
        "traffic crosses more of the PCI tree than it needs to: fix the job's NCCL environment.",
        "none", [(of_workload_gpus(f"goodput_gpu_nic_excluded{nf}", names), "")]))
    d = d.with_panel(table_panel(
        "GPU to NIC paths", "How every GPU reaches every NIC port of its node (the path of nvidia-smi topo -m, one row "
        "per pair). Use it to see what a job's NCCL_IB_HCA choice costs each GPU.",
        "none", [(nodes(f"goodput_gpu_nic_info{nf}"), "")], width=24))
    return d
