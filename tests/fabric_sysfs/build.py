"""Sysfs fixture trees for the `fabric` source, built from real layouts.

`build(layout, root)` writes one layout under `root` shaped like the host's /sys (paths relative to the sysfs
root, as `HostSysfs(root)` reads them):

    devices/pci<domain>:<bus>/.../<bdf>/{vendor,device,class,numa_node}
    devices/.../<bdf>/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer,counters/*,hw_counters/*}
    devices/.../<bdf>/infiniband/<dev>/device -> ../../../<bdf>
    devices/.../<bdf>/net/<if>/{operstate,speed,mtu,carrier_changes,dev_port,statistics/*}
    devices/.../<bdf>/net/<if>/device -> ../../../<bdf>
    class/infiniband/<dev> -> ../../devices/.../<bdf>/infiniband/<dev>
    class/net/<if> -> ../../devices/.../<bdf>/net/<if>           (lo -> ../../devices/virtual/net/lo)

so `class/infiniband/<dev>/device/net/<if>` leads to the RDMA device's netdev as on a real host. A file that
cannot be read is written as what makes open()/read() fail the way a sysfs read that returns an error does
(reads run as root here, so permissions would not stop them): a dangling symlink (ENOENT) or a directory in
its place (EISDIR).

The layouts' facts (file names, formats, widths, device names, PCI ids) and where each came from are in
PROVENANCE.md beside this file; the series the source must export from each layout, worked out by hand, in
expected.json. This module only holds the data and writes it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

LAYOUTS = ("mlx5_ib_hdr", "mlx5_ib_ndr", "mlx5_roce", "efa", "no_hw_counters", "port_down", "unreadable",
           "saturated")


@dataclass(frozen=True)
class Dangling:
    """A symlink to nothing where a file should be: reading it fails with ENOENT."""

    target: str = "gone"


@dataclass(frozen=True)
class NotAFile:
    """A directory where a file should be: reading it fails with EISDIR (as `speed` of a netdev that is not
    running fails with EINVAL)."""


Content = str | int | Dangling | NotAFile


@dataclass(frozen=True)
class Port:
    state: Content
    phys_state: Content
    rate: Content
    link_layer: Content
    counters: Mapping[str, Content] | None = None  # None: no counters/ directory (no PMA, e.g. EFA)
    hw_counters: Mapping[str, Content] | None = None  # None: no hw_counters/ directory
    gid_ndevs: Mapping[str, str] | None = None  # RoCE: gid_attrs/ndevs/<index> and gid_attrs/types/<index>


@dataclass(frozen=True)
class RdmaDevice:
    name: str
    pci: str  # path of the PCI function under devices/
    ports: Mapping[str, Port]
    device_files: Mapping[str, Content] = field(default_factory=dict)  # node_type, fw_ver, hca_type, ...
    device_hw_counters: Mapping[str, Content] | None = None  # per-device hw_counters/ (EFA)


@dataclass(frozen=True)
class Netdev:
    name: str
    pci: str | None  # None: a virtual interface (devices/virtual/net/<name>, no `device` link)
    files: Mapping[str, Content]
    statistics: Mapping[str, Content]


@dataclass(frozen=True)
class PciFunction:
    path: str  # e.g. devices/pci0000:17/0000:17:01.0/0000:18:00.0
    vendor: str
    device: str
    pci_class: str
    numa_node: int


@dataclass(frozen=True)
class Layout:
    name: str
    pci: tuple[PciFunction, ...]
    rdma: tuple[RdmaDevice, ...]
    netdevs: tuple[Netdev, ...]


# --- counter file sets (drivers/infiniband/core/sysfs.c) --------------------------------------------------------

# pma_attrs_ext: mlx5 declares IB_PMA_CLASS_CAP_EXT_WIDTH, so its counters/ holds these 21 files, the data and
# packet counters 64 bits wide
PMA_EXT = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors", "port_rcv_remote_physical_errors",
           "port_rcv_switch_relay_errors", "port_xmit_discards", "port_xmit_constraint_errors",
           "port_rcv_constraint_errors", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
           "VL15_dropped", "port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_xmit_wait",
           "port_rcv_packets", "unicast_rcv_packets", "unicast_xmit_packets", "multicast_rcv_packets",
           "multicast_xmit_packets")

# pma_attrs (legacy PortCounters, 32-bit data) and pma_attrs_noietf (64-bit data, no unicast/multicast) share
# these 17 names
PMA_17 = PMA_EXT[:17]


def _counters(names: tuple[str, ...], values: Mapping[str, Content]) -> dict[str, Content]:
    missing = set(names) - set(values)
    extra = set(values) - set(names)
    if missing or extra:
        raise ValueError(f"counter files: missing {sorted(missing)}, extra {sorted(extra)}")
    return {name: values[name] for name in names}


# all 24 files of /sys/class/net/<if>/statistics/ (net/core/net-sysfs.c netstat_attrs)
NETSTAT = ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_errors", "tx_errors", "rx_dropped", "tx_dropped",
           "multicast", "collisions", "rx_length_errors", "rx_over_errors", "rx_crc_errors", "rx_frame_errors",
           "rx_fifo_errors", "rx_missed_errors", "tx_aborted_errors", "tx_carrier_errors", "tx_fifo_errors",
           "tx_heartbeat_errors", "tx_window_errors", "rx_compressed", "tx_compressed", "rx_nohandler")


def _netstat(**values: Content) -> dict[str, Content]:
    unknown = set(values) - set(NETSTAT)
    if unknown:
        raise ValueError(f"not statistics files: {sorted(unknown)}")
    return {name: values.get(name, 0) for name in NETSTAT}


LOOPBACK = Netdev("lo", None, {"operstate": "unknown", "mtu": 65536, "carrier_changes": 0, "type": 772},
                  _netstat(rx_packets=48211, tx_packets=48211, rx_bytes=5123077, tx_bytes=5123077))

# --- mlx5_ib_hdr: ConnectX-6 (MT4123), one InfiniBand HDR port ---------------------------------------------------
# counters/ and hw_counters/ values: prometheus/procfs testdata/fixtures.ttar, class/infiniband/mlx5_0 (verbatim)

HDR_PCI = "devices/pci0000:17/0000:17:01.0/0000:18:00.0"

HDR_PORT = Port(
    state="4: ACTIVE", phys_state="5: LinkUp", rate="200 Gb/sec (4X HDR)", link_layer="InfiniBand",
    counters=_counters(PMA_EXT, {
        "symbol_error": 0, "link_error_recovery": 0, "link_downed": 0, "port_rcv_errors": 0,
        "port_rcv_remote_physical_errors": 0, "port_rcv_switch_relay_errors": 0, "port_xmit_discards": 0,
        "port_xmit_constraint_errors": 0, "port_rcv_constraint_errors": 0, "local_link_integrity_errors": 0,
        "excessive_buffer_overrun_errors": 0, "VL15_dropped": 0, "port_xmit_data": 2880761508848,
        "port_rcv_data": 18126345378, "port_xmit_packets": 10907922116, "port_xmit_wait": 0,
        "port_rcv_packets": 541889824, "unicast_rcv_packets": 541889824, "unicast_xmit_packets": 10907922116,
        "multicast_rcv_packets": 0, "multicast_xmit_packets": 0}),
    hw_counters={
        "duplicate_request": 41, "implied_nak_seq_err": 0, "lifespan": 10, "local_ack_timeout_err": 131,
        "out_of_buffer": 0, "out_of_sequence": 1, "packet_seq_err": 1, "req_cqe_error": 3481,
        "req_cqe_flush_error": 80, "req_remote_access_errors": 0, "req_remote_invalid_request": 0,
        "resp_cqe_error": 8109, "resp_cqe_flush_error": 4708, "resp_local_length_error": 0,
        "resp_remote_access_errors": 0, "rnr_nak_retry_err": 0, "roce_adp_retrans": 99, "roce_adp_retrans_to": 4,
        "roce_slow_restart": 0, "roce_slow_restart_cnps": 131, "roce_slow_restart_trans": 0,
        "rx_atomic_requests": 0, "rx_dct_connect": 0, "rx_read_requests": 175528982, "rx_write_requests": 742114},
)

MLX5_DEVICE_FILES: dict[str, Content] = {"node_type": "1: CA", "fw_ver": "20.39.1002", "hca_type": "MT4123",
                                         "board_id": "MT_0000000223"}

HDR_IPOIB = Netdev(
    "ibp24s0", HDR_PCI,
    {"operstate": "up", "carrier": 1, "speed": 200000, "mtu": 4092, "carrier_changes": 2, "dev_port": 0,
     "type": 32},
    _netstat(rx_packets=1843220, tx_packets=1790342, rx_bytes=391245880, tx_bytes=352107118, rx_dropped=12,
             tx_dropped=3, multicast=20482),
)


def _hdr() -> Layout:
    return Layout(
        "mlx5_ib_hdr",
        (PciFunction(HDR_PCI, "0x15b3", "0x101b", "0x020700", 0),),
        (RdmaDevice("mlx5_0", HDR_PCI, {"1": HDR_PORT}, MLX5_DEVICE_FILES),),
        (HDR_IPOIB, LOOPBACK),
    )


# --- mlx5_ib_ndr: ConnectX-7 (MT4129) behind a PCIe switch, one InfiniBand NDR port, IPoIB netdev admin-down ---

NDR_PCI = "devices/pci0000:97/0000:97:01.0/0000:98:00.0/0000:99:00.0/0000:9a:00.0"


def _ndr() -> Layout:
    port = Port(
        state="4: ACTIVE", phys_state="5: LinkUp", rate="400 Gb/sec (4X NDR)", link_layer="InfiniBand",
        counters=_counters(PMA_EXT, {
            "symbol_error": 17, "link_error_recovery": 2, "link_downed": 1, "port_rcv_errors": 5,
            "port_rcv_remote_physical_errors": 0, "port_rcv_switch_relay_errors": 0, "port_xmit_discards": 23,
            "port_xmit_constraint_errors": 0, "port_rcv_constraint_errors": 0, "local_link_integrity_errors": 0,
            "excessive_buffer_overrun_errors": 0, "VL15_dropped": 0, "port_xmit_data": 48213391180422,
            "port_rcv_data": 47990312775110, "port_xmit_packets": 12877652301, "port_xmit_wait": 318774512,
            "port_rcv_packets": 12861043977, "unicast_rcv_packets": 12861040211,
            "unicast_xmit_packets": 12877648530, "multicast_rcv_packets": 3766, "multicast_xmit_packets": 3771}),
        hw_counters={
            "rx_write_requests": 88123, "rx_read_requests": 402211, "rx_atomic_requests": 0, "rx_dct_connect": 0,
            "out_of_buffer": 0, "out_of_sequence": 12, "duplicate_request": 7, "rnr_nak_retry_err": 3,
            "packet_seq_err": 9, "implied_nak_seq_err": 2, "local_ack_timeout_err": 6, "resp_local_length_error": 0,
            "resp_cqe_error": 113, "req_cqe_error": 57, "req_remote_invalid_request": 0,
            "req_remote_access_errors": 0, "resp_remote_access_errors": 0, "resp_cqe_flush_error": 29,
            "req_cqe_flush_error": 31, "req_transport_retries_exceeded": 0, "req_rnr_retries_exceeded": 0,
            "roce_adp_retrans": 0, "roce_adp_retrans_to": 0, "roce_slow_restart": 0, "roce_slow_restart_cnps": 0,
            "roce_slow_restart_trans": 0, "lifespan": 10},
    )
    ipoib = Netdev(
        "ibp154s0", NDR_PCI,
        # not running: the kernel refuses `speed` (EINVAL), modelled by a directory in its place
        {"operstate": "down", "speed": NotAFile(), "mtu": 4092, "carrier_changes": 0, "dev_port": 0, "type": 32},
        _netstat(),
    )
    return Layout(
        "mlx5_ib_ndr",
        (PciFunction("devices/pci0000:97/0000:97:01.0/0000:98:00.0", "0x1000", "0xc030", "0x060400", 1),
         PciFunction("devices/pci0000:97/0000:97:01.0/0000:98:00.0/0000:99:00.0", "0x1000", "0xc030", "0x060400", 1),
         PciFunction(NDR_PCI, "0x15b3", "0x1021", "0x020700", 1)),
        (RdmaDevice("mlx5_4", NDR_PCI, {"1": port}, {**MLX5_DEVICE_FILES, "fw_ver": "28.39.1002",
                                                     "hca_type": "MT4129"}),),
        (ipoib, LOOPBACK),
    )


# --- mlx5_roce: ConnectX-6 Dx (MT4125), one 200GbE RoCE port with its netdev --------------------------------------

ROCE_PCI = "devices/pci0000:40/0000:40:01.1/0000:41:00.0"
ROCE_NETDEV = "enp65s0f0np0"


def _roce_port(**unreadable: Content) -> Port:
    counters: dict[str, Content] = _counters(PMA_EXT, {
        "symbol_error": 0, "link_error_recovery": 0, "link_downed": 0, "port_rcv_errors": 0,
        "port_rcv_remote_physical_errors": 0, "port_rcv_switch_relay_errors": 0, "port_xmit_discards": 0,
        "port_xmit_constraint_errors": 0, "port_rcv_constraint_errors": 0, "local_link_integrity_errors": 0,
        "excessive_buffer_overrun_errors": 0, "VL15_dropped": 0, "port_xmit_data": 9218829015335,
        "port_rcv_data": 9154003920812, "port_xmit_packets": 8870421164, "port_xmit_wait": 0,
        "port_rcv_packets": 8829115347, "unicast_rcv_packets": 8829101944, "unicast_xmit_packets": 8870407720,
        "multicast_rcv_packets": 13403, "multicast_xmit_packets": 13444})
    hw: dict[str, Content] = {
        "rx_write_requests": 5520117, "rx_read_requests": 1209, "rx_atomic_requests": 0, "rx_dct_connect": 0,
        "out_of_buffer": 4410, "out_of_sequence": 2231, "duplicate_request": 418, "rnr_nak_retry_err": 27,
        "packet_seq_err": 389, "implied_nak_seq_err": 56, "local_ack_timeout_err": 14, "resp_local_length_error": 0,
        "resp_cqe_error": 0, "req_cqe_error": 0, "req_remote_invalid_request": 0, "req_remote_access_errors": 0,
        "resp_remote_access_errors": 0, "resp_cqe_flush_error": 0, "req_cqe_flush_error": 0,
        "req_transport_retries_exceeded": 0, "req_rnr_retries_exceeded": 0, "roce_adp_retrans": 3098,
        "roce_adp_retrans_to": 71, "roce_slow_restart": 8, "roce_slow_restart_cnps": 5502,
        "roce_slow_restart_trans": 19, "rp_cnp_ignored": 3, "rp_cnp_handled": 1884210,
        "np_ecn_marked_roce_packets": 2417753, "np_cnp_sent": 2399158, "rx_icrc_encapsulated": 0, "lifespan": 10}
    state: Content = "4: ACTIVE"
    for rel, content in unreadable.items():
        where, name = rel.split("__", 1) if "__" in rel else ("", rel)
        if where == "counters":
            counters[name] = content
        elif where == "hw_counters":
            hw[name] = content
        elif name == "state":
            state = content
        else:
            raise ValueError(rel)
    return Port(state=state, phys_state="5: LinkUp", rate="200 Gb/sec (4X HDR)", link_layer="Ethernet",
                counters=counters, hw_counters=hw,
                gid_ndevs={"0": ROCE_NETDEV, "1": ROCE_NETDEV})


def _roce_netdev(**unreadable: Content) -> Netdev:
    files: dict[str, Content] = {"operstate": "up", "carrier": 1, "speed": 200000, "mtu": 9000, "carrier_changes": 4,
                                 "dev_port": 0, "type": 1}
    stats = _netstat(rx_packets=98120345, tx_packets=95410221, rx_bytes=81254718211, tx_bytes=79612008342,
                     rx_dropped=1337, multicast=41022)
    for name, content in unreadable.items():
        if name.startswith("statistics__"):
            stats[name.removeprefix("statistics__")] = content
        else:
            files[name] = content
    return Netdev(ROCE_NETDEV, ROCE_PCI, files, stats)


ROCE_PCI_FUNCTION = PciFunction(ROCE_PCI, "0x15b3", "0x101d", "0x020000", 0)
ROCE_DEVICE_FILES: dict[str, Content] = {**MLX5_DEVICE_FILES, "fw_ver": "22.39.1002", "hca_type": "MT4125"}


def _roce() -> Layout:
    return Layout("mlx5_roce", (ROCE_PCI_FUNCTION,),
                  (RdmaDevice("mlx5_2", ROCE_PCI, {"1": _roce_port()}, ROCE_DEVICE_FILES),),
                  (_roce_netdev(), LOOPBACK))


# --- efa: AWS EFA (PCI 1d0f:efa1), hw_counters only, and the instance's ENA interface ----------------------------

EFA_PCI = "devices/pci0000:10/0000:10:1b.0"
ENA_PCI = "devices/pci0000:00/0000:00:05.0"


def _efa() -> Layout:
    port = Port(
        state="4: ACTIVE", phys_state="5: LinkUp", rate="100 Gb/sec (4X EDR)", link_layer="Unknown",
        counters=None,
        hw_counters={
            "tx_bytes": 6238109817472, "tx_pkts": 722390187, "rx_bytes": 6190775210848, "rx_pkts": 719874263,
            "rx_drops": 148, "send_bytes": 412993810, "send_wrs": 2291840, "recv_bytes": 410227634,
            "recv_wrs": 2285521, "rdma_read_wrs": 1830221, "rdma_read_bytes": 5818224410624, "rdma_read_wr_err": 0,
            "rdma_read_resp_bytes": 5812093377536, "rdma_write_wrs": 920110, "rdma_write_bytes": 301844992000,
            "rdma_write_wr_err": 0, "rdma_write_recv_bytes": 299117559808, "retrans_bytes": 8843264,
            "retrans_pkts": 1066, "retrans_timeout_events": 5, "unresponsive_remote_events": 0,
            "impaired_remote_conn_events": 2, "lifespan": 10},
    )
    device_hw = {"submitted_cmds": 4130, "completed_cmds": 4130, "cmds_err": 0, "no_completion_cmds": 0,
                 "keep_alive_rcvd": 172881, "alloc_pd_err": 0, "create_qp_err": 0, "create_cq_err": 0,
                 "reg_mr_err": 0, "alloc_ucontext_err": 0, "create_ah_err": 0, "mmap_err": 0, "lifespan": 10}
    ena = Netdev(
        "ens5", ENA_PCI,
        {"operstate": "up", "carrier": 1, "speed": 100000, "mtu": 9001, "carrier_changes": 2, "dev_port": 0,
         "type": 1},
        _netstat(rx_packets=30449128, tx_packets=21337405, rx_bytes=40271366541, tx_bytes=2318842017),
    )
    return Layout(
        "efa",
        (PciFunction(EFA_PCI, "0x1d0f", "0xefa1", "0x020000", 0),
         PciFunction(ENA_PCI, "0x1d0f", "0xec20", "0x020000", 0)),
        (RdmaDevice("rdmap16s27", EFA_PCI, {"1": port},
                    {"node_type": "7: unspecified", "fw_ver": "0.0.0.0"}, device_hw),),
        (ena, LOOPBACK),
    )


# --- no_hw_counters: ConnectX-3 (mlx4, MT4099), two InfiniBand QDR ports, counters/ only -----------------------
# values: prometheus/procfs testdata/fixtures.ttar, class/infiniband/mlx4_0 (verbatim)

MLX4_PCI = "devices/pci0000:80/0000:80:02.0/0000:81:00.0"


def _mlx4_counters(xmit_data: int, rcv_data: int, xmit_packets: int, rcv_packets: int, wait: int) -> dict[str, Content]:
    return _counters(PMA_17, {
        "symbol_error": 0, "link_error_recovery": 0, "link_downed": 0, "port_rcv_errors": 0,
        "port_rcv_remote_physical_errors": 0, "port_rcv_switch_relay_errors": 0, "port_xmit_discards": 0,
        "port_xmit_constraint_errors": 0, "port_rcv_constraint_errors": 0, "local_link_integrity_errors": 0,
        "excessive_buffer_overrun_errors": 0, "VL15_dropped": 0, "port_xmit_data": xmit_data,
        "port_rcv_data": rcv_data, "port_xmit_packets": xmit_packets, "port_xmit_wait": wait,
        "port_rcv_packets": rcv_packets})


MLX4_DEVICE_FILES: dict[str, Content] = {"node_type": "1: CA", "fw_ver": "2.31.5050", "hca_type": "MT4099",
                                         "board_id": "SM_1141000001000"}


def _no_hw_counters() -> Layout:
    ports = {
        "1": Port("4: ACTIVE", "5: LinkUp", "40 Gb/sec (4X QDR)", "InfiniBand",
                  counters=_mlx4_counters(26509113295, 2221223609, 85734114, 87169372, 3599)),
        "2": Port("4: ACTIVE", "5: LinkUp", "40 Gb/sec (4X QDR)", "InfiniBand",
                  counters=_mlx4_counters(26540356890, 2460436784, 88622850, 89332064, 3846)),
    }
    return Layout("no_hw_counters", (PciFunction(MLX4_PCI, "0x15b3", "0x1003", "0x020700", 1),),
                  (RdmaDevice("mlx4_0", MLX4_PCI, ports, MLX4_DEVICE_FILES),), (LOOPBACK,))


# --- port_down: ConnectX-7, InfiniBand port DOWN/Disabled, its IPoIB netdev up without carrier -------------------

DOWN_PCI = "devices/pci0000:a0/0000:a0:01.0/0000:a1:00.0"


def _port_down() -> Layout:
    port = Port(
        state="1: DOWN", phys_state="3: Disabled", rate="10 Gb/sec (4X SDR)", link_layer="InfiniBand",
        counters=_counters(PMA_EXT, {
            "symbol_error": 42, "link_error_recovery": 0, "link_downed": 3, "port_rcv_errors": 8,
            "port_rcv_remote_physical_errors": 0, "port_rcv_switch_relay_errors": 0, "port_xmit_discards": 18,
            "port_xmit_constraint_errors": 0, "port_rcv_constraint_errors": 0, "local_link_integrity_errors": 0,
            "excessive_buffer_overrun_errors": 0, "VL15_dropped": 0, "port_xmit_data": 711283920044,
            "port_rcv_data": 709912847731, "port_xmit_packets": 190334871, "port_xmit_wait": 44120,
            "port_rcv_packets": 189977102, "unicast_rcv_packets": 189976318, "unicast_xmit_packets": 190334080,
            "multicast_rcv_packets": 784, "multicast_xmit_packets": 791}),
        hw_counters={
            "rx_write_requests": 120, "rx_read_requests": 35, "rx_atomic_requests": 0, "rx_dct_connect": 0,
            "out_of_buffer": 0, "out_of_sequence": 4, "duplicate_request": 0, "rnr_nak_retry_err": 0,
            "packet_seq_err": 0, "implied_nak_seq_err": 0, "local_ack_timeout_err": 21, "resp_local_length_error": 0,
            "resp_cqe_error": 0, "req_cqe_error": 0, "req_remote_invalid_request": 0,
            "req_remote_access_errors": 0, "resp_remote_access_errors": 0, "resp_cqe_flush_error": 0,
            "req_cqe_flush_error": 0, "req_transport_retries_exceeded": 0, "req_rnr_retries_exceeded": 0,
            "roce_adp_retrans": 0, "roce_adp_retrans_to": 0, "roce_slow_restart": 0, "roce_slow_restart_cnps": 0,
            "roce_slow_restart_trans": 0, "lifespan": 10},
    )
    ipoib = Netdev(
        "ibp161s0", DOWN_PCI,
        # running, no carrier: ipoib_get_link_ksettings() reports SPEED_UNKNOWN, printed as -1
        {"operstate": "down", "carrier": 0, "speed": -1, "mtu": 4092, "carrier_changes": 7, "dev_port": 0,
         "type": 32},
        _netstat(rx_packets=5120, tx_packets=4877, rx_bytes=1201336, tx_bytes=998410, tx_dropped=64),
    )
    return Layout("port_down", (PciFunction(DOWN_PCI, "0x15b3", "0x1021", "0x020700", 1),),
                  (RdmaDevice("mlx5_1", DOWN_PCI, {"1": port}, {**MLX5_DEVICE_FILES, "fw_ver": "28.39.1002",
                                                                "hca_type": "MT4129"}),),
                  (ipoib, LOOPBACK))


# --- unreadable: the mlx5_roce layout with state/counter files whose read fails ------------------------------------

def _unreadable() -> Layout:
    port = _roce_port(state=NotAFile(), counters__port_xmit_data=Dangling(), counters__symbol_error=NotAFile(),
                      hw_counters__np_cnp_sent=Dangling())
    netdev = _roce_netdev(statistics__rx_bytes=NotAFile(), mtu=Dangling())
    return Layout("unreadable", (ROCE_PCI_FUNCTION,),
                  (RdmaDevice("mlx5_2", ROCE_PCI, {"1": port}, ROCE_DEVICE_FILES),), (netdev, LOOPBACK))


# --- saturated: ConnectX-3 whose PMA offers only the legacy 32-bit PortCounters -------------------------------------

SATURATED_PCI = "devices/pci0000:00/0000:00:03.0/0000:05:00.0"


def _saturated() -> Layout:
    port = Port(
        state="4: ACTIVE", phys_state="5: LinkUp", rate="56 Gb/sec (4X FDR)", link_layer="InfiniBand",
        counters=_counters(PMA_17, {
            "symbol_error": 65535, "link_error_recovery": 9, "link_downed": 4, "port_rcv_errors": 211,
            "port_rcv_remote_physical_errors": 0, "port_rcv_switch_relay_errors": 0, "port_xmit_discards": 1337,
            "port_xmit_constraint_errors": 0, "port_rcv_constraint_errors": 0, "local_link_integrity_errors": 15,
            "excessive_buffer_overrun_errors": 0, "VL15_dropped": 0, "port_xmit_data": 4294967295,
            "port_rcv_data": 4294967295, "port_xmit_packets": 61220413, "port_xmit_wait": 4294967295,
            "port_rcv_packets": 60871224}),
    )
    return Layout("saturated", (PciFunction(SATURATED_PCI, "0x15b3", "0x1003", "0x020700", 0),),
                  (RdmaDevice("mlx4_0", SATURATED_PCI, {"1": port}, MLX4_DEVICE_FILES),), (LOOPBACK,))


_BUILDERS = {"mlx5_ib_hdr": _hdr, "mlx5_ib_ndr": _ndr, "mlx5_roce": _roce, "efa": _efa,
             "no_hw_counters": _no_hw_counters, "port_down": _port_down, "unreadable": _unreadable,
             "saturated": _saturated}
assert tuple(_BUILDERS) == LAYOUTS


def layout(name: str) -> Layout:
    return _BUILDERS[name]()


# --- writing -----------------------------------------------------------------------------------------------------

def _put(path: Path, content: Content) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, Dangling):
        path.symlink_to(content.target)
    elif isinstance(content, NotAFile):
        path.mkdir()
    else:
        path.write_text(f"{content}\n")  # sysfs show() functions end their output with a newline


def _link(path: Path, target: Path) -> None:
    """A relative symlink at `path` to `target` as sysfs spells them: up to the target's parent, then down
    (`device -> ../../../0000:41:00.0`, not `../..`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(os.path.join(os.path.relpath(target.parent, path.parent), target.name))


def build(name: str, root: Path) -> Layout:
    """Write layout `name` under `root` (the sysfs root); returns the layout's data."""
    spec = layout(name)
    root = Path(root)
    for fn in spec.pci:
        base = root / fn.path
        for file, value in (("vendor", fn.vendor), ("device", fn.device), ("class", fn.pci_class),
                            ("numa_node", fn.numa_node)):
            _put(base / file, value)
    for dev in spec.rdma:
        base = root / dev.pci / "infiniband" / dev.name
        for file, content in dev.device_files.items():
            _put(base / file, content)
        for file, content in (dev.device_hw_counters or {}).items():
            _put(base / "hw_counters" / file, content)
        _link(base / "device", root / dev.pci)
        for number, port in dev.ports.items():
            pdir = base / "ports" / number
            for file, content in (("state", port.state), ("phys_state", port.phys_state), ("rate", port.rate),
                                  ("link_layer", port.link_layer)):
                _put(pdir / file, content)
            for sub, files in (("counters", port.counters), ("hw_counters", port.hw_counters)):
                for file, content in (files or {}).items():
                    _put(pdir / sub / file, content)
            for index, ndev in (port.gid_ndevs or {}).items():
                _put(pdir / "gid_attrs" / "ndevs" / index, ndev)
                _put(pdir / "gid_attrs" / "types" / index, "IB/RoCE v1" if index == "0" else "RoCE v2")
        _link(root / "class" / "infiniband" / dev.name, base)
    for nd in spec.netdevs:
        base = root / (f"{nd.pci}/net/{nd.name}" if nd.pci else f"devices/virtual/net/{nd.name}")
        for file, content in nd.files.items():
            _put(base / file, content)
        for file, content in nd.statistics.items():
            _put(base / "statistics" / file, content)
        if nd.pci:
            _link(base / "device", root / nd.pci)
        _link(root / "class" / "net" / nd.name, base)
    return spec


def main() -> None:
    """`python tests/fabric_sysfs/build.py LAYOUT DIR`: write one layout, to look at it."""
    import sys

    if len(sys.argv) != 3 or sys.argv[1] not in LAYOUTS:
        raise SystemExit(f"usage: build.py {{{','.join(LAYOUTS)}}} DIR")
    build(sys.argv[1], Path(sys.argv[2]))


if __name__ == "__main__":
    main()
