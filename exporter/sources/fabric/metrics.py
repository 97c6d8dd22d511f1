"""Metrics of the `fabric` source: InfiniBand, RoCE and Ethernet ports, and which NIC each GPU talks through.

Counters keep the sysfs file they came from in a `counter` label where one metric gathers several files, so a
value can be traced back to the kernel's documentation of that file (docs/fabric.md has the table).
"""

from __future__ import annotations

from ...core.catalog import GPU, Declarer, Kind

_m = Declarer("fabric")

PORT = ("device", "port")
IFACE = ("interface",)

# --- RDMA ports: /sys/class/infiniband/<device>/ports/<port>/ -----------------------------------------------
PORT_INFO = _m(
    "goodput_fabric_port_info", Kind.INFO, "",
    "An RDMA port: its link layer as sysfs names it (InfiniBand; Ethernet, i.e. RoCE; Unknown, e.g. AWS EFA) "
    "and, for RoCE, the network interface behind it (empty otherwise). Value is always 1.",
    (*PORT, "link_layer", "netdev"))
PORT_STATE = _m(
    "goodput_fabric_port_state", Kind.GAUGE, "",
    "Logical state of an RDMA port, as the number sysfs gives: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 "
    "ACTIVE_DEFER. Only 4 carries traffic.", PORT)
PORT_PHYS_STATE = _m(
    "goodput_fabric_port_physical_state", Kind.GAUGE, "",
    "Physical state of an RDMA port: 1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining, 5 LinkUp, "
    "6 LinkErrorRecovery, 7 Phy Test.", PORT)
PORT_RATE = _m(
    "goodput_fabric_port_rate_bytes_per_second", Kind.GAUGE, "bytes_per_second",
    "Data rate the RDMA port's link trained at (sysfs `rate`, in bytes per second); below the rate of its "
    "peers on the node, the link runs degraded.", PORT)
PORT_TX_BYTES = _m(
    "goodput_fabric_port_transmit_bytes_total", Kind.COUNTER, "bytes",
    "Bytes the RDMA port sent (counters/port_xmit_data, which counts 4-octet words, times 4; EFA: "
    "hw_counters/tx_bytes).", PORT)
PORT_RX_BYTES = _m(
    "goodput_fabric_port_receive_bytes_total", Kind.COUNTER, "bytes",
    "Bytes the RDMA port received (counters/port_rcv_data times 4; EFA: hw_counters/rx_bytes).", PORT)
PORT_TX_PACKETS = _m(
    "goodput_fabric_port_transmit_packets_total", Kind.COUNTER, "",
    "Packets the RDMA port sent (counters/port_xmit_packets; EFA: hw_counters/tx_pkts).", PORT)
PORT_RX_PACKETS = _m(
    "goodput_fabric_port_receive_packets_total", Kind.COUNTER, "",
    "Packets the RDMA port received (counters/port_rcv_packets; EFA: hw_counters/rx_pkts).", PORT)
PORT_LINK_DOWNED = _m(
    "goodput_fabric_port_link_downed_total", Kind.COUNTER, "",
    "Times the port's link went down after being up (counters/link_downed); a rise is a flap.", PORT)
PORT_LINK_RECOVERY = _m(
    "goodput_fabric_port_link_error_recovery_total", Kind.COUNTER, "",
    "Times the port's link recovered from errors by retraining (counters/link_error_recovery).", PORT)
PORT_ERRORS = _m(
    "goodput_fabric_port_errors_total", Kind.COUNTER, "",
    "Errors on the RDMA port, by the sysfs counter that counts them: symbol_error, port_rcv_errors, "
    "port_rcv_remote_physical_errors, port_rcv_switch_relay_errors, port_xmit_discards, "
    "port_xmit_constraint_errors, port_rcv_constraint_errors, local_link_integrity_errors, "
    "excessive_buffer_overrun_errors, VL15_dropped (counters/); rx_drops (EFA hw_counters/).",
    (*PORT, "counter"))
PORT_XMIT_WAIT = _m(
    "goodput_fabric_port_transmit_wait_total", Kind.COUNTER, "",
    "Ticks during which the port had data to send but could not (counters/port_xmit_wait; the tick length "
    "is the adapter's); a rise means back-pressure from the fabric.", PORT)
PORT_CONGESTION = _m(
    "goodput_fabric_port_congestion_packets_total", Kind.COUNTER, "",
    "RoCE congestion-control packets (hw_counters/), by counter: np_ecn_marked_roce_packets (received "
    "packets the fabric marked with ECN), np_cnp_sent (congestion notifications this port sent back), "
    "rp_cnp_handled (notifications this port received and slowed down for), rp_cnp_ignored.",
    (*PORT, "counter"))
PORT_RETRANSMISSION = _m(
    "goodput_fabric_port_retransmission_events_total", Kind.COUNTER, "",
    "Transport events that mean lost, reordered or retried packets (hw_counters/), by counter: "
    "out_of_sequence, packet_seq_err, local_ack_timeout_err, rnr_nak_retry_err, implied_nak_seq_err, "
    "duplicate_request, roce_adp_retrans, roce_adp_retrans_to, roce_slow_restart; EFA retrans_pkts, "
    "retrans_timeout_events.", (*PORT, "counter"))
