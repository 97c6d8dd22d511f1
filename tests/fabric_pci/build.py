"""Builds sysfs-like PCI trees of real GPU nodes (PROVENANCE.md says which machine each layout models), with real
directories, files and relative symlinks laid out as the kernel lays them out:

    devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0/{vendor,device,class,numa_node,...}
    bus/pci/devices/0000:18:00.0 -> ../../../devices/pci0000:15/.../0000:18:00.0
    devices/.../0000:19:00.0/infiniband/mlx5_0/{device -> ../../../0000:19:00.0, ports/1/...}
    class/infiniband/mlx5_0 -> ../../devices/.../0000:19:00.0/infiniband/mlx5_0
    devices/.../0000:19:00.0/net/ibp25s0/{device -> ../../../0000:19:00.0, ...}
    class/net/ibp25s0 -> ../../devices/.../0000:19:00.0/net/ibp25s0
    class/net/lo -> ../../devices/virtual/net/lo

A layout says only the shape (host bridges, root ports, switches, what hangs below them); bus numbers are given
depth-first from the host bridge's bus, as the firmware enumerates them, so every address follows from the shape.
`build` returns what the construction implies about each device (its address, NUMA node, root complex and the
upstream ports of the switches above it), read off the shape, for the tests to compare with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Gpu:
    index: int  # the index nvidia-smi gives it


@dataclass(frozen=True)
class Function:
    """One PCI function of a NIC: its RDMA device ("" for a plain Ethernet function) and its network interfaces.
    Interface names may use {bus}, {slot} and {fn} (decimal), as udev's predictable names do."""

    rdma: str = ""
    netdevs: tuple[str, ...] = ()
    link_layer: str = "InfiniBand"


@dataclass(frozen=True)
class Card:
    functions: tuple[Function, ...]


@dataclass(frozen=True)
class Switch:
    """A PCIe switch: its upstream port, and one downstream port per entry of `below`."""

    below: tuple[Gpu | Card | Switch, ...]


@dataclass(frozen=True)
class HostBridge:
    bus: int
    numa: int
    root_ports: tuple[tuple[int, Gpu | Card | Switch], ...]  # (root port's device number, what hangs below it)


@dataclass(frozen=True)
class Layout:
    host_bridges: tuple[HostBridge, ...]
    virtual_netdevs: tuple[str, ...] = ("lo",)
    switch_id: tuple[str, str] = ("0x1000", "0xc030")  # vendor, device of the switch ports


@dataclass(frozen=True)
class Where:
    """What the construction says about one device."""

    pci_bus_id: str
    numa_node: int
    root_complex: str
    switches: tuple[str, ...]  # upstream ports of the switches above it, from the root complex down


@dataclass
class Built:
    gpus: dict[int, Where] = field(default_factory=dict)  # by nvidia-smi index
    nics: dict[str, Where] = field(default_factory=dict)  # by RDMA device or interface name
    netdevs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # RDMA device -> its interfaces


# --- the layouts (PROVENANCE.md) -----------------------------------------------------------------------------------

def _ib(name: str) -> Card:
    return Card((Function(name, ("ibp{bus}s{slot}",)),))


def _hgx_h100() -> Layout:
    """8x H100 SXM, one ConnectX-7 per GPU below the same PCIe switch, each pair on its own host bridge; GPUs 0-3
    and their NICs on NUMA node 0, 4-7 on 1; a dual-port on-board Ethernet NIC without RDMA on NUMA node 0."""
    pairs = ((0x15, 0), (0x27, 0), (0x37, 0), (0x5a, 0), (0x97, 1), (0xa8, 1), (0xb7, 1), (0xd8, 1))
    bridges = [HostBridge(bus, numa, ((0x01, Switch((Gpu(i), _ib(f"mlx5_{i}")))),))
               for i, (bus, numa) in enumerate(pairs)]
    onboard = Card((Function("", ("eno1",), "Ethernet"), Function("", ("eno2",), "Ethernet")))
    return Layout((HostBridge(0x00, 0, ((0x1c, onboard),)), *bridges), ("lo", "docker0"))


