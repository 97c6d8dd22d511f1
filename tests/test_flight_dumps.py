"""The flight source on real dumps written by PyTorch (tests/flight/generate.py, gloo on the CPU)."""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import live_server, quick_config, series, value
from flight_helpers import DUMPS, WRITTEN, copy_scenario, render, source_for
from goodput_client import contract

from exporter.cli import parse_serve_args
from exporter.config import load
from exporter.sources.flight.load import load_bytes
from exporter.sources.flight.schema import parse
from exporter.sources.flight.source import FlightSource

KiB = 1024


def test_a_healthy_run_shows_every_collective_with_its_bytes(tmp_path: Path) -> None:
    copy_scenario("healthy4", tmp_path)
    text = render(source_for(tmp_path))
    # what generate.py's healthy4 ran on every rank, in bytes (float32 4, int64 8, bfloat16 2)
    expected = {
        ("0", "all_reduce"): (3, 1024 * (4 + 8 + 2)),
        ("0", "broadcast"): (1, 256 * 4),
        ("0", "all_gather"): (1, 4 * 16 * 8 * 4),  # the output, 4 ranks x 16x8 floats, is the larger
        ("0", "reduce"): (1, 64 * 4),
        ("0", "barrier"): (1, 0),
    }
    pair = {("1", "all_reduce"): (3, 3 * 512 * 4)}  # the subgroup of ranks 0 and 1
    for rank in ("0", "1", "2", "3"):
        wanted = {**expected, **(pair if rank in ("0", "1") else {})}
        got = {(s["pg"], s["op"]) for s in series(text, "goodput_collective_operations_total") if s["rank"] == rank}
        assert got == set(wanted), rank
        for (pg, op), (count, size) in wanted.items():
            labels = {"workload": "healthy4", "rank": rank, "pg": pg, "op": op}
            assert value(text, "goodput_collective_operations_total", **labels) == count
            assert value(text, "goodput_collective_bytes_total", **labels) == size
        for state in ("enqueued", "completed"):
            assert value(text, "goodput_collective_last_seq", workload="healthy4", rank=rank, pg="0", state=state) == 7
        assert value(text, "goodput_collective_inflight", workload="healthy4", rank=rank, pg="0") == 0
        assert value(text, "goodput_collective_oldest_inflight_seconds", workload="healthy4", rank=rank, pg="0") == 0
        assert value(text, "goodput_collective_group_info", workload="healthy4", rank=rank, pg="0",
                     desc="default_pg") == 1
    # gloo tracks no start: that state is absent rather than a misleading 0 or -1
    assert not [s for s in series(text, "goodput_collective_last_seq") if s["state"] == "started"]
    assert series(text, "goodput_collective_missing_rank") == []
    assert series(text, "goodput_collective_duration_seconds_count") == []  # gloo times nothing
    assert value(text, "goodput_flight_recorder_files") == 4


def test_the_pickle_and_json_forms_of_one_state_read_the_same() -> None:
    for rank in (0, 1):
        fmt_p, from_pickle = load_bytes((DUMPS / "healthy2" / f"nccl_trace_rank_{rank}").read_bytes())
        fmt_j, from_json = load_bytes((DUMPS / "healthy2-json" / f"nccl_trace_rank_{rank}.json").read_bytes())
        assert (fmt_p, fmt_j) == ("pickle", "json")
        # JSON writes pg_status values as strings and absent times as 0; both read to one Dump
        assert isinstance(from_json["pg_status"]["0"]["last_enqueued_collective"], str)
        assert parse(from_pickle) == parse(from_json)
        assert len(parse(from_json).entries) == 6


def test_json_dumps_are_reported_like_pickles(tmp_path: Path) -> None:
    copy_scenario("healthy2-json", tmp_path, "job")
    text = render(source_for(tmp_path))
    for rank in ("0", "1"):
        labels = {"workload": "job", "rank": rank, "pg": "0"}
        assert value(text, "goodput_collective_operations_total", op="all_reduce", **labels) == 4
        assert value(text, "goodput_collective_bytes_total", op="all_reduce", **labels) == 4 * 2048 * 4
        assert value(text, "goodput_collective_bytes_total", op="broadcast", **labels) == 100 * 8
        assert value(text, "goodput_collective_last_seq", state="completed", **labels) == 6


