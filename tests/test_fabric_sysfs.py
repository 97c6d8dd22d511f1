"""The fabric source on sysfs trees built from real layouts (tests/fabric_sysfs/build.py; facts and sources in
tests/fabric_sysfs/PROVENANCE.md): every port, interface, saturation and unreadable-file series it exports is
checked against tests/fabric_sysfs/expected.json, worked out by hand from the fixture files."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from fabric_sysfs.build import LAYOUTS, build

from exporter.core.gpus import NodeGpus
from exporter.sources.fabric.source import FabricSource
from exporter.sources.fabric.sysfs import HostSysfs

EXPECTED = Path(__file__).parent / "fabric_sysfs" / "expected.json"
# topology is another test's business
IGNORED = frozenset({"goodput_fabric_nic_topology_info"})
BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")

Key = tuple[str, tuple[tuple[str, str], ...]]


def _key(name: str, labels: dict[str, str]) -> Key:
    return name, tuple(sorted(labels.items()))


def _show(key: Key) -> str:
    name, labels = key
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


def expected(layout: str) -> dict[Key, Any]:
    rows = json.loads(EXPECTED.read_text())[layout]
    out: dict[Key, Any] = {}
    for name, labels, value, _why in rows:
        key = _key(name, labels)
        assert key not in out, f"expected.json lists {_show(key)} twice"
        out[key] = value
    return out


def exported(source: FabricSource) -> dict[Key, Any]:
    batch = source.collect()
    out: dict[Key, Any] = {}
    for metric, rows in batch.series.items():
        if not metric.name.startswith("goodput_fabric_") or metric.name in IGNORED:
            continue
        for label_values, value in rows:
            key = _key(metric.name, dict(zip(metric.labels, label_values, strict=True)))
            assert key not in out, f"{_show(key)} exported twice"
            out[key] = value
    return out


def source_on(root: Path) -> FabricSource:
    return FabricSource(HostSysfs(str(root)), NodeGpus(), interfaces="")


def diff(got: dict[Key, Any], want: dict[Key, Any]) -> list[str]:
    lines = [f"missing    {_show(k)} (want {want[k]})" for k in sorted(want.keys() - got.keys())]
    lines += [f"unexpected {_show(k)} = {got[k]}" for k in sorted(got.keys() - want.keys())]
    lines += [f"wrong      {_show(k)} = {got[k]}, want {want[k]}"
              for k in sorted(want.keys() & got.keys()) if got[k] != want[k]]
    return lines


def test_expected_covers_every_layout() -> None:
    data = json.loads(EXPECTED.read_text())
    assert set(data) - {"_about"} == set(LAYOUTS)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_exported_value_matches_the_fixture(layout: str, tmp_path: Path) -> None:
    build(layout, tmp_path)
    problems = diff(exported(source_on(tmp_path)), expected(layout))
    assert not problems, f"{layout}:\n" + "\n".join(problems)


def test_layouts_are_small_text_trees(tmp_path: Path) -> None:
    """Each layout is a few KB of small text files, shaped like the host's /sys."""
    for layout in LAYOUTS:
        root = tmp_path / layout
        build(layout, root)
        files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
        assert sum(p.stat().st_size for p in files) < 8192, layout
        assert (root / "class" / "net" / "lo").is_dir() and not (root / "class" / "net" / "lo" / "device").exists()
        for dev in (root / "class" / "infiniband").iterdir():
            pci = (dev / "device").resolve()
            assert dev.is_symlink() and (dev / "device").is_symlink(), dev
            assert pci.is_dir() and BDF.fullmatch(pci.name) and pci.relative_to(root).parts[0] == "devices", pci
            assert (dev / "ports").is_dir()


def _write(root: Path, rel: str, value: int) -> None:
    path = root / rel
    assert path.is_file(), rel  # through the class/ symlink, as the source reads it
    path.write_text(f"{value}\n")


def test_second_collection_reads_the_counters_again(tmp_path: Path) -> None:
    build("mlx5_ib_hdr", tmp_path)
    source = source_on(tmp_path)
    key = _key("goodput_fabric_port_transmit_bytes_total", {"device": "mlx5_0", "port": "1"})
    assert exported(source)[key] == 2880761508848 * 4
    _write(tmp_path, "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data", 2880761508848 + 1_000_000)
    assert exported(source)[key] == (2880761508848 + 1_000_000) * 4


