"""A simulated fabric: RoCE NICs and their PCI tree, served as an in-memory sysfs through the same
`SysfsView` the host's sysfs is read through, so the simulation runs the real parsing code.

The node it builds is DGX-like: NIC i (`mlx5_i`, one 400 GbE RoCE port, netdev `ens<i>np0`) shares a PCIe
switch with simulated GPU i, half the switches on each of two root complexes (NUMA nodes 0 and 1), plus one
management interface (`eno1`) on the first root complex without RDMA. Counters are ground truth: they advance
with time at fixed rates, and the faults (link_down, link_flap, symbol_errors, congestion, link_degraded)
change those rates or the port's state from the moment they are injected until `restore`.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .topology import normalize_bus_id

RATE_GBPS = 400
TRAFFIC_SHARE = 0.25  # of the link rate, each way, while the link is up
PACKET_BYTES = 4096
SYMBOL_ERRORS_PER_SECOND = 50.0
ECN_MARKS_PER_SECOND = 20_000.0
XMIT_WAIT_TICKS_PER_SECOND = 1000.0  # a little back-pressure always; a hundred times more while congested
FLAP_PERIOD = 4.0  # seconds between a flapping link's downs
FLAP_DOWN = 1.0  # seconds each of them lasts
MANAGEMENT = "eno1"
MAX_NICS = 8  # two sockets of four switches, each switch one NIC (and one GPU): a DGX-like node
FAULTS = ("link_down", "link_flap", "symbol_errors", "congestion", "link_degraded")


@dataclass
class _Nic:
    index: int
    device: str
    netdev: str
    pci: str  # the NIC's PCI function, sysfs form
    rate_gbps: float = RATE_GBPS
    up: bool = True
    flapping_since: float | None = None
    symbol_errors_rate: float = 0.0
    ecn_rate: float = 0.0
    counters: dict[str, float] = field(default_factory=dict)  # ground truth, exact
    last: float = 0.0  # the clock's time its counters were last brought to


def _rate_text(gbps: float) -> str:
    return f"{gbps:g} Gb/sec (4X {'NDR' if gbps >= 400 else 'HDR'})"  # as the kernel prints it


class SimulatedFabric:
    """Implements sysfs.SysfsView. `gpu_bus_ids`: the simulated GPUs' PCI addresses as NVML gives them."""

    def __init__(self, gpu_bus_ids: Sequence[str], nics: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = "simulated fabric"
        self._clock = clock
        self._lock = threading.Lock()
        self._last = clock()
        count = min(len(gpu_bus_ids), MAX_NICS) if nics is None else nics
        if not 0 <= count <= MAX_NICS:
            raise ValueError(f"a simulated fabric has 0 to {MAX_NICS} NICs, not {count}")
        self._dirs: dict[str, set[str]] = {}
        self._files: dict[str, Callable[[], str]] = {}
        self._links: dict[str, str] = {}
        self.nics: list[_Nic] = []
        self._build(list(gpu_bus_ids), count)
        for nic in self.nics:
            nic.last = self._last

    # --- the tree -------------------------------------------------------------------------------------------

    def _add_dir(self, path: str) -> None:
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            parent, name = "/".join(parts[:i - 1]), parts[i - 1]
            self._dirs.setdefault(parent, set()).add(name)
            self._dirs.setdefault("/".join(parts[:i]), set())

    def _add_file(self, path: str, content: Callable[[], str] | str) -> None:
        parent, _, name = path.rpartition("/")
        self._add_dir(parent)
        self._dirs[parent].add(name)
        self._files[path] = content if callable(content) else (lambda text=content: text)

    def _add_link(self, path: str, target: str) -> None:
        parent, _, name = path.rpartition("/")
        self._add_dir(parent)
        self._dirs[parent].add(name)
        self._links[path] = target

    def _pci_device(self, path: str, numa: int) -> None:
        self._add_dir(path)
        self._add_file(f"{path}/numa_node", str(numa))
        bdf = path.rpartition("/")[2]
        self._add_link(f"bus/pci/devices/{bdf}", path)

    def _build(self, gpus: list[str], nic_count: int) -> None:
        half = max(1, (max(len(gpus), nic_count) + 1) // 2)
        placed: set[str] = set()
        for i in range(max(len(gpus), nic_count)):
            socket = 0 if i < half else 1
            complex_ = "pci0000:00" if socket == 0 else "pci0000:80"
            root_bus = complex_[-2:]
            root_port = f"{complex_}/0000:{root_bus}:{1 + i % half:02x}.0"
            gpu = normalize_bus_id(gpus[i]) if i < len(gpus) else None
            if gpu is not None and gpu in placed:
                gpu = None  # the simulated NVML repeats PCI addresses past 14 GPUs: one place per address
            if gpu is not None:
                placed.add(gpu)
            if i >= nic_count:
                if gpu is not None:  # a GPU without a NIC of its own: straight under its root port
                    self._pci_device(f"devices/{root_port}/{gpu}", socket)
                continue
            bus = int(gpu.split(":")[1], 16) if gpu is not None else 0x18 + 0x10 * i
            up = f"devices/{root_port}/0000:{bus - 2:02x}:00.0"
            for path in (up, f"{up}/0000:{bus - 1:02x}:00.0", f"{up}/0000:{bus - 1:02x}:01.0"):
                self._pci_device(path, socket)
            if gpu is not None:
                self._pci_device(f"{up}/0000:{bus - 1:02x}:00.0/{gpu}", socket)
            pci = f"0000:{bus + 1:02x}:00.0"
            nic_path = f"{up}/0000:{bus - 1:02x}:01.0/{pci}"
            self._pci_device(nic_path, socket)
            nic = _Nic(i, f"mlx5_{i}", f"ens{i}np0", pci)
            self.nics.append(nic)
            self._rdma(nic, nic_path)
        mgmt = "devices/pci0000:00/0000:00:1c.0/0000:03:00.0"
        self._pci_device(mgmt, 0)
        self._netdev(MANAGEMENT, mgmt, None)
        self._add_link("class/net/lo", "devices/virtual/net/lo")
        self._add_file("devices/virtual/net/lo/operstate", "unknown")
        self._add_file("devices/virtual/net/lo/mtu", "65536")

    def _rdma(self, nic: _Nic, pci_path: str) -> None:
        base = f"{pci_path}/infiniband/{nic.device}"
        self._add_link(f"class/infiniband/{nic.device}", base)
        self._add_link(f"{base}/device", pci_path)
        port = f"{base}/ports/1"
        self._add_file(f"{port}/link_layer", "Ethernet")
        self._add_file(f"{port}/state", lambda: "4: ACTIVE" if self._up(nic) else "1: DOWN")
        self._add_file(f"{port}/phys_state", lambda: "5: LinkUp" if self._up(nic) else "3: Disabled")
        self._add_file(f"{port}/rate", lambda: _rate_text(nic.rate_gbps))
        for name in ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "symbol_error",
                     "port_rcv_errors", "link_downed", "link_error_recovery", "port_xmit_discards", "port_xmit_wait"):
            self._add_file(f"{port}/counters/{name}", self._counter(nic, name))
        for name in ("np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "out_of_sequence",
                     "packet_seq_err", "local_ack_timeout_err"):
            self._add_file(f"{port}/hw_counters/{name}", self._counter(nic, name))
        self._netdev(nic.netdev, pci_path, nic)

    def _netdev(self, name: str, pci_path: str, nic: _Nic | None) -> None:
        base = f"{pci_path}/net/{name}"
        self._add_link(f"class/net/{name}", base)
        self._add_link(f"{base}/device", pci_path)
        self._add_file(f"{base}/dev_port", "0")
        self._add_file(f"{base}/mtu", "4200" if nic else "1500")
        if nic is None:
            self._add_file(f"{base}/operstate", "up")
            self._add_file(f"{base}/speed", "25000")
            self._add_file(f"{base}/carrier_changes", "1")
            for stat in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors"):
                self._add_file(f"{base}/statistics/{stat}", "0")
            return
        self._add_file(f"{base}/operstate", lambda: "up" if self._up(nic) else "down")
        self._add_file(f"{base}/speed", lambda: str(int(nic.rate_gbps * 1000)) if self._up(nic) else "-1")
        self._add_file(f"{base}/carrier_changes", self._counter(nic, "carrier_changes"))
        for stat, name in (("rx_bytes", "port_rcv_data_bytes"), ("tx_bytes", "port_xmit_data_bytes"),
                           ("rx_packets", "port_rcv_packets"), ("tx_packets", "port_xmit_packets"),
                           ("rx_errors", "port_rcv_errors"), ("tx_errors", "tx_errors")):
            self._add_file(f"{base}/statistics/{stat}", self._counter(nic, name))

    # --- ground truth --------------------------------------------------------------------------------------

    def _up(self, nic: _Nic) -> bool:
        if not nic.up:
            return False
        if nic.flapping_since is None:
            return True
        return (self._clock() - nic.flapping_since) % FLAP_PERIOD >= FLAP_DOWN  # down at the start of every period

    def _counter(self, nic: _Nic, name: str) -> Callable[[], str]:
        def read() -> str:
            with self._lock:  # this NIC's counters only: a collection reads hundreds of files
                now = self._clock()
                dt, nic.last = max(0.0, now - nic.last), now
                self._step(nic, now, dt)
            return str(int(nic.counters.get(name, 0)))
        return read

    def advance(self) -> None:
        """Bring every counter to now."""
        with self._lock:
            now = self._clock()
            for nic in self.nics:
                dt, nic.last = max(0.0, now - nic.last), now
                self._step(nic, now, dt)

    def _step(self, nic: _Nic, now: float, dt: float) -> None:
        k = nic.counters
        if nic.flapping_since is not None:
            since = now - nic.flapping_since
            downs = int(since // FLAP_PERIOD) + 1  # each period starts with the link going down...
            ups = int((since - FLAP_DOWN) // FLAP_PERIOD) + 1 if since >= FLAP_DOWN else 0  # ...and up FLAP_DOWN later
            new_downs, new_ups = downs - int(k.get("_flaps", 0)), ups - int(k.get("_ups", 0))
            k["link_downed"] = k.get("link_downed", 0) + new_downs
            k["carrier_changes"] = k.get("carrier_changes", 0) + new_downs + new_ups
            k["_flaps"], k["_ups"] = downs, ups
        if not self._up(nic):
            return
        data = nic.rate_gbps * 1e9 / 8 * TRAFFIC_SHARE * dt
        for direction in ("xmit", "rcv"):
            k[f"port_{direction}_data_bytes"] = k.get(f"port_{direction}_data_bytes", 0) + data
            k[f"port_{direction}_data"] = k[f"port_{direction}_data_bytes"] / 4  # 4-octet words, as sysfs counts
            k[f"port_{direction}_packets"] = k.get(f"port_{direction}_packets", 0) + data / PACKET_BYTES
        for name, rate in (("symbol_error", nic.symbol_errors_rate), ("port_rcv_errors", nic.symbol_errors_rate / 10),
                           ("np_ecn_marked_roce_packets", nic.ecn_rate), ("np_cnp_sent", nic.ecn_rate / 4),
                           ("rp_cnp_handled", nic.ecn_rate / 4), ("port_xmit_wait", XMIT_WAIT_TICKS_PER_SECOND
                                                                  * (1 + 100 * bool(nic.ecn_rate)))):
            if rate:
                k[name] = k.get(name, 0) + rate * dt

    def ground_truth(self, nic: int) -> dict[str, int]:
        self.advance()
        with self._lock:
            return {k: int(v) for k, v in self.nics[nic].counters.items() if not k.startswith("_")}

    # --- faults ------------------------------------------------------------------------------------------------

    def _nic(self, index: int) -> _Nic:
        if not 0 <= index < len(self.nics):
            raise ValueError(f"NIC {index} is not simulated ({len(self.nics)} NICs)")
        return self.nics[index]

    def _change(self, index: int, change: Callable[[_Nic], None]) -> None:
        self.advance()  # what happened before the fault counts at the old rates
        with self._lock:
            change(self._nic(index))

    def link_down(self, index: int) -> None:
        def down(nic: _Nic) -> None:
            if nic.up:
                nic.up = False
                nic.counters["link_downed"] = nic.counters.get("link_downed", 0) + 1
                nic.counters["carrier_changes"] = nic.counters.get("carrier_changes", 0) + 1
        self._change(index, down)

    def link_flap(self, index: int) -> None:
        def flap(nic: _Nic) -> None:
            if nic.flapping_since is None:
                nic.flapping_since = self._clock()
                nic.counters["_flaps"] = nic.counters["_ups"] = 0
        self._change(index, flap)

    def symbol_errors(self, index: int, per_second: float = SYMBOL_ERRORS_PER_SECOND) -> None:
        self._change(index, lambda nic: setattr(nic, "symbol_errors_rate", per_second))

    def congestion(self, index: int, marks_per_second: float = ECN_MARKS_PER_SECOND) -> None:
        self._change(index, lambda nic: setattr(nic, "ecn_rate", marks_per_second))

    def link_degraded(self, index: int, rate_gbps: float = RATE_GBPS / 2) -> None:
        self._change(index, lambda nic: setattr(nic, "rate_gbps", rate_gbps))

    def restore(self, index: int) -> None:
        """Undo every fault of the NIC; what the counters counted stays counted."""
        def heal(nic: _Nic) -> None:
            if not self._up(nic):  # down, or in a flap's down phase: the carrier comes back
                nic.counters["carrier_changes"] = nic.counters.get("carrier_changes", 0) + 1
            nic.up, nic.flapping_since, nic.rate_gbps = True, None, RATE_GBPS
            nic.symbol_errors_rate = nic.ecn_rate = 0.0
            nic.counters.pop("_flaps", None)
            nic.counters.pop("_ups", None)
        self._change(index, heal)

    def inject(self, kind: str, index: int) -> None:
        """A fault by its name in `simulate.faults` (link_down, link_flap, symbol_errors, congestion,
        link_degraded)."""
        if kind not in FAULTS:
            raise ValueError(f"unknown fabric fault {kind!r} (known: {', '.join(FAULTS)})")
        getattr(self, kind)(index)

    # --- SysfsView -----------------------------------------------------------------------------------------------

    def _walk(self, rel: str) -> str:
        """The path with every symlink among its components followed."""
        parts = [p for p in rel.strip("/").split("/") if p and p != "."]
        out: list[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                if out:
                    out.pop()
                continue
            out.append(part)
            path = "/".join(out)
            target = self._links.get(path)
            if target is not None:
                hops += 1
                if hops > 40:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", rel)
                parts = target.split("/") + parts
                out = []
        return "/".join(out)

    def listdir(self, rel: str) -> list[str]:
        path = self._walk(rel)
        if path not in self._dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", rel)
        return sorted(self._dirs[path])

    def read(self, rel: str) -> str:
        path = self._walk(rel)
        content = self._files.get(path)
        if content is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", rel)
        return content()

    def resolve(self, rel: str) -> str:
        return self._walk(rel)

    def exists(self, rel: str) -> bool:
        path = self._walk(rel)
        return path in self._dirs or path in self._files