def test_the_hang_shows_in_flight_and_the_missing_rank_in_a_running_daemon(tmp_path: Path) -> None:
    copy_scenario("hang4", tmp_path / "fr")
    config = quick_config(flight={"dir": str(tmp_path / "fr"), "rank_missing_after": "1s"})
    with live_server(config) as live:
        text = live.metrics_when("goodput_collective_missing_rank", 1, workload="hang4", pg="0", rank="1",
                                 seq="6", op="all_reduce")
    assert len(series(text, "goodput_collective_missing_rank")) == 1
    for rank in ("0", "2", "3"):  # blocked in the 6th all_reduce, dumped 2 s into the wait
        labels = {"workload": "hang4", "rank": rank, "pg": "0"}
        assert value(text, "goodput_collective_inflight", **labels) == 1
        assert 1.9 <= value(text, "goodput_collective_oldest_inflight_seconds", **labels) <= 2.5
        assert value(text, "goodput_collective_last_seq", state="enqueued", **labels) == 6
        assert value(text, "goodput_collective_last_seq", state="completed", **labels) == 5
    skipper = {"workload": "hang4", "rank": "1", "pg": "0"}
    assert value(text, "goodput_collective_inflight", **skipper) == 0
    assert value(text, "goodput_collective_last_seq", state="enqueued", **skipper) == 5
    assert value(text, "goodput_exporter_source_up", source="flight") == 1


def test_a_rank_is_not_called_missing_before_the_grace_has_passed(tmp_path: Path) -> None:
    copy_scenario("hang4", tmp_path)
    # every rank dumped 2 s into the hang: with the default 10 s grace nobody is accused yet
    assert series(render(source_for(tmp_path)), "goodput_collective_missing_rank") == []
    text = render(source_for(tmp_path, rank_missing_after="1500ms"))
    assert [s["rank"] for s in series(text, "goodput_collective_missing_rank")] == ["1"]


def test_a_hang_and_a_missing_rank_ask_the_workloads_ranks_for_captures_once(tmp_path: Path) -> None:
    """hang4's real dumps: ranks 0, 2, 3 wait ~2 s in the 6th all_reduce, which rank 1 never enqueued."""
    copy_scenario("hang4", tmp_path)
    asked: list[tuple[str, list[str], str, str]] = []
    source = source_for(tmp_path, rank_missing_after="1500ms", hang_after="1500ms")
    source.on_trouble = lambda workload, ranks, trigger, detail: asked.append((workload, ranks, trigger, detail))
    render(source)
    triggers = sorted((trigger, detail) for _, _, trigger, detail in asked)
    assert [t for t, _ in triggers] == ["hang", "hang", "hang", "rank_missing"], asked
    assert triggers[-1][1] == "rank 1 missing from all_reduce #6 of pg 0"
    assert {detail.split(" waits")[0] for trigger, detail in triggers if trigger == "hang"} == {
        "rank 0", "rank 2", "rank 3"}
    assert all(workload == "hang4" and ranks == ["0", "1", "2", "3"] for workload, ranks, _, _ in asked)
    render(source)  # the same dumps again: already acted on
    assert len(asked) == 4
    # a hang shorter than hang_after is not one; the missing rank still is
    source = source_for(tmp_path, rank_missing_after="1500ms")
    source.on_trouble = lambda workload, ranks, trigger, detail: asked.append((workload, ranks, trigger, detail))
    render(source)
    assert [trigger for _, _, trigger, _ in asked[4:]] == ["rank_missing"]


def with_membership(scenario: str, root: Path, ranks: dict[str, list[int]]) -> Path:
    """Copies of the dumps with pg_config filled in as NCCL records it: gloo leaves it empty, and
    torchfrtrace cannot match collectives without it."""
    target = copy_scenario(scenario, root)
    for path in target.iterdir():
        dump = pickle.loads(path.read_bytes())
        rank = int(path.name.rsplit("_", 1)[1])
        dump["pg_config"] = {pg: {"name": pg, "desc": "default_pg" if pg == "0" else "undefined",
                                  "ranks": str(members)} for pg, members in ranks.items() if rank in members}
        stat = path.stat()
        path.write_bytes(pickle.dumps(dump, protocol=2))
        os.utime(path, (stat.st_atime, stat.st_mtime))
    return target