def _dgx2_like() -> Layout:
    """16 GPUs in pairs below leaf switches, each leaf with one ConnectX NIC, two leaves below an upper switch per
    host bridge, two host bridges per socket; a dual-port Ethernet ConnectX on its own root port of socket 1."""
    def upper(first_gpu: int, first_nic: int) -> Switch:
        return Switch(tuple(Switch((Gpu(first_gpu + 2 * k), Gpu(first_gpu + 2 * k + 1), _ib(f"mlx5_{first_nic + k}")))
                            for k in range(2)))
    roce = Card((Function("mlx5_8", ("enp{bus}s{slot}f{fn}",), "Ethernet"),
                 Function("mlx5_9", ("enp{bus}s{slot}f{fn}",), "Ethernet")))
    return Layout((HostBridge(0x17, 0, ((0x00, upper(0, 0)),)),
                   HostBridge(0x3a, 0, ((0x00, upper(4, 2)),)),
                   HostBridge(0x85, 1, ((0x00, upper(8, 4)),)),
                   HostBridge(0xae, 1, ((0x00, upper(12, 6)),)),
                   HostBridge(0xd7, 1, ((0x00, roce),))), switch_id=("0x10b5", "0x9797"))


def _dual_port_tie() -> Layout:
    """8 GPUs; GPUs 2 and 3 below one switch with both functions of a dual-port ConnectX (mlx5_0, mlx5_1), GPUs
    0-1 below a switch of another host bridge of the same socket, GPUs 4-7 on the other socket."""
    card = Card((Function("mlx5_0", ("ib0",)), Function("mlx5_1", ("ib1",))))
    return Layout((HostBridge(0x17, 0, ((0x00, Switch((Gpu(0), Gpu(1)))),)),
                   HostBridge(0x3a, 0, ((0x00, Switch((Gpu(2), Gpu(3), card))),)),
                   HostBridge(0x85, 1, ((0x00, Switch((Gpu(4), Gpu(5)))),)),
                   HostBridge(0xae, 1, ((0x00, Switch((Gpu(6), Gpu(7)))),))), switch_id=("0x10b5", "0x8747"))


def _cross_socket() -> Layout:
    """4 GPUs below one switch on socket 0; the only NIC, a ConnectX, on a root port of socket 1."""
    return Layout((HostBridge(0x17, 0, ((0x00, Switch((Gpu(0), Gpu(1), Gpu(2), Gpu(3)))),)),
                   HostBridge(0x85, 1, ((0x00, Card((Function("mlx5_0", ("ib0",)),))),))),
                  switch_id=("0x10b5", "0x8764"))


LAYOUTS = {
    "hgx_h100": _hgx_h100,
    "dgx2_like": _dgx2_like,
    "dual_port_tie": _dual_port_tie,
    "cross_socket": _cross_socket,
}


# --- writing the tree ------------------------------------------------------------------------------------------------

def build(kind: str, root: Path) -> Built:
    """Write layout `kind` under `root` (which then reads as a sysfs root) and return what it implies."""
    layout = LAYOUTS[kind]()
    writer = _Writer(root, layout)
    for bridge in layout.host_bridges:
        writer.host_bridge(bridge)
    for name in layout.virtual_netdevs:
        virtual_netdev(root, name)
    return writer.built


def virtual_netdev(root: Path, name: str) -> None:
    """A network interface with no device (loopback, bridge, veth), as the kernel files it."""
    directory = root / "devices" / "virtual" / "net" / name
    _files(directory, {"type": "772" if name == "lo" else "1", "operstate": "unknown"})
    _link(root / "class" / "net" / name, directory)


def soft_rdma(root: Path, name: str, parent: str) -> None:
    """A software RDMA device (rdma_rxe): no PCI device below it, only the name of its parent interface."""
    directory = root / "devices" / "virtual" / "infiniband" / name
    _files(directory, {"parent": parent})
    _files(directory / "ports" / "1", {"state": "4: ACTIVE", "link_layer": "Ethernet"})
    _link(root / "class" / "infiniband" / name, directory)


def dangle(root: Path, rel: str) -> None:
    """Point the symlink at `rel` (a `device` link) at a device that is gone, as after a hot unplug."""
    link = root / rel
    link.unlink()
    os.symlink("../../../0000:ff:1f.7", link)


