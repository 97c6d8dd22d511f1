"""NCCL-shaped dumps, built to PyTorch's FlightRecorder schema: the fields gloo leaves empty (started
and completed states, discovery times, duration_ms, pg_config membership, point-to-point ops)."""

from __future__ import annotations

from pathlib import Path

from conftest import series, value
from flight_helpers import T0, nccl_dump, nccl_entry, render, source_for, write_dump


def test_each_nccl_field_maps_to_its_metric(tmp_path: Path) -> None:
    entries = [
        nccl_entry(0, 1, duration_ms=2.5),  # 1024 float32, 2.5 ms
        nccl_entry(1, 2, "all_gather", input_sizes=[[256]], output_sizes=[[4, 256]], dtype="BFloat16",
                   duration_ms=40.0),
        nccl_entry(2, 1, "send", p2p=True, peer=" 0->1", input_sizes=[[8, 8]], dtype="Double", duration_ms=0.5),
        nccl_entry(3, 3, state="started", retired=False, created=T0 - 30),  # in flight 30 s at the dump
        nccl_entry(4, 4, "broadcast", state="scheduled", retired=False, created=T0 - 5, dtype="Long"),
        nccl_entry(5, 2, "recv", p2p=True, peer=" 1->0", state="scheduled", retired=False, created=T0 - 12,
                   input_sizes=[[16]]),
    ]
    write_dump(tmp_path / "job" / "nccl_trace_rank_0", nccl_dump(entries, {"0": (4, 3, 2)}), written=T0)
    text = render(source_for(tmp_path))
    rank = {"workload": "job", "rank": "0"}
    pg = {**rank, "pg": "0"}
    # pg_status -> last_seq by state (NCCL tracks starts too)
    for state, seq in (("enqueued", 4), ("started", 3), ("completed", 2)):
        assert value(text, "goodput_collective_last_seq", state=state, **pg) == seq
    # state / retired / pg_status -> in flight: collectives 3 and 4, and the unfinished recv
    assert value(text, "goodput_collective_inflight", **pg) == 3
    # time_created_ns of the oldest in-flight entry against the dump's write time
    assert abs(value(text, "goodput_collective_oldest_inflight_seconds", **pg) - 30.0) < 1e-6
    assert value(text, "goodput_flight_recorder_dump_timestamp_seconds", **rank) == T0
    # profiling_name -> op (backend prefix and peers dropped); sizes x dtype width -> bytes
    expected = {"all_reduce": (2, 2 * 1024 * 4), "all_gather": (1, 4 * 256 * 2), "send": (1, 64 * 8),
                "broadcast": (1, 1024 * 8), "recv": (1, 16 * 4)}
    assert {s["op"] for s in series(text, "goodput_collective_operations_total")} == set(expected)
    for op, (count, size) in expected.items():
        assert value(text, "goodput_collective_operations_total", op=op, **pg) == count
        assert value(text, "goodput_collective_bytes_total", op=op, **pg) == size
    # duration_ms -> the histogram, in seconds; entries without a duration are not observed
    hist = "goodput_collective_duration_seconds"
    assert value(text, f"{hist}_count", op="all_reduce", **pg) == 1
    assert value(text, f"{hist}_sum", op="all_reduce", **pg) == 0.0025
    assert value(text, f"{hist}_bucket", op="all_reduce", le="0.001", **pg) == 0
    assert value(text, f"{hist}_bucket", op="all_reduce", le="0.005", **pg) == 1
    assert value(text, f"{hist}_sum", op="all_gather", **pg) == 0.04
    assert value(text, f"{hist}_bucket", op="all_gather", le="0.01", **pg) == 0
    assert value(text, f"{hist}_bucket", op="all_gather", le="0.05", **pg) == 1
    assert value(text, f"{hist}_count", op="send", **pg) == 1
    assert value(text, f"{hist}_count", op="broadcast", **pg) is None
    # pg_config -> the group's description
    assert value(text, "goodput_collective_group_info", desc="default_pg", **pg) == 1