def test_saturating_counter_that_drops_was_reset_not_wrapped(tmp_path: Path) -> None:
    """InfiniBand PortCounters saturate instead of wrapping (counters.py, metrics.py): a legacy 32-bit
    port_xmit_data that goes from near 2^32 to a small value was reset (`perfquery -R`) and is exported as read."""
    build("saturated", tmp_path)
    rel = "class/infiniband/mlx4_0/ports/1/counters/port_xmit_data"
    tx = _key("goodput_fabric_port_transmit_bytes_total", {"device": "mlx4_0", "port": "1"})
    sat = _key("goodput_fabric_port_counter_saturated", {"device": "mlx4_0", "port": "1", "counter": "port_xmit_data"})
    source = source_on(tmp_path)
    assert exported(source)[sat] == 1
    _write(tmp_path, rel, 4294967000)
    got = exported(source)
    assert got[tx] == 4294967000 * 4 and sat not in got
    _write(tmp_path, rel, 1000)
    got = exported(source)
    assert got[tx] == 4000 and sat not in got


def test_wrapping_hw_counter_keeps_counting(tmp_path: Path) -> None:
    """mlx5 queue counters (hw_counters/out_of_sequence, ...) are 32 bits wide (the kernel reads them with
    be32_to_cpu in drivers/infiniband/hw/mlx5/counters.c) and wrap: a drop from the upper half of the range
    to a small value is a wrap and 2^32 is added from then on; any other drop is a reset, exported as read."""
    build("mlx5_roce", tmp_path)
    base = "class/infiniband/mlx5_2/ports/1/hw_counters"
    seq = _key("goodput_fabric_port_retransmission_events_total",
               {"device": "mlx5_2", "port": "1", "counter": "out_of_sequence"})
    rnr = _key("goodput_fabric_port_retransmission_events_total",
               {"device": "mlx5_2", "port": "1", "counter": "rnr_nak_retry_err"})
    source = source_on(tmp_path)
    _write(tmp_path, f"{base}/out_of_sequence", 4294967000)
    assert exported(source)[seq] == 4294967000
    _write(tmp_path, f"{base}/out_of_sequence", 200)
    _write(tmp_path, f"{base}/rnr_nak_retry_err", 5)  # was 27: a reset (driver reload)
    got = exported(source)
    assert got[seq] == 2**32 + 200
    assert got[rnr] == 5
    _write(tmp_path, f"{base}/out_of_sequence", 300)
    assert exported(source)[seq] == 2**32 + 300


def test_64_bit_congestion_counter_that_drops_was_reset(tmp_path: Path) -> None:
    """mlx5's congestion counters (np_cnp_sent, np_ecn_marked_roce_packets, rp_cnp_handled, rp_cnp_ignored) are
    64 bits wide: the kernel reads them with be64_to_cpup from the _high/_low pairs of QUERY_CONG_STATISTICS
    (drivers/infiniband/hw/mlx5/counters.c INIT_CONG_COUNTER, drivers/net/ethernet/mellanox/mlx5/core/lag/lag.c
    mlx5_lag_query_cong_counters). They cannot wrap at 2^32, so any drop is a reset, exported as read."""
    build("mlx5_roce", tmp_path)
    rel = "class/infiniband/mlx5_2/ports/1/hw_counters/np_cnp_sent"
    key = _key("goodput_fabric_port_congestion_packets_total",
               {"device": "mlx5_2", "port": "1", "counter": "np_cnp_sent"})
    source = source_on(tmp_path)
    _write(tmp_path, rel, 3_000_000_000)
    assert exported(source)[key] == 3_000_000_000
    _write(tmp_path, rel, 7)  # reset (driver reload or `rdma statistic` reset)
    assert exported(source)[key] == 7
    _write(tmp_path, rel, 5_000_000_000)  # past 2^32: a 64-bit counter keeps going
    assert exported(source)[key] == 5_000_000_000


def test_efa_counter_that_drops_was_reset(tmp_path: Path) -> None:
    """EFA's hw_counters are 64-bit (u64 in the device's GET_STATS answer, drivers/infiniband/hw/efa): a drop is a
    reset, exported as read."""
    build("efa", tmp_path)
    rel = "class/infiniband/rdmap16s27/ports/1/hw_counters/tx_bytes"
    key = _key("goodput_fabric_port_transmit_bytes_total", {"device": "rdmap16s27", "port": "1"})
    source = source_on(tmp_path)
    _write(tmp_path, rel, 3_000_000_000)
    assert exported(source)[key] == 3_000_000_000
    _write(tmp_path, rel, 5)
    assert exported(source)[key] == 5


def test_unreadable_file_that_heals_comes_back(tmp_path: Path) -> None:
    """A file unreadable in one collection and readable in the next: its series returns and the count drops."""
    build("unreadable", tmp_path)
    source = source_on(tmp_path)
    key = _key("goodput_fabric_port_state", {"device": "mlx5_2", "port": "1"})
    count = _key("goodput_fabric_unreadable_files", {"device": "mlx5_2"})
    got = exported(source)
    assert key not in got and got[count] == 4
    state = tmp_path / "class/infiniband/mlx5_2/ports/1/state"
    shutil.rmtree(state.resolve())  # the directory standing in for the file
    state.write_text("4: ACTIVE\n")
    got = exported(source)
    assert got[key] == 4 and got[count] == 3