PORT_RDMA_BYTES = _m(
    "goodput_fabric_port_rdma_bytes_total", Kind.COUNTER, "bytes",
    "Bytes moved by RDMA reads and writes (EFA hw_counters/rdma_read_bytes, rdma_write_bytes), by "
    "operation read or write.", (*PORT, "operation"))
PORT_SATURATED = _m(
    "goodput_fabric_port_counter_saturated", Kind.GAUGE, "",
    "1 while a port counter sits at the largest value its width holds (InfiniBand's legacy counters stop "
    "there instead of wrapping: its rate reads 0 until the counter is reset, e.g. with `perfquery -R`), by "
    "counter (the sysfs file). Absent for counters that are not saturated.", (*PORT, "counter"))

# --- Ethernet interfaces: /sys/class/net/<interface>/ --------------------------------------------------------
IFACE_UP = _m(
    "goodput_fabric_interface_up", Kind.GAUGE, "",
    "1 when the network interface's operstate is up, else 0.", IFACE)
IFACE_SPEED = _m(
    "goodput_fabric_interface_speed_bytes_per_second", Kind.GAUGE, "bytes_per_second",
    "Speed the interface's link negotiated (sysfs `speed`, Mb/s, in bytes per second); absent while the link "
    "is down or the driver reports none.", IFACE)
IFACE_MTU = _m(
    "goodput_fabric_interface_mtu_bytes", Kind.GAUGE, "bytes", "MTU of the network interface.", IFACE)
IFACE_CARRIER_CHANGES = _m(
    "goodput_fabric_interface_carrier_changes_total", Kind.COUNTER, "",
    "Times the interface's carrier went up or down (sysfs `carrier_changes`); a rise is a flap.", IFACE)
IFACE_TX_BYTES = _m(
    "goodput_fabric_interface_transmit_bytes_total", Kind.COUNTER, "bytes",
    "Bytes the interface sent (statistics/tx_bytes).", IFACE)
IFACE_RX_BYTES = _m(
    "goodput_fabric_interface_receive_bytes_total", Kind.COUNTER, "bytes",
    "Bytes the interface received (statistics/rx_bytes).", IFACE)
IFACE_TX_PACKETS = _m(
    "goodput_fabric_interface_transmit_packets_total", Kind.COUNTER, "",
    "Packets the interface sent (statistics/tx_packets).", IFACE)
IFACE_RX_PACKETS = _m(
    "goodput_fabric_interface_receive_packets_total", Kind.COUNTER, "",
    "Packets the interface received (statistics/rx_packets).", IFACE)
IFACE_ERRORS = _m(
    "goodput_fabric_interface_errors_total", Kind.COUNTER, "",
    "Errors and drops on the interface, by the statistics/ file that counts them: rx_errors, tx_errors, "
    "rx_dropped, tx_dropped, rx_crc_errors, rx_frame_errors, rx_missed_errors, rx_fifo_errors, "
    "rx_over_errors, tx_carrier_errors, tx_fifo_errors, collisions.", (*IFACE, "counter"))

# --- topology: /sys/bus/pci/devices ---------------------------------------------------------------------------
NIC_TOPOLOGY = _m(
    "goodput_fabric_nic_topology_info", Kind.INFO, "",
    "Where a NIC (an RDMA device, or a physical interface without one) sits: its PCI address, NUMA node "
    "(-1 when the kernel does not know), the PCIe switch above it (the PCI address of the switch's upstream "
    "port; empty when it hangs off the root complex) and its root complex (PCI domain and bus). Value is "
    "always 1.", ("device", "pci_bus_id", "numa_node", "pcie_switch", "root_complex"))
GPU_TOPOLOGY = _m(
    "goodput_gpu_topology_info", Kind.INFO, "",
    "Where a GPU sits on the PCI tree, as for goodput_fabric_nic_topology_info. Value is always 1.",
    (*GPU, "pci_bus_id", "numa_node", "pcie_switch", "root_complex"))
GPU_NIC = _m(
    "goodput_gpu_nic_info", Kind.INFO, "",
    "How a GPU reaches a NIC port, as `nvidia-smi topo -m` names it: PIX (through at most one PCIe switch), "
    "PXB (several switches, no host bridge), PHB (through the host bridge), NODE (between host bridges of "
    "one NUMA node), SYS (across the CPU interconnect). Value is always 1.", (*GPU, "device", "port", "path"))
GPU_PREFERRED_NIC = _m(
    "goodput_gpu_preferred_nic_info", Kind.INFO, "",
    "The NIC ports closest to a GPU (the best path of goodput_gpu_nic_info; several on a tie): what NCCL "
    "should use for that GPU. Value is always 1.", (*GPU, "device", "port", "path"))
GPU_NIC_EXCLUDED = _m(
    "goodput_gpu_nic_excluded", Kind.GAUGE, "",
    "1 when a process holding the GPU sets NCCL_IB_HCA or NCCL_SOCKET_IFNAME so that none of the GPU's "
    "preferred NICs may be used (its traffic crosses more of the PCI tree than it needs to), else 0; absent "
    "when the process sets neither or its environment cannot be read. Join on pid with "
    "goodput_gpu_workload_info's processes.", (*GPU, "pid", "variable"))

# --- the source's own health ------------------------------------------------------------------------------------
UNREADABLE = _m(
    "goodput_fabric_unreadable_files", Kind.GAUGE, "",
    "Counter and state files the last collection could not read, per device or interface (their series are "
    "absent, never 0); the log names each file once.", ("device",))

METRICS = _m.metrics