def torchfrtrace_verdict(directory: Path, out: Path) -> list[tuple[str, int, list[int]]]:
    """Run PyTorch's analyzer; (pg, seq, missing ranks) of every collective it found incomplete."""
    binary = Path(sys.executable).with_name("torchfrtrace")
    result = subprocess.run([str(binary), str(directory), "-o", str(out)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    _, db = pickle.loads(out.read_bytes())  # our own analyzer output, not a dump: plain pickle is fine
    return sorted((c.group_id, c.collective_seq_id, sorted(c.missing_ranks))
                  for c in db.collectives if c.missing_ranks)


def our_verdict(directory: Path) -> list[tuple[str, int, list[int]]]:
    text = render(source_for(directory, rank_missing_after="1s"))
    found: dict[tuple[str, int], list[int]] = {}
    for s in series(text, "goodput_collective_missing_rank"):
        found.setdefault((s["pg"], int(s["seq"])), []).append(int(s["rank"]))
    return sorted((pg, seq, sorted(ranks)) for (pg, seq), ranks in found.items())


def test_the_verdict_on_the_hang_matches_torchfrtrace(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="`make test` installs torch==2.13.0 (CPU)")
    theirs = torchfrtrace_verdict(with_membership("hang4", tmp_path / "hang", {"0": [0, 1, 2, 3]}),
                                  tmp_path / "hang.pkl")
    assert theirs == [("0", 6, [1])]
    assert our_verdict(tmp_path / "hang") == theirs
    plain = tmp_path / "plain"
    copy_scenario("hang4", plain)  # as gloo wrote them, without membership: the same verdict
    assert our_verdict(plain) == theirs
    # and on the healthy run with a subgroup, neither finds anything
    healthy = with_membership("healthy4", tmp_path / "healthy", {"0": [0, 1, 2, 3], "1": [0, 1]})
    assert torchfrtrace_verdict(healthy, tmp_path / "healthy.pkl") == []
    assert our_verdict(healthy) == []


# --- file names: flight.prefixes ---------------------------------------------------------------------


def renamed(scenario: str, root: Path, workload: str, prefix: str) -> Path:
    """The scenario's dumps (written by PyTorch, named nccl_trace_rank_<r> by generate.py) as <prefix><r>."""
    target = copy_scenario(scenario, root, workload)
    for path in sorted(target.iterdir()):
        path.rename(path.with_name(prefix + path.name.removeprefix("nccl_trace_rank_")))
    return target


def read_ranks(text: str, workload: str) -> set[str]:
    return {s["rank"] for s in series(text, "goodput_flight_recorder_dump_timestamp_seconds")
            if s["workload"] == workload}


def test_the_default_prefixes_are_pytorchs_current_and_earlier_names() -> None:
    config = load(None, None, environ={})
    assert config.flight.prefixes == ["comm_lib_trace_rank_", "nccl_trace_rank_"]
    assert config.flight.prefixes == [contract.FLIGHT_DUMP_PREFIX, contract.FLIGHT_DUMP_PREFIX_LEGACY]
    assert config.flight.prefix == ""  # the deprecated alias is unset


def test_both_default_prefixes_are_read_in_a_running_daemon(tmp_path: Path) -> None:
    """Real PyTorch dump contents (tests/flight, from gloo jobs) under PyTorch's current default file name
    (comm_lib_trace_rank_<rank>, as DebugInfoWriter names NCCL's dump on timeout; renamed here, since a
    CPU-only PyTorch writes no dump file of its own) and under the earlier one, read with defaults."""
    root = tmp_path / "fr"
    renamed("healthy2", root, "current", "comm_lib_trace_rank_")
    copy_scenario("healthy2", root, "earlier")  # nccl_trace_rank_<rank>
    mixed = renamed("healthy2", root, "mixed", "comm_lib_trace_rank_")
    (mixed / "comm_lib_trace_rank_1").rename(mixed / "nccl_trace_rank_1")  # one rank per name
    config = quick_config(flight={"dir": str(root)})
    with live_server(config) as live:
        text = live.metrics_when("goodput_flight_recorder_files", 6)
    assert value(text, "goodput_flight_recorder_rejected_total", reason="bad_name") == 0
    for workload in ("current", "earlier", "mixed"):
        assert read_ranks(text, workload) == {"0", "1"}
        for rank in ("0", "1"):
            labels = {"workload": workload, "rank": rank, "pg": "0"}
            assert value(text, "goodput_collective_operations_total", op="all_reduce", **labels) == 4
            assert value(text, "goodput_collective_last_seq", state="completed", **labels) == 6


def test_one_rank_under_both_names_reads_the_newer(tmp_path: Path) -> None:
    job = renamed("healthy2", tmp_path, "job", "comm_lib_trace_rank_")
    older = job / "nccl_trace_rank_0"  # e.g. left by an older client before PyTorch's dump on timeout
    older.write_bytes((DUMPS / "healthy2" / "nccl_trace_rank_1").read_bytes())
    os.utime(older, (WRITTEN["healthy2/nccl_trace_rank_0"] - 60,) * 2)
    source = source_for(tmp_path)
    text = render(source)
    assert value(text, "goodput_flight_recorder_rejected_total", reason="duplicate_rank") == 1
    assert read_ranks(text, "job") == {"0", "1"}
    assert value(text, "goodput_flight_recorder_dump_timestamp_seconds", workload="job", rank="0") == \
        WRITTEN["healthy2/nccl_trace_rank_0"]
    source.close()


def test_a_custom_list_of_prefixes(tmp_path: Path) -> None:
    renamed("healthy2", tmp_path, "a", "trace_")
    renamed("healthy2", tmp_path, "b", "fr-rank-")
    renamed("healthy2", tmp_path, "c", "comm_lib_trace_rank_")  # not in the list now
    # a list in YAML or from Python; comma-separated in the variable and the flag
    via_flags = source_for(tmp_path, prefixes=["trace_", "fr-rank-"])
    # the stored dumps were written long ago: read however old (flight.stale_after 0)
    environ = {"GOODPUT_FLIGHT_DIR": str(tmp_path), "GOODPUT_FLIGHT_PREFIXES": "trace_, fr-rank-",
               "GOODPUT_FLIGHT_STALE_AFTER": "0"}
    via_env = FlightSource(load(None, None, environ=environ).flight)
    via_cli = FlightSource(parse_serve_args(["--flight.dir", str(tmp_path), "--flight.prefixes", "trace_,fr-rank-",
                                             "--flight.stale-after", "0s"], {}).flight)
    for source in (via_flags, via_env, via_cli):
        text = render(source)
        assert read_ranks(text, "a") == read_ranks(text, "b") == {"0", "1"}
        assert read_ranks(text, "c") == set()
        assert value(text, "goodput_flight_recorder_rejected_total", reason="bad_name") == 2
        source.close()


def test_the_deprecated_prefix_is_a_one_element_list(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    renamed("healthy2", tmp_path, "job", "old_rank_")
    renamed("healthy2", tmp_path, "other", "comm_lib_trace_rank_")
    environ = {"GOODPUT_FLIGHT_DIR": str(tmp_path), "GOODPUT_FLIGHT_PREFIX": "old_rank_",
               "GOODPUT_FLIGHT_STALE_AFTER": "0"}  # the stored dumps were written long ago
    for config in (load(None, {"flight": {"dir": str(tmp_path), "prefix": "old_rank_", "stale_after": 0}}, environ={}),
                   load(None, None, environ=environ),
                   parse_serve_args(["--flight.dir", str(tmp_path), "--flight.prefix", "old_rank_",
                                     "--flight.stale-after", "0"], {})):
        assert config.flight.prefixes == ["old_rank_"]
        caplog.clear()
        caplog.set_level(logging.WARNING, logger="exporter.sources.flight.source")
        source = FlightSource(config.flight)
        warned = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
        assert len(warned) == 1 and "flight.prefixes" in warned[0] and "old_rank_<rank>" in warned[0]
        text = render(source)
        assert read_ranks(text, "job") == {"0", "1"} and read_ranks(text, "other") == set()
        source.close()
    # the same list given both ways is no conflict
    both = load(None, {"flight": {"prefix": "old_rank_", "prefixes": ["old_rank_"]}}, environ={})
    assert both.flight.prefixes == ["old_rank_"]


def test_the_longest_prefix_that_fits_wins(tmp_path: Path) -> None:
    good = (DUMPS / "healthy2" / "nccl_trace_rank_0").read_bytes()
    job = tmp_path / "job"
    job.mkdir()
    for name in ("dump12", "dump5", "dump1.json"):
        (job / name).write_bytes(good)
    for prefixes in (["dump", "dump1"], ["dump1", "dump"]):  # in either order
        source = source_for(tmp_path, prefixes=prefixes)
        text = render(source)
        # dump12 is dump1 + rank 2, not dump + rank 12; dump5 fits only dump; in dump1.json the
        # longer dump1 leaves no rank, so it is dump + rank 1
        assert read_ranks(text, "job") == {"2", "5", "1"}
        assert value(text, "goodput_flight_recorder_rejected_total", reason="bad_name") == 0
        source.close()


def test_gloo_names_the_members_of_its_only_group_under_an_empty_key() -> None:
    """Gloo keeps one pg_config entry, keyed '', with the ranks of the last group it registered: the default group's
    members in a job that has no other group; in one with a subgroup, which group they belong to cannot be told."""
    hang = parse(load_bytes((DUMPS / "hang4" / "nccl_trace_rank_2").read_bytes())[1])
    assert hang.groups["0"].ranks == {0, 1, 2, 3}
    healthy = parse(load_bytes((DUMPS / "healthy4" / "nccl_trace_rank_0").read_bytes())[1])
    assert set(healthy.groups) == {"0", "1"} and [g.ranks for g in healthy.groups.values()] == [None, None]


def test_a_workload_whose_dumps_stay_after_it_ended_loses_its_flight_series_within_the_window(tmp_path: Path) -> None:
    """The dumps of a job that ended stay in flight.dir; once none of them was rewritten within flight.stale_after, the
    job's flight series (the missing rank included) end, though the files are still there; a file written again is
    read again."""
    from conftest import ManualClock

    folder = copy_scenario("hang4", tmp_path)
    last_written = max(WRITTEN[f"hang4/{f.name}"] for f in folder.iterdir())
    clock = ManualClock(last_written + 1)
    config = load(None, {"flight": {"dir": str(tmp_path), "stale_after": "30s", "rank_missing_after": "1s"}},
                  environ={}).flight
    source = FlightSource(config, clock=clock)
    try:
        text = render(source)
        assert len(series(text, "goodput_flight_recorder_dump_timestamp_seconds")) == 4
        assert [s["rank"] for s in series(text, "goodput_collective_missing_rank")] == ["1"]
        clock.advance(25)  # within the window: still there
        assert len(series(render(source), "goodput_collective_last_seq")) == 8
        clock.advance(10)  # every dump is now older than 30 s
        text = render(source)
        flight_series = [name for name in ("goodput_flight_recorder_dump_timestamp_seconds",
                                           "goodput_collective_last_seq", "goodput_collective_missing_rank",
                                           "goodput_collective_operations_total", "goodput_collective_inflight")
                         if series(text, name)]
        assert flight_series == [] and value(text, "goodput_flight_recorder_files") == 0
        assert len(list(folder.iterdir())) == 4  # the files stay where they are
        os.utime(folder / "nccl_trace_rank_3", (clock.now, clock.now))  # rank 3 writes again
        text = render(source)
        assert [s["rank"] for s in series(text, "goodput_flight_recorder_dump_timestamp_seconds")] == ["3"]
    finally:
        source.close()


def test_a_rank_whose_process_ended_loses_its_flight_series_at_once(tmp_path: Path) -> None:
    """At the default flight.stale_after: the real dumps of a hung 4-rank gloo job, each rank a real process that
    declared itself to the ingest state as the events socket's peer. A rank whose process exits (killed, not yet
    reaped: a zombie) loses its flight series at the next collection, its dump still fresh; one that sends its
    `end` keeps them ENDED_GRACE, as its other series; a dump written after that (the rank started again) is read
    again; the others keep theirs."""
    import time

    from exporter.sources.ingest.models import LifecycleEvent, PhaseEvent
    from exporter.sources.ingest.state import ENDED_GRACE, IngestState

    folder = copy_scenario("hang4", tmp_path)
    now = time.time()
    for dump in folder.iterdir():
        os.utime(dump, (now - 1, now - 1))  # written a second ago: fresh within the default stale_after
    clock = [time.time()]
    state = IngestState(8, 8, 600.0, clock=lambda: clock[0])
    source = FlightSource(load(None, {"flight": {"dir": str(tmp_path), "rank_missing_after": "1s"}},
                               environ={}).flight)
    source.rank_ends = state.rank_ends
    ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(4)]

    def lifecycle(rank: int, event: str) -> None:
        state.apply([LifecycleEvent(type="lifecycle", workload="hang4", rank=rank, event=event)],
                    peer_pid=ranks[rank].pid)

    def dumped(text: str) -> list[str]:
        return sorted(s["rank"] for s in series(text, "goodput_flight_recorder_dump_timestamp_seconds"))

    try:
        for rank in range(4):
            lifecycle(rank, "start")
        text = render(source)
        assert dumped(text) == ["0", "1", "2", "3"]
        assert [s["rank"] for s in series(text, "goodput_collective_missing_rank")] == ["1"]
        ranks[3].kill()  # not waited for: a zombie until the finally below reaps it
        deadline = time.monotonic() + 10
        while dumped(text := render(source)) != ["0", "1", "2"]:
            assert time.monotonic() < deadline, text
            time.sleep(0.05)
        assert {s["rank"] for s in series(text, "goodput_collective_last_seq")} == {"0", "1", "2"}
        assert value(text, "goodput_flight_recorder_files") == 3
        lifecycle(2, "end")  # its process still runs: the end it reported is enough, after the grace
        assert dumped(render(source)) == ["0", "1", "2"]
        clock[0] += ENDED_GRACE
        assert dumped(render(source)) == ["0", "1"]
        later = state.rank_ends()[("hang4", "3")] + 0.5  # a file's time is the kernel's coarser clock: not `now`
        os.utime(folder / "nccl_trace_rank_3", (later, later))  # rank 3 started again and wrote a dump
        assert dumped(render(source)) == ["0", "1", "3"]
        assert state.rank_ends().keys() == {("hang4", "2"), ("hang4", "3")}
        ranks[3].wait()
        ranks[3] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        state.apply([PhaseEvent(type="phase", workload="hang4", rank=3, phase="compute", seconds=1.0)],
                    peer_pid=ranks[3].pid)  # another process reports for rank 3: the end was the other one's
        assert state.rank_ends().keys() == {("hang4", "2")}
        lifecycle(2, "restart")  # rank 2 goes on: its old dump is read again only once it is rewritten
        assert ("hang4", "2") not in state.rank_ends() and dumped(render(source)) == ["0", "1", "3"]
        os.utime(folder / "nccl_trace_rank_2", None)
        assert dumped(render(source)) == ["0", "1", "2", "3"]
    finally:
        for process in ranks:
            process.kill()
            process.wait()
        source.close()


def test_a_retired_collective_is_not_in_flight_when_pg_status_lags_behind_it(tmp_path: Path) -> None:
    """gloo, PyTorch 2.13: a dump taken as the job closed, its last all_reduce retired and pg_status one behind
    (tests/flight/caught/README.md). The op completed: no collective in flight, none missing."""
    caught = DUMPS.parent / "caught" / "gloo-status-lag"
    raw = pickle.loads((caught / "comm_lib_trace_rank_0").read_bytes())
    assert raw["pg_status"]["0"]["last_completed_collective"] == 24 and all(e["retired"] for e in raw["entries"])
    assert raw["entries"][-1]["collective_seq_id"] == 25
    target = tmp_path / "fr" / "closing"
    target.mkdir(parents=True)
    for rank in (0, 1):
        (target / f"comm_lib_trace_rank_{rank}").write_bytes((caught / f"comm_lib_trace_rank_{rank}").read_bytes())
    text = render(source_for(tmp_path / "fr"))
    for rank in ("0", "1"):
        labels = {"workload": "closing", "rank": rank, "pg": "0"}
        assert value(text, "goodput_collective_inflight", **labels) == 0
        assert value(text, "goodput_collective_oldest_inflight_seconds", **labels) == 0
        assert value(text, "goodput_collective_last_seq", state="completed", **labels) == 25
        assert value(text, "goodput_collective_last_seq", state="enqueued", **labels) == 25
    assert series(text, "goodput_collective_missing_rank") == []