def test_coalesced_ops_are_finished_when_the_group_says_so(tmp_path: Path) -> None:
    # ops inside a coalescing group share one sequence number and are never retired one by one
    coalesced = [nccl_entry(i, 7, "all_reduce_coalesced", state="scheduled", retired=False) for i in range(3)]
    write_dump(tmp_path / "nccl_trace_rank_2", nccl_dump(coalesced, {"0": (7, 7, 7)}), written=T0)
    text = render(source_for(tmp_path))
    assert value(text, "goodput_collective_inflight", workload="default", rank="2", pg="0") == 0
    assert value(text, "goodput_collective_operations_total", workload="default", rank="2", pg="0",
                 op="all_reduce_coalesced") == 3


def test_pg_config_membership_finds_a_rank_that_never_joined(tmp_path: Path) -> None:
    tp = {"5": ("tp", [0, 1, 2]), "0": ("default_pg", [0, 1, 2])}
    waiting = [nccl_entry(0, 1, pg=("5", "tp"), pg_id=5, state="started", retired=False, created=T0 - 60)]
    for rank in (0, 1):
        write_dump(tmp_path / "job" / f"nccl_trace_rank_{rank}", nccl_dump(waiting, {"5": (1, 1, 0)}, tp), T0)
    # rank 2 is a member by pg_config, but its dump shows it never enqueued anything on the group
    write_dump(tmp_path / "job" / "nccl_trace_rank_2", nccl_dump([], {}, tp), T0)
    text = render(source_for(tmp_path))
    assert series(text, "goodput_collective_missing_rank") == [
        {"workload": "job", "pg": "5", "rank": "2", "seq": "1", "op": "all_reduce"}]


def test_a_rank_whose_dump_is_older_is_not_accused(tmp_path: Path) -> None:
    source = source_for(tmp_path)
    stuck = [nccl_entry(0, 1), nccl_entry(1, 2, state="started", retired=False, created=T0 - 20)]
    write_dump(tmp_path / "job" / "nccl_trace_rank_0", nccl_dump(stuck, {"0": (2, 2, 1)}), T0)
    behind = nccl_dump([nccl_entry(0, 1)], {"0": (1, 1, 1)})
    # rank 1 last dumped before rank 0 even enqueued seq 2: it is not known to be missing
    write_dump(tmp_path / "job" / "nccl_trace_rank_1", behind, T0 - 25)
    assert series(render(source), "goodput_collective_missing_rank") == []
    # its next dump, written well after, still shows no seq 2: now it is
    write_dump(tmp_path / "job" / "nccl_trace_rank_1", behind, T0)
    assert [s["rank"] for s in series(render(source), "goodput_collective_missing_rank")] == ["1"]
    # and once it catches up, the series is gone
    caught_up = nccl_dump([nccl_entry(0, 1), nccl_entry(1, 2)], {"0": (2, 2, 2)})
    write_dump(tmp_path / "job" / "nccl_trace_rank_1", caught_up, T0 + 1)
    write_dump(tmp_path / "job" / "nccl_trace_rank_0", caught_up, T0 + 1)
    assert series(render(source), "goodput_collective_missing_rank") == []


def test_successive_dumps_count_each_op_once(tmp_path: Path) -> None:
    path = tmp_path / "job" / "nccl_trace_rank_0"
    source = source_for(tmp_path)
    labels = {"workload": "job", "rank": "0", "pg": "0", "op": "all_reduce"}

    def dump(first: int, last: int, written: float, created: float = T0 - 100) -> None:
        entries = [nccl_entry(i, i + 1, duration_ms=1.0, created=created + i) for i in range(first, last + 1)]
        write_dump(path, nccl_dump(entries, {"0": (last + 1, last + 1, last + 1)}), written)

    dump(0, 9, T0)
    text = render(source)
    assert value(text, "goodput_collective_operations_total", **labels) == 10
    dump(5, 19, T0 + 1)  # the ring buffer moved on; 5..9 were seen already
    text = render(source)
    assert value(text, "goodput_collective_operations_total", **labels) == 20
    assert value(text, "goodput_collective_duration_seconds_count", **labels) == 20
    assert value(text, "goodput_flight_recorder_entries_lost_total", workload="job", rank="0") == 0
    assert render(source) == text  # an unchanged file changes nothing
    dump(40, 49, T0 + 2)  # 20..39 left the buffer between two reads
    text = render(source)
    assert value(text, "goodput_collective_operations_total", **labels) == 30
    assert value(text, "goodput_flight_recorder_entries_lost_total", workload="job", rank="0") == 20
    dump(0, 4, T0 + 3, created=T0 + 2.5)  # a new process: record ids start again
    text = render(source)
    assert value(text, "goodput_collective_operations_total", **labels) == 5
    assert value(text, "goodput_collective_duration_seconds_count", **labels) == 5


