"""Where GPUs and NICs sit on the PCI tree, and which NIC ports each GPU should use.

Everything here is a pure function of a `SysfsView` (paths relative to the sysfs root), so the same code runs on a
host's /sys, on a pod's read-only mount of it and on the fixture trees of the tests. Nothing raises on a sysfs read
error: a NIC or GPU that cannot be placed is left out and named in the result, for the caller to count.

How a device is placed follows NCCL's own reading of sysfs (NVIDIA/nccl at commit 5067397c, after v2.30.7-1):

- src/graph/xml.cc, `ncclTopoGetXmlFromSys`: NCCL takes the resolved device path
  (`/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0`) and goes up TWO path components
  at a time, so that a PCIe switch (its upstream port plus the downstream port below it) is one node, named after
  the upstream port (here `0000:16:00.0`). It stops at the first component that is not a bus/device/function
  (`checkBDFFormat`: exactly `BBBB:BB:DD.F`), which is the CPU's root complex, and attaches what it walked to the
  CPU node of the `numa_node` sysfs gives for it. A device straight below a root port therefore hangs off the CPU
  with no switch node at all.
- src/graph/paths.cc, `ncclTopoSetPaths`: a path's type is the worst link on it; a hop from one PCI switch node to
  another makes it PXB, a hop through a CPU node makes it PHB, and src/graph/topo.cc `ncclTopoConnectCpus` joins
  CPU nodes with SYS links. Two devices below the same switch node are PIX.

NCCL keys CPU nodes by NUMA node only (topo.cc `ncclTopoAddCpu`), so it calls PHB what `nvidia-smi topo -m` splits
into PHB (one host bridge) and NODE (two host bridges of one NUMA node); the metrics use nvidia-smi's five names,
so root complexes are compared first. NCCL also merges Broadcom PEX Gen4/Gen5 switches that present themselves as
two levels (topo.cc `ncclTopoFlattenBcmSwitches`), where it sees PIX and nvidia-smi reports PXB; like nvidia-smi,
nothing is merged here. A NUMA node of -1 (the kernel does not know) never counts as shared: two devices on
different root complexes with an unknown NUMA node on either side are SYS.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .reading import listdir
from .sysfs import SysfsView

# nvidia-smi's names of the PCI paths, best first
PATH_TYPES = ("PIX", "PXB", "PHB", "NODE", "SYS")
_RANK = {name: rank for rank, name in enumerate(PATH_TYPES)}

# a PCI function as sysfs names it (domain, bus, device, function; VMD domains have 5 hex digits)
_BDF = re.compile(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
# a host bridge (root complex) directory: devices/pci0000:00
_HOST_BRIDGE = re.compile(r"pci([0-9a-f]{4,}:[0-9a-f]{2})")
# the addresses NVML and sysfs write: 00000000:18:00.0, 0000:18:00.0, 18:00.0 (any case)
_BUS_ID = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])")


@dataclass(frozen=True)
class Nic:
    """An RDMA device, or a physical network interface that has none. `ports` are the RDMA port numbers ("1",
    "2"); a plain interface has the single port "" so that every NIC is addressed as (device, port)."""

    device: str
    ports: tuple[str, ...]
    netdevs: tuple[str, ...]
    pci_bus_id: str

    @property
    def rdma(self) -> bool:
        return self.ports != ("",)


@dataclass(frozen=True)
class NicScan:
    nics: tuple[Nic, ...]
    unreadable: tuple[str, ...]  # RDMA devices and interfaces whose sysfs entries could not be read


@dataclass(frozen=True)
class Place:
    """Where a PCI device sits. `switches` are the PCIe switches above it as NCCL sees them (each named by its
    upstream port), from the root complex down; `pcie_switch` is the nearest, "" when there is none."""

    pci_bus_id: str
    numa_node: int
    root_complex: str
    switches: tuple[str, ...]

    @property
    def pcie_switch(self) -> str:
        return self.switches[-1] if self.switches else ""


@dataclass(frozen=True)
class NicPath:
    device: str
    port: str
    path: str


@dataclass(frozen=True)
class PlacedNic:
    nic: Nic
    place: Place


@dataclass(frozen=True)
class GpuTopology:
    index: int
    uuid: str
    place: Place
    nic_paths: tuple[NicPath, ...]  # every NIC port of the node
    preferred: tuple[NicPath, ...]  # the closest of them (several on a tie)


@dataclass(frozen=True)
class Topology:
    gpus: tuple[GpuTopology, ...]
    nics: tuple[PlacedNic, ...]
    unreadable_nics: tuple[str, ...]  # device or interface names
    unreadable_gpus: tuple[str, ...]  # uuids of GPUs whose PCI address is not (readably) in sysfs


def normalize_bus_id(bus_id: str) -> str:
    """The sysfs spelling of a PCI address: NVML writes `00000000:18:00.0` (eight-digit domain, upper case),
    sysfs `0000:18:00.0`. Raises ValueError for anything else."""
    match = _BUS_ID.fullmatch(bus_id.strip().lower())
    if match is None:
        raise ValueError(f"not a PCI address: {bus_id!r}")
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def path_rank(path_type: str) -> int:
    """0 for PIX up to 4 for SYS: lower is closer."""
    return _RANK[path_type]


def path(a: Place, b: Place) -> str:
    """The path type between two placed devices, as `nvidia-smi topo -m` names it (see the module docstring)."""
    if a.root_complex != b.root_complex:
        return "NODE" if a.numa_node == b.numa_node and a.numa_node >= 0 else "SYS"
    shared = _common_prefix(a.switches, b.switches)
    if shared == 0:
        return "PHB"
    if shared == len(a.switches) == len(b.switches):
        return "PIX"
    return "PXB"


def place(view: SysfsView, bus_id: str) -> Place | None:
    """Where the PCI device at `bus_id` (NVML or sysfs spelling) sits; None when the address is malformed, not in
    this sysfs, or cannot be resolved to a device below a PCI root complex."""
    try:
        bdf = normalize_bus_id(bus_id)
        rel = f"bus/pci/devices/{bdf}"
        if not view.exists(rel):
            return None
        resolved = view.resolve(rel)
    except (OSError, ValueError):
        return None
    return _place_at(view, resolved)


def nics(view: SysfsView) -> NicScan:
    """The node's NICs: every RDMA device of class/infiniband on a PCI device, then every network interface of
    class/net backed by a PCI device that belongs to no RDMA device (its traffic goes through NCCL's socket
    transport, not verbs). Interfaces without a device (loopback, bridges, bonds, veth, tunnels) and devices not on
    PCI (soft RoCE, platform devices) are not NICs here; a device link that leads nowhere, or an RDMA device whose
    ports cannot be listed, is reported as unreadable."""
    found: list[Nic] = []
    unreadable: list[str] = []
    for device in _natural(listdir(view, "class/infiniband")):
        try:
            nic = _rdma_nic(view, device)
        except OSError:
            unreadable.append(device)
            continue
        if nic is not None:
            found.append(nic)
    taken = {netdev for nic in found for netdev in nic.netdevs}
    for iface in _natural(listdir(view, "class/net")):
        if iface in taken:
            continue
        try:
            nic = _plain_nic(view, iface)
        except OSError:
            unreadable.append(iface)
            continue
        if nic is not None:
            found.append(nic)
    return NicScan(tuple(found), tuple(unreadable))


def gpu_nic_paths(view: SysfsView, gpus: Iterable[tuple[int, str, str]]) -> Topology:
    """For each GPU (index, uuid, PCI bus id as NVML gives it): its place, its path to every NIC port, and the
    preferred ports, the ones with the best path. Preferred ports are chosen among RDMA ports when the node has
    any, because NCCL then uses its verbs transport and the socket interfaces carry no collective traffic; on a
    node without RDMA devices they are chosen among the plain interfaces. Port state is not considered."""
    scan = nics(view)
    unreadable_nics = list(scan.unreadable)
    placed: list[PlacedNic] = []
    for nic in scan.nics:
        where = place(view, nic.pci_bus_id)
        if where is None:
            unreadable_nics.append(nic.device)
        else:
            placed.append(PlacedNic(nic, where))
    candidates = {pn.nic.device for pn in placed if pn.nic.rdma} or {pn.nic.device for pn in placed}
    placed_gpus: list[GpuTopology] = []
    unreadable_gpus: list[str] = []
    for index, uuid, bus_id in gpus:
        where = place(view, bus_id)
        if where is None:
            unreadable_gpus.append(uuid)
            continue
        paths = tuple(NicPath(pn.nic.device, port, path(where, pn.place)) for pn in placed for port in pn.nic.ports)
        placed_gpus.append(GpuTopology(index, uuid, where, paths, _preferred(paths, candidates)))
    return Topology(tuple(placed_gpus), tuple(placed), tuple(unreadable_nics), tuple(unreadable_gpus))


# --- helpers -----------------------------------------------------------------------------------------------------

def _preferred(paths: tuple[NicPath, ...], candidates: set[str]) -> tuple[NicPath, ...]:
    eligible = [p for p in paths if p.device in candidates]
    if not eligible:
        return ()
    best = min(_RANK[p.path] for p in eligible)
    return tuple(p for p in eligible if _RANK[p.path] == best)


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    shared = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        shared += 1
    return shared


def _split(resolved: str) -> tuple[str, tuple[str, ...], str] | None:
    """(root complex, chain of PCI functions from the root port down to the device, the device's directory) of a
    resolved sysfs path, or None when the path does not lead to a PCI function below a host bridge. Trailing
    components that are not PCI functions (a virtio device below its PCI function: .../0000:00:03.0/virtio0) are
    dropped, so such a device is placed at its PCI function."""
    parts = resolved.split("/")
    if not parts or parts[0] != "devices":
        return None
    while parts and not _BDF.fullmatch(parts[-1]):
        parts.pop()
    start = len(parts)
    while start > 0 and _BDF.fullmatch(parts[start - 1]):
        start -= 1
    if start == len(parts) or start == 0:
        return None
    host_bridge = _HOST_BRIDGE.fullmatch(parts[start - 1])
    if host_bridge is None:
        return None
    return host_bridge.group(1), tuple(parts[start:]), "/".join(parts)


def _switches(chain: tuple[str, ...]) -> tuple[str, ...]:
    """The switch nodes NCCL's two-components-at-a-time walk meets above the last function of `chain`, from the
    root down: the functions two, four, ... places above it, as long as they are below the host bridge."""
    return tuple(reversed(chain[len(chain) - 3::-2])) if len(chain) >= 3 else ()


def _place_at(view: SysfsView, resolved: str) -> Place | None:
    split = _split(resolved)
    if split is None:
        return None
    root_complex, chain, device_dir = split
    return Place(chain[-1], _numa_node(view, device_dir), root_complex, _switches(chain))


def _numa_node(view: SysfsView, device_dir: str) -> int:
    """The device's NUMA node; -1 (what the kernel writes when it does not know) when absent or unreadable."""
    try:
        return int(view.read(f"{device_dir}/numa_node"))
    except (OSError, ValueError):
        return -1


def _device_link(view: SysfsView, rel: str) -> str | None:
    """The resolved `device` link of a class entry; None when the entry has none (a virtual device). Raises
    OSError when the link is there but leads nowhere."""
    if "device" not in view.listdir(rel):
        return None
    link = f"{rel}/device"
    if not view.exists(link):
        raise FileNotFoundError(f"{link} leads nowhere")
    return view.resolve(link)


def _pci_function(resolved: str | None) -> str | None:
    split = _split(resolved) if resolved is not None else None
    return split[1][-1] if split is not None else None


def _rdma_nic(view: SysfsView, device: str) -> Nic | None:
    rel = f"class/infiniband/{device}"
    bdf = _pci_function(_device_link(view, rel))
    if bdf is None:
        return None
    ports = tuple(sorted(view.listdir(f"{rel}/ports"), key=_natural_key))
    if not ports:
        raise FileNotFoundError(f"{rel}/ports is empty")
    netdevs: tuple[str, ...] = ()
    if view.exists(f"{rel}/device/net"):
        try:
            netdevs = tuple(_natural(view.listdir(f"{rel}/device/net")))
        except OSError:
            netdevs = ()
    return Nic(device, ports, netdevs, bdf)


def _plain_nic(view: SysfsView, iface: str) -> Nic | None:
    rel = f"class/net/{iface}"
    bdf = _pci_function(_device_link(view, rel))
    if bdf is None or view.exists(f"{rel}/device/infiniband"):
        # no PCI device, or the function carries an RDMA device whose entry could not be read: not a plain NIC
        return None
    return Nic(iface, ("",), (iface,), bdf)


def _natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """mlx5_2 before mlx5_10, port 2 before port 10."""
    return tuple((0, int(part)) if part.isascii() and part.isdigit() else (1, part)
                 for part in re.split(r"([0-9]+)", name) if part)


def _natural(names: Iterable[str]) -> list[str]:
    return sorted(names, key=_natural_key)
