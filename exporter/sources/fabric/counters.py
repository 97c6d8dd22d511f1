"""Which sysfs counter file feeds which metric, with its unit and width, and the bookkeeping that keeps a
narrow counter honest.

Two kinds of narrow counter exist under an RDMA port:
- `counters/` holds the InfiniBand PortCounters the kernel reads through the port's performance management
  agent. The legacy ones are 32 bits wide for data and packets (64 when the adapter has the extended
  PortCountersExtended, which mlx5 has) and 4 to 16 bits for errors, and by the InfiniBand specification
  they *saturate*: they stop at their largest value instead of wrapping. A saturated counter is exported as
  read, and `goodput_fabric_port_counter_saturated` says its rate reads 0 until it is reset (`perfquery -R`).
- mlx5's transport counters in `hw_counters/` (out_of_sequence, packet_seq_err, the retransmission ones) are
  the adapter's 32-bit queue counters, which *wrap* (the kernel reads them with be32_to_cpu in
  drivers/infiniband/hw/mlx5/counters.c). A wrapped counter would look to Prometheus like a reset and lose up
  to 2^32 events, so a drop from the upper half of the 32-bit range is taken as a wrap and 2^32 is added from
  then on; any other drop is a reset (driver reload) and is exported as read, which Prometheus' rate() handles
  as a reset. Its congestion counters (np_*, rp_*) are 64-bit (read as a high/low pair, be64) and EFA's are
  64-bit: a drop there is always a reset.
A counter file that reads `N/A` (old kernels print `N/A (no PMA)` for adapters without a performance management
agent) has no value: its series is absent, and it is not a read failure.
Counter files count what their names say, except `port_xmit_data` and `port_rcv_data`, which count 4-octet
words and are exported as bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.catalog import Metric
from . import metrics as c

WRAP_32 = 1 << 32


@dataclass(frozen=True, slots=True)
class Counter:
    metric: Metric
    label: str | None = None  # the value of the metric's last label (counter / operation), if it has one
    scale: int = 1
    width: int = 64  # bits of a saturating counter (InfiniBand PortCounters); 64: never saturates in practice
    wraps: bool = False  # a 32-bit counter that wraps (mlx5 hw_counters)


def _err(name: str, width: int) -> Counter:
    return Counter(c.PORT_ERRORS, name, width=width)


# counters/<file>; widths from the InfiniBand specification's PortCounters attribute
PORT_COUNTERS: dict[str, Counter] = {
    "port_xmit_data": Counter(c.PORT_TX_BYTES, scale=4, width=32),
    "port_rcv_data": Counter(c.PORT_RX_BYTES, scale=4, width=32),
    "port_xmit_packets": Counter(c.PORT_TX_PACKETS, width=32),
    "port_rcv_packets": Counter(c.PORT_RX_PACKETS, width=32),
    "link_downed": Counter(c.PORT_LINK_DOWNED, width=8),
    "link_error_recovery": Counter(c.PORT_LINK_RECOVERY, width=8),
    "port_xmit_wait": Counter(c.PORT_XMIT_WAIT, width=32),
    "symbol_error": _err("symbol_error", 16),
    "port_rcv_errors": _err("port_rcv_errors", 16),
    "port_rcv_remote_physical_errors": _err("port_rcv_remote_physical_errors", 16),
    "port_rcv_switch_relay_errors": _err("port_rcv_switch_relay_errors", 16),
    "port_xmit_discards": _err("port_xmit_discards", 16),
    "port_xmit_constraint_errors": _err("port_xmit_constraint_errors", 8),
    "port_rcv_constraint_errors": _err("port_rcv_constraint_errors", 8),
    "local_link_integrity_errors": _err("local_link_integrity_errors", 4),
    "excessive_buffer_overrun_errors": _err("excessive_buffer_overrun_errors", 4),
    "VL15_dropped": _err("VL15_dropped", 16),
}


def _q(metric: Metric, name: str) -> Counter:
    return Counter(metric, name, wraps=True)


# hw_counters/<file>: mlx5's RoCE congestion (64-bit) and transport counters (32-bit, wrapping), and EFA's (64-bit)
HW_COUNTERS: dict[str, Counter] = {
    **{name: Counter(c.PORT_CONGESTION, name) for name in (
        "np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored")},
    **{name: _q(c.PORT_RETRANSMISSION, name) for name in (
        "out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "rnr_nak_retry_err", "implied_nak_seq_err",
        "duplicate_request", "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart")},
    "retrans_pkts": Counter(c.PORT_RETRANSMISSION, "retrans_pkts"),
    "retrans_timeout_events": Counter(c.PORT_RETRANSMISSION, "retrans_timeout_events"),
    "rx_drops": Counter(c.PORT_ERRORS, "rx_drops"),
    "rdma_read_bytes": Counter(c.PORT_RDMA_BYTES, "read"),
    "rdma_write_bytes": Counter(c.PORT_RDMA_BYTES, "write"),
}

# EFA has no counters/ directory: its hw_counters stand in for the data and packet counters
HW_FALLBACKS: dict[str, tuple[str, Counter]] = {
    "tx_bytes": ("port_xmit_data", Counter(c.PORT_TX_BYTES)),
    "rx_bytes": ("port_rcv_data", Counter(c.PORT_RX_BYTES)),
    "tx_pkts": ("port_xmit_packets", Counter(c.PORT_TX_PACKETS)),
    "rx_pkts": ("port_rcv_packets", Counter(c.PORT_RX_PACKETS)),
}

# /sys/class/net/<if>/statistics/<file>
INTERFACE_COUNTERS: dict[str, Counter] = {
    "tx_bytes": Counter(c.IFACE_TX_BYTES),
    "rx_bytes": Counter(c.IFACE_RX_BYTES),
    "tx_packets": Counter(c.IFACE_TX_PACKETS),
    "rx_packets": Counter(c.IFACE_RX_PACKETS),
    **{name: Counter(c.IFACE_ERRORS, name) for name in (
        "rx_errors", "tx_errors", "rx_dropped", "tx_dropped", "rx_crc_errors", "rx_frame_errors",
        "rx_missed_errors", "rx_fifo_errors", "rx_over_errors", "tx_carrier_errors", "tx_fifo_errors",
        "collisions")},
}


def saturated(counter: Counter, raw: int) -> bool:
    return counter.width < 64 and raw == (1 << counter.width) - 1


class Wraps:
    """Keeps 32-bit wrapping counters monotonic: key -> (last raw value, what was added for past wraps)."""

    def __init__(self) -> None:
        self._state: dict[tuple[str, ...], tuple[int, int]] = {}
        self._seen: set[tuple[str, ...]] = set()

    def value(self, key: tuple[str, ...], raw: int) -> int:
        last, offset = self._state.get(key, (raw, 0))
        if raw < last:
            # a drop from the upper half of the 32-bit range to below it: the counter wrapped; else a reset
            offset = offset + WRAP_32 if WRAP_32 // 2 <= last < WRAP_32 and raw < WRAP_32 // 2 else 0
        self._state[key] = (raw, offset)
        self._seen.add(key)
        return raw + offset

    def keep(self, key: tuple[str, ...]) -> None:
        """The counter is still there, though this collection could not read it: keep what it had wrapped by."""
        self._seen.add(key)

    def sweep(self) -> None:
        """Forget counters that the last collection did not list (a device or port that went away)."""
        for key in set(self._state) - self._seen:
            del self._state[key]
        self._seen = set()