def test_a_vanished_dump_takes_its_series_along(tmp_path: Path) -> None:
    path = tmp_path / "job" / "nccl_trace_rank_3"
    write_dump(path, nccl_dump([nccl_entry(0, 1)], {"0": (1, 1, 1)}), T0)
    source = source_for(tmp_path)
    assert value(render(source), "goodput_collective_operations_total", rank="3", op="all_reduce") == 1
    path.unlink()
    text = render(source)
    assert series(text, "goodput_collective_operations_total") == []
    assert value(text, "goodput_flight_recorder_files") == 0


def test_a_duration_on_a_bucket_bound_falls_in_that_bucket(tmp_path: Path) -> None:
    write_dump(tmp_path / "nccl_trace_rank_0", nccl_dump([nccl_entry(0, 1, duration_ms=1.0)], {"0": (1, 1, 1)}), T0)
    text = render(source_for(tmp_path))
    labels = {"workload": "default", "rank": "0", "pg": "0", "op": "all_reduce"}
    assert value(text, "goodput_collective_duration_seconds_bucket", le="0.001", **labels) == 1


def test_a_stale_dump_neither_hides_a_hang_nor_is_accused(tmp_path: Path) -> None:
    job = tmp_path / "job"
    # rank 0: a process that died long ago, its dump left behind mid-collective 50
    old = nccl_dump([nccl_entry(49, 50, state="started", retired=False, created=T0 - 10_000)], {"0": (50, 50, 49)})
    write_dump(job / "nccl_trace_rank_0", old, T0 - 9_990)
    # ranks 1 and 2 wait in collective 5000 for a minute; rank 3 never enqueued it
    waiting = nccl_dump([nccl_entry(4999, 5000, state="started", retired=False, created=T0 - 60)],
                        {"0": (5000, 5000, 4999)})
    write_dump(job / "nccl_trace_rank_1", waiting, T0)
    write_dump(job / "nccl_trace_rank_2", waiting, T0)
    write_dump(job / "nccl_trace_rank_3", nccl_dump([nccl_entry(4998, 4999)], {"0": (4999, 4999, 4999)}), T0)
    text = render(source_for(tmp_path))
    assert series(text, "goodput_collective_missing_rank") == [
        {"workload": "job", "pg": "0", "rank": "3", "seq": "5000", "op": "all_reduce"}]


def test_a_rank_whose_file_changes_name_keeps_its_counters(tmp_path: Path) -> None:
    source = source_for(tmp_path)
    entries = [nccl_entry(i, i + 1) for i in range(10)]
    write_dump(tmp_path / "job" / "nccl_trace_rank_0", nccl_dump(entries, {"0": (10, 10, 10)}), T0)
    labels = {"workload": "job", "rank": "0", "op": "all_reduce"}
    assert value(render(source), "goodput_collective_operations_total", **labels) == 10
    (tmp_path / "job" / "nccl_trace_rank_0").unlink()
    more = entries + [nccl_entry(i, i + 1) for i in range(10, 15)]
    write_dump(tmp_path / "job" / "nccl_trace_rank_0.json", nccl_dump(more, {"0": (15, 15, 15)}), T0 + 1, "json")
    assert value(render(source), "goodput_collective_operations_total", **labels) == 15
