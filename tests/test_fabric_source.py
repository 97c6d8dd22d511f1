"""The fabric source over the simulated fabric (ground truth, faults on a clock the test drives), the counter
bookkeeping, and how the source behaves without a sysfs. Real sysfs layouts are in test_fabric_sysfs.py, the
real /sys/class/net in test_fabric_net.py, the PCI topology in test_fabric_topology.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fabric_pci.build import build as build_pci
from fabric_sysfs.build import build

from exporter.config import load
from exporter.core.exposition import Batch
from exporter.core.gpus import GpuHolder, GpuIdentity, NodeGpus
from exporter.core.source import SourceError
from exporter.sources.fabric import metrics as c
from exporter.sources.fabric.counters import WRAP_32, Wraps
from exporter.sources.fabric.simulated import FLAP_PERIOD, RATE_GBPS, SimulatedFabric
from exporter.sources.fabric.source import FabricSource
from exporter.sources.fabric.sysfs import HostSysfs
from exporter.sources.nvml.simulated import SimulatedGpus, schedule_faults


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fabric(gpus: int = 4) -> tuple[SimulatedFabric, Clock, FabricSource]:
    clock = Clock()
    fabric = SimulatedFabric(SimulatedGpus(gpus).pci_bus_ids(), clock=clock)
    return fabric, clock, FabricSource(fabric, NodeGpus())


def _value(batch: Batch, metric: object, *labels: str) -> float | None:
    for got, value in batch.series.get(metric, []):  # type: ignore[call-overload]
        if got == labels:
            return value
    return None


def test_exported_counters_are_the_simulated_ground_truth_in_bytes() -> None:
    fabric, clock, source = _fabric()
    clock.now += 10.0
    batch = source.collect()
    truth = fabric.ground_truth(1)
    # the simulated port counts 4-octet words, as sysfs does; the source exports bytes
    assert _value(batch, c.PORT_TX_BYTES, "mlx5_1", "1") == truth["port_xmit_data"] * 4
    assert _value(batch, c.PORT_RX_PACKETS, "mlx5_1", "1") == truth["port_rcv_packets"]
    expected_bytes = RATE_GBPS * 1e9 / 8 * 0.25 * 10.0  # TRAFFIC_SHARE of the link for 10 s
    assert _value(batch, c.PORT_TX_BYTES, "mlx5_1", "1") == pytest.approx(expected_bytes, rel=1e-6)
    assert _value(batch, c.PORT_RATE, "mlx5_1", "1") == RATE_GBPS * 1e9 / 8
    assert _value(batch, c.PORT_STATE, "mlx5_1", "1") == 4
    assert _value(batch, c.PORT_INFO, "mlx5_1", "1", "Ethernet", "ens1np0") == 1
    # the netdev behind the RoCE port is read as an interface too, and the management NIC; lo is not
    assert _value(batch, c.IFACE_UP, "ens1np0") == 1
    assert _value(batch, c.IFACE_SPEED, "ens1np0") == RATE_GBPS * 1e9 / 8
    assert {labels[0] for labels, _ in batch.series[c.IFACE_UP]} == {"eno1", *(f"ens{i}np0" for i in range(4))}
    assert c.UNREADABLE not in batch.series


def test_a_link_that_goes_down_reports_state_counter_and_carrier() -> None:
    fabric, clock, source = _fabric()
    before = source.collect()
    fabric.link_down(0)
    clock.now += 5.0
    after = source.collect()
    assert _value(after, c.PORT_STATE, "mlx5_0", "1") == 1
    assert _value(after, c.PORT_PHYS_STATE, "mlx5_0", "1") == 3
    assert _value(after, c.PORT_LINK_DOWNED, "mlx5_0", "1") == _value(before, c.PORT_LINK_DOWNED, "mlx5_0", "1") + 1
    assert _value(after, c.IFACE_UP, "ens0np0") == 0
    assert _value(after, c.IFACE_SPEED, "ens0np0") is None  # no speed while down, and not a read failure
    assert _value(after, c.PORT_TX_BYTES, "mlx5_0", "1") == _value(before, c.PORT_TX_BYTES, "mlx5_0", "1")
    assert c.UNREADABLE not in after.series
    fabric.restore(0)
    clock.now += 1.0
    healed = source.collect()
    assert _value(healed, c.PORT_STATE, "mlx5_0", "1") == 4
    assert _value(healed, c.IFACE_CARRIER_CHANGES, "ens0np0") == 2  # down, then up


def test_a_flapping_link_counts_one_down_per_period() -> None:
    fabric, clock, source = _fabric()
    fabric.link_flap(1)
    clock.now += 3 * FLAP_PERIOD - 0.5
    batch = source.collect()
    assert _value(batch, c.PORT_LINK_DOWNED, "mlx5_1", "1") == 3
    assert _value(batch, c.IFACE_CARRIER_CHANGES, "ens1np0") == 6


def test_errors_congestion_and_a_degraded_link_rise_at_their_rates() -> None:
    fabric, clock, source = _fabric()
    fabric.symbol_errors(2, per_second=10.0)
    fabric.congestion(3, marks_per_second=1000.0)
    fabric.link_degraded(0)
    clock.now += 20.0
    batch = source.collect()
    assert _value(batch, c.PORT_ERRORS, "mlx5_2", "1", "symbol_error") == 200
    assert _value(batch, c.PORT_ERRORS, "mlx5_1", "1", "symbol_error") == 0
    assert _value(batch, c.PORT_CONGESTION, "mlx5_3", "1", "np_ecn_marked_roce_packets") == 20_000
    assert _value(batch, c.PORT_CONGESTION, "mlx5_3", "1", "rp_cnp_handled") == 5_000
    assert _value(batch, c.PORT_RATE, "mlx5_0", "1") == RATE_GBPS / 2 * 1e9 / 8
    assert _value(batch, c.PORT_RATE, "mlx5_1", "1") == RATE_GBPS * 1e9 / 8


def test_a_32_bit_counter_that_wraps_keeps_rising_and_a_reset_is_left_to_prometheus() -> None:
    wraps = Wraps()
    assert wraps.value(("a",), WRAP_32 - 100) == WRAP_32 - 100
    assert wraps.value(("a",), 50) == WRAP_32 + 50  # wrapped: 150 events, not a reset
    assert wraps.value(("a",), 400) == WRAP_32 + 400
    assert wraps.value(("b",), 1_000_000) == 1_000_000
    assert wraps.value(("b",), 10) == 10  # a drop from the lower half is a reset (driver reload)
    wraps.sweep()
    wraps.value(("a",), 500)
    wraps.sweep()  # b was not seen in the last collection: forgotten
    assert wraps.value(("b",), 5) == 5


def test_a_sysfs_without_class_net_marks_the_source_down_with_the_path(tmp_path: object) -> None:
    source = FabricSource(HostSysfs(str(tmp_path)), NodeGpus())
    with pytest.raises(SourceError) as err:
        source.collect()
    assert err.value.reason == "fabric_no_sysfs" and str(tmp_path) in str(err.value)


def test_scheduled_fabric_faults_reach_the_simulated_nic() -> None:
    config = load(None, {"simulate": {"gpus": 2, "faults": [{"at": "1ms", "kind": "link_down", "nic": 1}]}},
                  environ={})
    fabric, _, source = _fabric(2)
    stop = threading.Event()
    schedule_faults(SimulatedGpus(2), config.simulate.faults, stop, fabric).join(5)
    assert _value(source.collect(), c.PORT_STATE, "mlx5_1", "1") == 1


def test_a_fault_on_a_nic_that_is_not_simulated_is_refused() -> None:
    with pytest.raises(Exception, match="NIC 2 is not simulated"):
        load(None, {"simulate": {"gpus": 2, "faults": [{"at": "1s", "kind": "congestion", "nic": 2}]}}, environ={})


@pytest.fixture
def children() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Real processes started with the NCCL variables given (and none of this process's)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(**variables: str) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")} | variables
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_the_simulated_node_has_each_gpu_beside_its_own_nic_and_flags_a_job_kept_off_it(
        children: Callable[..., subprocess.Popen[bytes]]) -> None:
    gpus = SimulatedGpus(4)
    fabric = SimulatedFabric(gpus.pci_bus_ids())
    uuids = [f"GPU-{i}" for i in range(4)]
    table = NodeGpus()
    identities = tuple(GpuIdentity(str(i), uuids[i], bus) for i, bus in enumerate(gpus.pci_bus_ids()))
    off = children(NCCL_IB_HCA="=mlx5_1")  # GPU 0's job told to use GPU 1's NIC only
    on = children(NCCL_IB_HCA="^mlx5_1")  # everything but mlx5_1: GPU 0's own NIC stays usable
    plain = children()  # sets nothing: no verdict
    table.replace({p.pid: (GpuHolder("0", uuids[0], frozenset()),) for p in (off, on, plain)}, identities)
    batch = FabricSource(fabric, table).collect()
    paths = {(labels[0], labels[2]): labels[4] for labels, _ in batch.series[c.GPU_NIC]}
    # by construction (simulated.py): GPU i and NIC i share a switch; GPUs and NICs 0-1 on root complex
    # pci0000:00 (NUMA 0), 2-3 on pci0000:80 (NUMA 1); eno1 straight on pci0000:00
    assert paths[("0", "mlx5_0")] == "PIX" and paths[("3", "mlx5_3")] == "PIX"
    assert paths[("0", "mlx5_1")] == "PHB" and paths[("0", "eno1")] == "PHB"
    assert paths[("0", "mlx5_2")] == "SYS" and paths[("2", "mlx5_0")] == "SYS"
    preferred = {(labels[0], labels[2], labels[3]) for labels, _ in batch.series[c.GPU_PREFERRED_NIC]}
    assert preferred == {(str(i), f"mlx5_{i}", "1") for i in range(4)}
    topo = {labels[0]: labels[3:] for labels, _ in batch.series[c.GPU_TOPOLOGY]}
    assert topo["0"][0] == "0" and topo["3"][0] == "1"  # numa_node
    assert topo["0"][2] == "0000:00" and topo["3"][2] == "0000:80"  # root complex
    excluded = {labels[2]: (labels[3], value) for labels, value in batch.series[c.GPU_NIC_EXCLUDED]}
    assert excluded == {str(off.pid): ("NCCL_IB_HCA", 1), str(on.pid): ("NCCL_IB_HCA", 0)}


# --- odd sysfs contents: each found by review, each kept from coming back --------------------------------------

ROCE_PORT = "class/infiniband/mlx5_2/ports/1"


def _roce(tmp_path: Path) -> tuple[Path, FabricSource]:
    build("mlx5_roce", tmp_path)  # tests/fabric_sysfs: a real mlx5 RoCE layout
    return tmp_path, FabricSource(HostSysfs(str(tmp_path)), NodeGpus())


def _set(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.unlink()
    path.write_text(text + "\n")


def test_a_wrapped_counter_keeps_its_wraps_across_a_failed_read(tmp_path: Path) -> None:
    root, source = _roce(tmp_path)
    counter = f"{ROCE_PORT}/hw_counters/out_of_sequence"
    _set(root, counter, str(WRAP_32 - 100))
    source.collect()
    _set(root, counter, "50")  # wrapped
    assert _value(source.collect(), c.PORT_RETRANSMISSION, "mlx5_2", "1", "out_of_sequence") == WRAP_32 + 50
    (root / counter).unlink()
    (root / counter).mkdir()  # unreadable for one collection
    assert _value(source.collect(), c.PORT_RETRANSMISSION, "mlx5_2", "1", "out_of_sequence") is None
    (root / counter).rmdir()
    (root / counter).write_text("60\n")
    assert _value(source.collect(), c.PORT_RETRANSMISSION, "mlx5_2", "1", "out_of_sequence") == WRAP_32 + 60


def test_an_unreadable_link_layer_leaves_the_info_series_out_rather_than_changing_it(tmp_path: Path) -> None:
    root, source = _roce(tmp_path)
    assert c.PORT_INFO in source.collect().series
    (root / ROCE_PORT / "link_layer").unlink()
    (root / ROCE_PORT / "link_layer").mkdir()
    batch = source.collect()
    assert c.PORT_INFO not in batch.series
    assert _value(batch, c.UNREADABLE, "mlx5_2") == 1 and batch.errors.count("fabric_unreadable_file") == 1


def test_hw_counters_stand_in_only_for_data_counters_the_port_does_not_have(tmp_path: Path) -> None:
    """bnxt_re ports have counters/ and hw_counters/ named tx_bytes: a failed read of counters/port_xmit_data must
    not swap the other counter into the series for a collection."""
    root, source = _roce(tmp_path)
    (root / ROCE_PORT / "hw_counters" / "tx_bytes").write_text("123\n")
    before = _value(source.collect(), c.PORT_TX_BYTES, "mlx5_2", "1")
    assert before is not None and before != 123
    (root / ROCE_PORT / "counters" / "port_xmit_data").unlink()
    (root / ROCE_PORT / "counters" / "port_xmit_data").mkdir()
    assert _value(source.collect(), c.PORT_TX_BYTES, "mlx5_2", "1") is None


def test_odd_interface_names_and_a_symlinked_sysfs_root_keep_the_source_and_topology_up(tmp_path: Path) -> None:
    root = tmp_path / "real"
    root.mkdir()
    built = build_pci("hgx_h100", root)
    (root / "class" / "net" / "eth1²").mkdir()  # a digit Python's isdigit() takes and int() refuses
    link = tmp_path / "sys"
    link.symlink_to(root)
    table = NodeGpus()
    table.replace({}, tuple(GpuIdentity(str(i), f"GPU-{i}", where.pci_bus_id) for i, where in built.gpus.items()))
    batch = FabricSource(HostSysfs(str(link)), table).collect()
    assert "fabric_topology" not in batch.errors and "fabric_unplaced" not in batch.errors
    assert len(batch.series[c.GPU_PREFERRED_NIC]) == len(built.gpus)


def test_a_fault_on_a_nic_the_fabric_lacks_is_logged_and_the_later_faults_still_come() -> None:
    config = load(None, {"simulate": {"gpus": 4, "faults": [
        {"at": "1ms", "kind": "link_down", "nic": 3}, {"at": "2ms", "kind": "congestion", "nic": 0}]}}, environ={})
    fabric = SimulatedFabric(SimulatedGpus(4).pci_bus_ids(), nics=2)  # fewer NICs than the config was checked for
    schedule_faults(SimulatedGpus(4), config.simulate.faults, threading.Event(), fabric).join(5)
    assert fabric.nics[0].ecn_rate > 0