class _Writer:
    def __init__(self, root: Path, layout: Layout) -> None:
        self.root = root
        self.layout = layout
        self.built = Built()

    def host_bridge(self, bridge: HostBridge) -> None:
        name = f"0000:{bridge.bus:02x}"
        top = self.root / "devices" / f"pci{name}"
        top.mkdir(parents=True, exist_ok=True)
        self.next_bus = bridge.bus + 1
        for device, below in bridge.root_ports:
            port = self._function(top, bridge.bus, device, 0, ("0x8086", "0x0604"), "0x060400", bridge.numa)
            self._below(port, below, bridge, ())

    def _below(self, parent: Path, node: Gpu | Card | Switch, bridge: HostBridge, switches: tuple[str, ...]) -> None:
        """Fill the secondary bus of the bridge at `parent` with `node`."""
        bus = self.next_bus
        self.next_bus += 1
        if isinstance(node, Switch):
            up = self._function(parent, bus, 0, 0, self.layout.switch_id, "0x060400", bridge.numa)
            downstream_bus = self.next_bus
            self.next_bus += 1
            for slot, child in enumerate(node.below):
                down = self._function(up, downstream_bus, slot, 0, self.layout.switch_id, "0x060400", bridge.numa)
                self._below(down, child, bridge, (*switches, up.name))
        elif isinstance(node, Gpu):
            gpu = self._function(parent, bus, 0, 0, ("0x10de", "0x2330"), "0x030200", bridge.numa)
            self.built.gpus[node.index] = self._where(gpu, bridge, switches)
        else:
            for fn, function in enumerate(node.functions):
                self._nic_function(parent, bus, fn, function, bridge, switches)

    def _nic_function(self, parent: Path, bus: int, fn: int, function: Function, bridge: HostBridge,
                      switches: tuple[str, ...]) -> None:
        if function.rdma:
            ids = ("0x15b3", "0x1021")
            pci_class = "0x020700" if function.link_layer == "InfiniBand" else "0x020000"
        else:
            ids, pci_class = ("0x8086", "0x1563"), "0x020000"
        directory = self._function(parent, bus, 0, fn, ids, pci_class, bridge.numa)
        netdevs = tuple(n.format(bus=bus, slot=0, fn=fn) for n in function.netdevs)
        for netdev in netdevs:
            net = directory / "net" / netdev
            _files(net, {"type": "32" if function.link_layer == "InfiniBand" else "1", "operstate": "up"})
            os.symlink(f"../../../{directory.name}", net / "device")
            _link(self.root / "class" / "net" / netdev, net)
        where = self._where(directory, bridge, switches)
        if function.rdma:
            rdma = directory / "infiniband" / function.rdma
            _files(rdma / "ports" / "1", {"state": "4: ACTIVE", "phys_state": "5: LinkUp",
                                          "link_layer": function.link_layer})
            os.symlink(f"../../../{directory.name}", rdma / "device")
            _link(self.root / "class" / "infiniband" / function.rdma, rdma)
            self.built.nics[function.rdma] = where
            self.built.netdevs[function.rdma] = netdevs
        else:
            for netdev in netdevs:
                self.built.nics[netdev] = where

    def _function(self, parent: Path, bus: int, device: int, fn: int, ids: tuple[str, str], pci_class: str,
                  numa: int) -> Path:
        """A PCI function's directory below `parent`, with its files and its bus/pci/devices link."""
        bdf = f"0000:{bus:02x}:{device:02x}.{fn}"
        directory = parent / bdf
        _files(directory, {"vendor": ids[0], "device": ids[1], "class": pci_class, "numa_node": str(numa),
                           "subsystem_vendor": ids[0], "subsystem_device": "0x0000"})
        _link(self.root / "bus" / "pci" / "devices" / bdf, directory)
        return directory

    def _where(self, directory: Path, bridge: HostBridge, switches: tuple[str, ...]) -> Where:
        return Where(directory.name, bridge.numa, f"0000:{bridge.bus:02x}", switches)


def _files(directory: Path, contents: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in contents.items():
        (directory / name).write_text(text + "\n")


def _link(link: Path, target: Path) -> None:
    """A relative symlink at `link` to `target`, as sysfs writes them."""
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, link.parent), link)
