"""The fabric source's PCI topology (exporter/sources/fabric/topology.py) and NCCL environment check (nccl.py), on
sysfs trees built from real machines (tests/fabric_pci/PROVENANCE.md).

Expected paths are the cells of the cited `nvidia-smi topo -m` matrices, copied below as data; expected NUMA nodes,
root complexes and switches are what the fixture's construction says (`Built`, read off the layout's shape); the
preferred NICs are the best cells of each cited row. Nothing here restates an answer of the code under test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fabric_pci.build import Built, build, dangle, soft_rdma, virtual_netdev

from exporter.sources.fabric import nccl, topology
from exporter.sources.fabric.sysfs import HostSysfs
from exporter.sources.fabric.topology import Nic

# --- the cited matrices (GPU row -> the NIC columns, in the order of NICS) --------------------------------------------

# https://github.com/sgl-project/sglang/issues/30401, 8x H100 80GB HBM3, NIC0..NIC7 = mlx5_0..mlx5_7
HGX_NICS = [f"mlx5_{i}" for i in range(8)]
HGX_MATRIX = {
    0: "PIX NODE NODE NODE SYS SYS SYS SYS",
    1: "NODE PIX NODE NODE SYS SYS SYS SYS",
    2: "NODE NODE PIX NODE SYS SYS SYS SYS",
    3: "NODE NODE NODE PIX SYS SYS SYS SYS",
    4: "SYS SYS SYS SYS PIX NODE NODE NODE",
    5: "SYS SYS SYS SYS NODE PIX NODE NODE",
    6: "SYS SYS SYS SYS NODE NODE PIX NODE",
    7: "SYS SYS SYS SYS NODE NODE NODE PIX",
}
HGX_GPU_NUMA = {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}  # the matrix's "NUMA Affinity" column

# https://github.com/NVIDIA/nccl-tests/issues/78, 16 GPUs (DGX-2 class), rows GPU0..GPU4 as the issue shows them
DGX2_NICS = [f"mlx5_{i}" for i in range(10)]
DGX2_MATRIX = {
    0: "PIX PXB NODE NODE SYS SYS SYS SYS SYS SYS",
    1: "PIX PXB NODE NODE SYS SYS SYS SYS SYS SYS",
    2: "PXB PIX NODE NODE SYS SYS SYS SYS SYS SYS",
    3: "PXB PIX NODE NODE SYS SYS SYS SYS SYS SYS",
    4: "NODE NODE PIX PXB SYS SYS SYS SYS SYS SYS",
}

# https://github.com/NVIDIA/nccl-tests/issues/29, 8x V100 (DGX-1 class) with mlx5_0, mlx5_1
TIE_NICS = ["mlx5_0", "mlx5_1"]
TIE_MATRIX = {0: "NODE NODE", 1: "NODE NODE", 2: "PIX PIX", 3: "PIX PIX",
              4: "SYS SYS", 5: "SYS SYS", 6: "SYS SYS", 7: "SYS SYS"}

# https://github.com/horovod/horovod/issues/288, 4 GPUs, one mlx5_0 on the other socket
CROSS_NICS = ["mlx5_0"]
CROSS_MATRIX = {0: "SYS", 1: "SYS", 2: "SYS", 3: "SYS"}

CITED = {
    "hgx_h100": (HGX_NICS, HGX_MATRIX),
    "dgx2_like": (DGX2_NICS, DGX2_MATRIX),
    "dual_port_tie": (TIE_NICS, TIE_MATRIX),
    "cross_socket": (CROSS_NICS, CROSS_MATRIX),
}
RANK = {"PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4}


def _tree(tmp_path: Path, kind: str) -> tuple[HostSysfs, Built]:
    root = tmp_path / kind
    root.mkdir()
    built = build(kind, root)
    return HostSysfs(str(root)), built


def _gpus(built: Built) -> list[tuple[int, str, str]]:
    """(index, uuid, bus id) as NVML reports them: eight-digit domain, upper case."""
    return [(i, f"GPU-{i:08d}", "0000" + w.pci_bus_id.upper()) for i, w in sorted(built.gpus.items())]


def _paths(gpu: topology.GpuTopology) -> dict[str, str]:
    return {p.device: p.path for p in gpu.nic_paths}


def _cited_best(nics: list[str], row: str) -> set[str]:
    cells = row.split()
    best = min(RANK[c] for c in cells)
    return {nic for nic, cell in zip(nics, cells, strict=True) if RANK[cell] == best}


# --- paths against the real matrices ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(CITED))
def test_every_cited_cell_matches(tmp_path: Path, kind: str) -> None:
    view, built = _tree(tmp_path, kind)
    nics, matrix = CITED[kind]
    topo = topology.gpu_nic_paths(view, _gpus(built))
    assert topo.unreadable_nics == () and topo.unreadable_gpus == ()
    by_index = {g.index: g for g in topo.gpus}
    assert sorted(by_index) == sorted(built.gpus)
    for index, row in matrix.items():
        got = _paths(by_index[index])
        assert [got[nic] for nic in nics] == row.split(), f"{kind} GPU{index}"


@pytest.mark.parametrize("kind", sorted(CITED))
def test_preferred_nics_are_the_best_cells_of_the_cited_row(tmp_path: Path, kind: str) -> None:
    view, built = _tree(tmp_path, kind)
    nics, matrix = CITED[kind]
    by_index = {g.index: g for g in topology.gpu_nic_paths(view, _gpus(built)).gpus}
    for index, row in matrix.items():
        preferred = by_index[index].preferred
        assert {p.device for p in preferred} == _cited_best(nics, row), f"{kind} GPU{index}"
        assert {p.port for p in preferred} == {"1"}


def test_a_tie_prefers_both_ports(tmp_path: Path) -> None:
    view, built = _tree(tmp_path, "dual_port_tie")
    gpu2 = {g.index: g for g in topology.gpu_nic_paths(view, _gpus(built)).gpus}[2]
    assert [(p.device, p.port, p.path) for p in gpu2.preferred] == [("mlx5_0", "1", "PIX"), ("mlx5_1", "1", "PIX")]


def test_hgx_gpu_numa_nodes_match_the_cited_affinity(tmp_path: Path) -> None:
    view, built = _tree(tmp_path, "hgx_h100")
    topo = topology.gpu_nic_paths(view, _gpus(built))
    assert {g.index: g.place.numa_node for g in topo.gpus} == HGX_GPU_NUMA


def test_plain_ethernet_nics_follow_the_construction(tmp_path: Path) -> None:
    """eno1/eno2 sit on host bridge 0000:00 of NUMA node 0 (construction; nvidia-smi does not list them)."""
    view, built = _tree(tmp_path, "hgx_h100")
    topo = topology.gpu_nic_paths(view, _gpus(built))
    plain = [pn.nic for pn in topo.nics if not pn.nic.rdma]
    assert [(n.device, n.ports, n.netdevs) for n in plain] == [("eno1", ("",), ("eno1",)), ("eno2", ("",), ("eno2",))]
    for gpu in topo.gpus:
        expected = "NODE" if built.gpus[gpu.index].numa_node == 0 else "SYS"
        assert _paths(gpu)["eno1"] == _paths(gpu)["eno2"] == expected
        # the node has RDMA devices, so NCCL uses verbs: an Ethernet port is never preferred
        assert all(p.device.startswith("mlx5_") for p in gpu.preferred)


# --- places against the construction -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(CITED))
def test_every_device_is_placed_as_built(tmp_path: Path, kind: str) -> None:
    view, built = _tree(tmp_path, kind)
    topo = topology.gpu_nic_paths(view, _gpus(built))
    for gpu in topo.gpus:
        want = built.gpus[gpu.index]
        assert (gpu.place.pci_bus_id, gpu.place.numa_node, gpu.place.root_complex, gpu.place.switches) == (
            want.pci_bus_id, want.numa_node, want.root_complex, want.switches)
        assert gpu.place.pcie_switch == (want.switches[-1] if want.switches else "")
    assert sorted(pn.nic.device for pn in topo.nics) == sorted(built.nics)
    for pn in topo.nics:
        want = built.nics[pn.nic.device]
        assert pn.nic.pci_bus_id == pn.place.pci_bus_id == want.pci_bus_id
        assert (pn.place.numa_node, pn.place.root_complex, pn.place.switches) == (
            want.numa_node, want.root_complex, want.switches)
        if pn.nic.rdma:
            assert pn.nic.ports == ("1",)
            assert pn.nic.netdevs == built.netdevs[pn.nic.device]


def test_dgx2_gpus_sit_below_two_switches(tmp_path: Path) -> None:
    view, built = _tree(tmp_path, "dgx2_like")
    gpu0 = topology.place(view, built.gpus[0].pci_bus_id)
    assert gpu0 is not None and len(gpu0.switches) == 2
    # the leaf switch is the nearest; GPU0 and GPU2 share only the upper one
    gpu2 = topology.place(view, built.gpus[2].pci_bus_id)
    assert gpu2 is not None
    assert gpu0.switches[0] == gpu2.switches[0] and gpu0.pcie_switch != gpu2.pcie_switch


def test_rdma_netdevs_are_not_listed_again_as_plain_nics(tmp_path: Path) -> None:
    view, built = _tree(tmp_path, "dgx2_like")
    scan = topology.nics(view)
    devices = [n.device for n in scan.nics]
    assert devices == DGX2_NICS  # and no entry for their interfaces (enp...f0/f1, ibp...s0)
    assert built.netdevs["mlx5_8"] and all(netdev not in devices for netdev in built.netdevs["mlx5_8"])


# --- bus ids ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("given", "sysfs"), [
    ("00000000:18:00.0", "0000:18:00.0"),
    ("00000000:DB:00.0", "0000:db:00.0"),
    ("0000:db:00.0", "0000:db:00.0"),
    ("DB:00.0", "0000:db:00.0"),
    (" 00000001:0A:1f.7 ", "0001:0a:1f.7"),
    ("00010000:E1:00.0", "10000:e1:00.0"),
])
def test_bus_ids_are_normalised_to_the_sysfs_spelling(given: str, sysfs: str) -> None:
    assert topology.normalize_bus_id(given) == sysfs


@pytest.mark.parametrize("bad", ["", "GPU-0", "0000:18:00", "0000:18:00.8", "0000:118:00.0", "zz:00.0"])
def test_malformed_bus_ids_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        topology.normalize_bus_id(bad)


def test_nvml_and_sysfs_spellings_place_the_same_device(tmp_path: Path) -> None:
    view, built = _tree(tmp_path, "hgx_h100")
    gpu7 = built.gpus[7].pci_bus_id
    assert gpu7 == "0000:db:00.0"
    assert topology.place(view, "00000000:DB:00.0") == topology.place(view, gpu7) is not None


# --- what cannot be read --------------------------------------------------------------------------------------------

def test_a_missing_numa_node_reads_as_unknown(tmp_path: Path) -> None:
    view, built = _tree(tmp_path, "hgx_h100")
    gpu0 = built.gpus[0]
    (Path(view.root) / "bus/pci/devices" / gpu0.pci_bus_id / "numa_node").unlink()
    topo = topology.gpu_nic_paths(view, _gpus(built))
    gpu = {g.index: g for g in topo.gpus}[0]
    assert gpu.place.numa_node == -1
    paths = _paths(gpu)
    # same switch: still PIX; other host bridges: an unknown NUMA node is never shared, so SYS instead of NODE
    assert paths["mlx5_0"] == "PIX"
    assert [paths[n] for n in ("mlx5_1", "mlx5_2", "mlx5_3")] == ["SYS", "SYS", "SYS"]


def test_an_unreadable_numa_node_reads_as_unknown(tmp_path: Path) -> None:
    view, built = _tree(tmp_path, "hgx_h100")
    numa = Path(view.root) / "bus/pci/devices" / built.gpus[1].pci_bus_id / "numa_node"
    numa.write_text("garbage\n")
    place = topology.place(view, built.gpus[1].pci_bus_id)
    assert place is not None and place.numa_node == -1


def test_a_dangling_rdma_device_link_leaves_the_nic_out_and_reports_it(tmp_path: Path) -> None:
    view, built = _tree(tmp_path, "hgx_h100")
    dangle(Path(view.root), "class/infiniband/mlx5_3/device")
    topo = topology.gpu_nic_paths(view, _gpus(built))
    assert topo.unreadable_nics == ("mlx5_3",)
    devices = [pn.nic.device for pn in topo.nics]
    assert "mlx5_3" not in devices
    # its IPoIB interface still has a good device link, but belongs to an RDMA device: not a plain NIC either
    assert not set(built.netdevs["mlx5_3"]) & set(devices)
    # GPU3 loses its PIX NIC: the best left in its cited row are the NODE cells
    gpu3 = {g.index: g for g in topo.gpus}[3]
    row = dict(zip(HGX_NICS, HGX_MATRIX[3].split(), strict=True))
    del row["mlx5_3"]
    assert {p.device for p in gpu3.preferred} == _cited_best(list(row), " ".join(row.values()))


def test_a_dangling_interface_link_is_reported(tmp_path: Path) -> None:
    view, _ = _tree(tmp_path, "hgx_h100")
    dangle(Path(view.root), "class/net/eno2/device")
    scan = topology.nics(view)
    assert scan.unreadable == ("eno2",)
    assert "eno2" not in [n.device for n in scan.nics] and "eno1" in [n.device for n in scan.nics]


def test_rdma_ports_that_cannot_be_listed_are_reported(tmp_path: Path) -> None:
    view, _ = _tree(tmp_path, "hgx_h100")
    ports = Path(view.root) / "class/infiniband/mlx5_5/ports"
    (ports / "1" / "state").unlink()
    (ports / "1" / "phys_state").unlink()
    (ports / "1" / "link_layer").unlink()
    (ports / "1").rmdir()
    ports.rmdir()
    assert topology.nics(view).unreadable == ("mlx5_5",)


def test_virtual_and_soft_devices_are_neither_nics_nor_errors(tmp_path: Path) -> None:
    view, _ = _tree(tmp_path, "cross_socket")
    root = Path(view.root)
    virtual_netdev(root, "veth1a2b")
    soft_rdma(root, "rxe0", "veth1a2b")
    scan = topology.nics(view)
    assert [n.device for n in scan.nics] == ["mlx5_0"]
    assert scan.unreadable == ()


def test_a_gpu_missing_from_sysfs_is_reported_not_raised(tmp_path: Path) -> None:
    view, built = _tree(tmp_path, "cross_socket")
    gpus = [*_gpus(built), (4, "GPU-absent", "00000000:E3:00.0"), (5, "GPU-garbled", "not-an-address")]
    topo = topology.gpu_nic_paths(view, gpus)
    assert [g.index for g in topo.gpus] == [0, 1, 2, 3]
    assert topo.unreadable_gpus == ("GPU-absent", "GPU-garbled")


def test_a_missing_sysfs_yields_nothing_and_raises_nothing(tmp_path: Path) -> None:
    view = HostSysfs(str(tmp_path / "absent"))
    topo = topology.gpu_nic_paths(view, [(0, "GPU-0", "00000000:18:00.0")])
    assert topo.gpus == () and topo.nics == () and topo.unreadable_gpus == ("GPU-0",)


def test_a_virtio_interface_is_placed_at_its_pci_function(tmp_path: Path) -> None:
    """In a VM, class/net/eth0/device leads to .../0000:00:03.0/virtio0 (virtio-net below its PCI function)."""
    root = tmp_path / "vm"
    function = root / "devices/pci0000:00/0000:00:03.0"
    net = function / "virtio0/net/eth0"
    net.mkdir(parents=True)
    (function / "numa_node").write_text("-1\n")
    os.symlink("../../../virtio0", net / "device")
    (root / "class/net").mkdir(parents=True)
    os.symlink("../../devices/pci0000:00/0000:00:03.0/virtio0/net/eth0", root / "class/net/eth0")
    (root / "bus/pci/devices").mkdir(parents=True)
    os.symlink("../../../devices/pci0000:00/0000:00:03.0", root / "bus/pci/devices/0000:00:03.0")
    topo = topology.gpu_nic_paths(HostSysfs(str(root)), [])
    assert [(pn.nic.device, pn.nic.pci_bus_id, pn.place.root_complex, pn.place.numa_node) for pn in topo.nics] == [
        ("eth0", "0000:00:03.0", "0000:00", -1)]


# --- path rules on their own (the construction of each case is in its arguments) ------------------------------------

def _at(root_complex: str, numa: int, *switches: str) -> topology.Place:
    return topology.Place("0000:ff:00.0", numa, root_complex, switches)


@pytest.mark.parametrize(("a", "b", "expected"), [
    (_at("0000:15", 0, "s1"), _at("0000:15", 0, "s1"), "PIX"),
    (_at("0000:15", 0, "u", "l1"), _at("0000:15", 0, "u", "l2"), "PXB"),
    (_at("0000:15", 0, "u", "l1"), _at("0000:15", 0, "u"), "PXB"),
    (_at("0000:15", 0, "s1"), _at("0000:15", 0, "s2"), "PHB"),
    (_at("0000:15", 0), _at("0000:15", 0, "s1"), "PHB"),
    (_at("0000:15", 0), _at("0000:15", 0), "PHB"),
    (_at("0000:15", 0, "s1"), _at("0000:27", 0, "s2"), "NODE"),
    (_at("0000:15", 0), _at("0000:97", 1), "SYS"),
    (_at("0000:15", -1), _at("0000:27", -1), "SYS"),
    (_at("0000:15", -1), _at("0000:15", -1, "s"), "PHB"),
])
def test_path_rules(a: topology.Place, b: topology.Place, expected: str) -> None:
    assert topology.path(a, b) == topology.path(b, a) == expected


# --- NCCL's variables -------------------------------------------------------------------------------------------

def test_parse_follows_nccls_documented_examples() -> None:
    assert nccl.parse("^=mlx5_1,mlx5_4") == nccl.NameList(True, True, (("mlx5_1", -1), ("mlx5_4", -1)))
    assert nccl.parse("=mlx5_0:1,mlx5_1:1") == nccl.NameList(False, True, (("mlx5_0", 1), ("mlx5_1", 1)))
    assert nccl.parse("=mlx5_0::0:0,mlx5_1::0:1").entries == (("mlx5_0", -1), ("mlx5_1", -1))
    assert nccl.parse("mlx5").entries == (("mlx5", -1),)
    # `^` is read before `=`; empty entries vanish; an entry with no name is skipped; the port is read with atoi
    assert nccl.parse("=^mlx5_1") == nccl.NameList(False, True, (("^mlx5_1", -1),))
    assert nccl.parse(",,mlx5_0,,:1,mlx5_2:1x").entries == (("mlx5_0", -1), ("mlx5_2", 1))
    assert len(nccl.parse(",".join(f"mlx5_{i}" for i in range(40))).entries) == 32


def test_prefixes_exact_names_and_ports() -> None:
    prefix = nccl.parse("mlx5_1")
    assert prefix.allows("mlx5_1", 1) and prefix.allows("mlx5_10", 1) and not prefix.allows("mlx5_2", 1)
    exact = nccl.parse("=mlx5_1")
    assert exact.allows("mlx5_1", 1) and not exact.allows("mlx5_10", 1)
    ports = nccl.parse("=mlx5_0:1")
    assert ports.allows("mlx5_0", 1) and not ports.allows("mlx5_0", 2)
    excluded = nccl.parse("^=mlx5_1,mlx5_4")
    assert not excluded.allows("mlx5_1", 1) and not excluded.allows("mlx5_4", 1) and excluded.allows("mlx5_0", 1)
    ifnames = nccl.parse("^docker")
    assert not ifnames.allows("docker0") and ifnames.allows("eth0")
    assert nccl.parse("^=docker0").allows("docker1") and not nccl.parse("^=docker0").allows("docker0")
    # an empty list matches everything: set but empty allows all, `^` alone excludes all
    assert nccl.parse("").allows("mlx5_0", 1) and not nccl.parse("^").allows("mlx5_0", 1)


def test_which_variables_nccl_reads() -> None:
    assert nccl.lists({"PATH": "/usr/bin"}) == {}
    assert set(nccl.lists({"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "eth"})) == {nccl.IB_HCA, nccl.SOCKET_IFNAME}
    # NCCL reads NCCL_SOCKET_IFNAME only when it is longer than one character
    assert nccl.lists({"NCCL_SOCKET_IFNAME": "e"}) == {}
    assert nccl.allowed({"OMP_NUM_THREADS": "8"}, []) is None


def _hgx(tmp_path: Path) -> tuple[list[Nic], dict[int, list[tuple[str, str]]]]:
    view, built = _tree(tmp_path, "hgx_h100")
    topo = topology.gpu_nic_paths(view, _gpus(built))
    return [pn.nic for pn in topo.nics], {g.index: [(p.device, p.port) for p in g.preferred] for g in topo.gpus}


def test_a_gpu_whose_preferred_nic_is_left_out_of_nccl_ib_hca_is_flagged(tmp_path: Path) -> None:
    nics, preferred = _hgx(tmp_path)
    allowed = nccl.allowed({"NCCL_IB_HCA": "=mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7"}, nics)
    assert allowed is not None
    assert nccl.excluded_preferred(allowed, preferred[0]) == {nccl.IB_HCA: True}
    assert nccl.excluded_preferred(allowed, preferred[1]) == {nccl.IB_HCA: False}
    assert not allowed.usable("mlx5_0", "1") and allowed.usable("mlx5_1", "1")


def test_an_excluding_nccl_ib_hca_flags_only_the_gpu_it_hurts(tmp_path: Path) -> None:
    nics, preferred = _hgx(tmp_path)
    allowed = nccl.allowed({"NCCL_IB_HCA": "^=mlx5_4"}, nics)
    assert allowed is not None
    flagged = {i for i, ports in preferred.items() if nccl.excluded_preferred(allowed, ports)[nccl.IB_HCA]}
    assert flagged == {4}


def test_a_wrong_port_excludes_the_device(tmp_path: Path) -> None:
    nics, preferred = _hgx(tmp_path)
    wrong = nccl.allowed({"NCCL_IB_HCA": "=mlx5_0:2"}, nics)
    right = nccl.allowed({"NCCL_IB_HCA": "=mlx5_0:1"}, nics)
    assert wrong is not None and right is not None
    assert nccl.excluded_preferred(wrong, preferred[0]) == {nccl.IB_HCA: True}
    assert nccl.excluded_preferred(right, preferred[0]) == {nccl.IB_HCA: False}


def test_one_allowed_port_of_a_tie_is_enough(tmp_path: Path) -> None:
    view, built = _tree(tmp_path, "dual_port_tie")
    topo = topology.gpu_nic_paths(view, _gpus(built))
    nics = [pn.nic for pn in topo.nics]
    gpu2 = [(p.device, p.port) for p in {g.index: g for g in topo.gpus}[2].preferred]
    one = nccl.allowed({"NCCL_IB_HCA": "=mlx5_1"}, nics)
    none = nccl.allowed({"NCCL_IB_HCA": "^mlx5_"}, nics)
    assert one is not None and none is not None
    assert nccl.excluded_preferred(one, gpu2) == {nccl.IB_HCA: False}
    assert nccl.excluded_preferred(none, gpu2) == {nccl.IB_HCA: True}


def test_nccl_socket_ifname_does_not_govern_verbs_traffic(tmp_path: Path) -> None:
    nics, preferred = _hgx(tmp_path)
    allowed = nccl.allowed({"NCCL_SOCKET_IFNAME": "=eno1"}, nics)
    assert allowed is not None
    # bootstrap over eno1 while the data goes over verbs on mlx5_0: nothing is excluded
    assert nccl.excluded_preferred(allowed, preferred[0]) == {nccl.SOCKET_IFNAME: False}
    assert allowed.usable("eno1", "") and not allowed.usable("eno2", "") and allowed.usable("mlx5_0", "1")


@pytest.mark.parametrize("off", [{"NCCL_IB_DISABLE": "1"}, {"NCCL_NET": "Socket"}, {"NCCL_IB_DISABLE": "0x1"}])
def test_with_verbs_off_nccl_socket_ifname_governs_rdma_netdevs(tmp_path: Path, off: dict[str, str]) -> None:
    nics, preferred = _hgx(tmp_path)
    eno = nccl.allowed({**off, "NCCL_SOCKET_IFNAME": "=eno1", "NCCL_IB_HCA": "=mlx5_0"}, nics)
    ipoib = nccl.allowed({**off, "NCCL_SOCKET_IFNAME": "ibp"}, nics)
    assert eno is not None and ipoib is not None
    # the socket transport carries the data; NCCL_IB_HCA no longer matters
    assert nccl.excluded_preferred(eno, preferred[0]) == {nccl.IB_HCA: False, nccl.SOCKET_IFNAME: True}
    assert nccl.excluded_preferred(ipoib, preferred[0]) == {nccl.SOCKET_IFNAME: False}


def test_nccl_ib_disable_zero_keeps_verbs(tmp_path: Path) -> None:
    nics, preferred = _hgx(tmp_path)
    allowed = nccl.allowed({"NCCL_IB_DISABLE": "0", "NCCL_SOCKET_IFNAME": "=eno1"}, nics)
    assert allowed is not None
    assert nccl.excluded_preferred(allowed, preferred[0]) == {nccl.SOCKET_IFNAME: False}


def test_on_a_node_without_rdma_nccl_socket_ifname_governs_the_interfaces() -> None:
    eth = [Nic("eth0", ("",), ("eth0",), "0000:18:00.0"), Nic("eth1", ("",), ("eth1",), "0000:97:00.0")]
    preferred = [("eth0", "")]
    excluded = nccl.allowed({"NCCL_SOCKET_IFNAME": "^=eth0"}, eth)
    kept = nccl.allowed({"NCCL_SOCKET_IFNAME": "eth"}, eth)
    assert excluded is not None and kept is not None
    assert nccl.excluded_preferred(excluded, preferred) == {nccl.SOCKET_IFNAME: True}
    assert nccl.excluded_preferred(kept, preferred) == {nccl.SOCKET_IFNAME: False}


def test_a_network_plugin_is_governed_by_neither(tmp_path: Path) -> None:
    nics, preferred = _hgx(tmp_path)
    allowed = nccl.allowed({"NCCL_NET": "AWS Libfabric", "NCCL_IB_HCA": "=mlx5_7", "NCCL_SOCKET_IFNAME": "=eno1"},
                           nics)
    assert allowed is not None
    assert nccl.excluded_preferred(allowed, preferred[0]) == {nccl.IB_HCA: False, nccl.SOCKET_IFNAME: False}
