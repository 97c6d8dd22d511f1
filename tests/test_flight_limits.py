"""The flight source's bounds: all dumps together export at most flight.max_series series, and a parser process
killed while it reads a dump (the OOM killer's SIGKILL) costs a retry, not the dump."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import ManualClock, samples, series, value
from flight_helpers import T0, copy_scenario, nccl_dump, nccl_entry, render, source_for, write_dump

from exporter.config import load
from exporter.sources.flight.source import LOG_LINES_PER_PASS, PARSER_RETRY_AFTER, PARSER_TRIES, FlightSource

FILES = 16
GROUPS = 10_000


def _many_groups(rank: int, groups: int) -> dict[str, object]:
    """A rank's NCCL dump that knows `groups` process groups (pg_config), with a few timed all_reduces on the
    first: its histogram series count too."""
    entries = [nccl_entry(i, i + 1, duration_ms=3.0 * (i + 1)) for i in range(5)]
    return nccl_dump(entries, {"0": (5, 5, 5)},
                     groups={str(g): (f"tp_{g}", [rank, (rank + 1) % FILES]) for g in range(groups)})


def _write_many(root: Path, groups: int = GROUPS) -> list[Path]:
    """FILES dumps, rank r written at T0 + r: rank FILES-1 is the most recent."""
    paths = []
    for rank in range(FILES):
        path = root / "job" / f"nccl_trace_rank_{rank}"
        write_dump(path, _many_groups(rank, groups), T0 + rank)
        paths.append(path)
    return paths


def _series_of(root: Path, rank: int) -> tuple[int, int]:
    """(the series one of the dumps makes, the source's own series), measured on a source with no cap and
    nothing else to read, and on one with nothing at all."""
    alone = root / "alone"
    write_dump(alone / "job" / f"nccl_trace_rank_{rank}", _many_groups(rank, GROUPS), T0)
    source, empty = source_for(alone, max_series=10**7), source_for(root / "empty")
    try:
        own = len(samples(render(empty)))
        return len(samples(render(source))) - own, own
    finally:
        source.close()
        empty.close()


class Parsed:
    """An exposition parsed once (prometheus-client's parser): this one is 100,000 lines long."""

    def __init__(self, text: str) -> None:
        self.samples = samples(text)

    def __len__(self) -> int:
        return len(self.samples)

    def value(self, name: str, **labels: str) -> float | None:
        wanted = set(labels.items())
        found = [v for (n, ls), v in self.samples.items() if n == name and wanted <= ls]
        assert len(found) <= 1, (name, labels)
        return found[0] if found else None

    def ranks(self) -> list[int]:
        return sorted(int(dict(ls)["rank"]) for n, ls in self.samples
                      if n == "goodput_flight_recorder_dump_timestamp_seconds")


def test_the_total_series_cap_holds_over_16_files_of_10000_groups(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    paths = _write_many(tmp_path / "fr")
    source = source_for(tmp_path / "fr")  # the documented default cap
    cap = load(None, None, environ={}).flight.max_series
    per_file, own = _series_of(tmp_path, 0)
    assert per_file * FILES > cap  # uncapped, these dumps would pass the cap many times over
    caplog.set_level(logging.WARNING, logger="exporter.sources.flight.source")
    out = Parsed(render(source))
    assert len(out) <= cap
    assert out.value("goodput_flight_recorder_series") == len(out)  # the source counts what it renders exactly
    fit = out.ranks()
    assert fit and len(fit) == (cap - own) // per_file  # as many files as fit: not one more, not one fewer
    assert fit == list(range(FILES - len(fit), FILES))  # the most recently written win
    left_out = FILES - len(fit)
    assert out.value("goodput_flight_recorder_files") == FILES  # all read, fewer exported
    assert out.value("goodput_flight_recorder_withheld_files") == left_out
    assert out.value("goodput_flight_recorder_rejected_total", reason="too_many_series") == left_out
    logged = [r.getMessage() for r in caplog.records if "(too_many_series)" in r.getMessage()]
    named = {str(p) for p in paths[:left_out] if any(f"rejected {p} " in line for line in logged)}
    assert len(named) == len(logged) == min(left_out, LOG_LINES_PER_PASS)  # each line names one file left out
    if left_out > LOG_LINES_PER_PASS:
        assert any(f"{left_out - LOG_LINES_PER_PASS} more files rejected" in r.getMessage() for r in caplog.records)
    assert all(f"rejected {paths[r]} " not in " ".join(logged) for r in fit)
    # the next pass counts and logs nothing again
    caplog.clear()
    text = render(source)
    assert value(text, "goodput_flight_recorder_rejected_total", reason="too_many_series") == left_out
    assert not [r for r in caplog.records if "too_many_series" in r.getMessage()]
    # the newest gone, the next one in line is exported: its counters were kept meanwhile
    os.unlink(paths[-1])
    after = Parsed(render(source))
    assert after.ranks() == list(range(FILES - len(fit) - 1, FILES - 1))
    assert len(after) <= cap
    assert after.value("goodput_collective_operations_total", workload="job", rank=str(FILES - len(fit) - 1),
                       pg="0", op="all_reduce") == 5
    source.close()


def test_a_dump_too_big_for_the_cap_does_not_starve_the_others(tmp_path: Path) -> None:
    root = tmp_path / "fr"
    for name in ("a", "b"):
        copy_scenario("healthy4", root, name)  # written long ago
    write_dump(root / "huge" / "nccl_trace_rank_0", _many_groups(0, 400), time.time())  # the newest, ~2,000 series
    source = source_for(root, max_series=1_000)
    text = render(source)
    assert len(samples(text)) <= 1_000
    assert value(text, "goodput_flight_recorder_rejected_total", reason="too_many_series") == 1
    assert value(text, "goodput_flight_recorder_withheld_files") == 1
    workloads = {s["workload"] for s in series(text, "goodput_flight_recorder_dump_timestamp_seconds")}
    assert workloads == {"a", "b"}
    assert value(text, "goodput_collective_operations_total", workload="b", rank="3", pg="0", op="all_reduce") == 3
    source.close()


# --- a parser killed mid-parse ----------------------------------------------------------------------------

ENTRIES = 20_000  # a 4 MB dump, about 0.2 s to parse: a kill 20 ms after it is handed over lands mid-parse


def _big_dump(path: Path, entries: int) -> None:
    created = T0 - 100
    write_dump(path, nccl_dump([nccl_entry(i, i + 1, created=created + i * 1e-3) for i in range(entries)],
                               {"0": (entries, entries, entries)}), T0)


class Killer(threading.Thread):
    """kill -9 of the parser process, `times` times, each while it holds a dump (the daemon waits on it)."""

    def __init__(self, source: FlightSource, times: int) -> None:
        super().__init__(daemon=True)
        self.parser = source._parser
        self.times = times
        self.killed: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while len(self.killed) < self.times and not self.stop.is_set():
            pid = self.parser.parsing
            if pid is None:
                time.sleep(0.0005)
                continue
            time.sleep(0.02)  # the dump handed over (4 MB on a socket pair: a few ms), its parse under way
            assert self.parser.parsing == pid, "the parse ended before the kill: make the dump bigger"
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)
            while self.parser.parsing == pid and not self.stop.is_set():  # until the daemon has seen it
                time.sleep(0.0005)


def _source(root: Path, clock: ManualClock) -> FlightSource:
    return FlightSource(load(None, {"flight": {"dir": str(root)}}, environ={}).flight, clock=clock)


def test_a_parser_killed_mid_parse_10_times_loses_no_dump(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    source = _source(tmp_path, clock)
    caplog.set_level(logging.WARNING, logger="exporter.sources.flight.source")
    for round_ in range(10):
        entries = ENTRIES + round_  # each dump its own count, to tell them apart
        _big_dump(tmp_path / "job" / f"nccl_trace_rank_{round_}", entries)
        killer = Killer(source, 1)
        killer.start()
        text = render(source)
        killer.join(10)
        assert len(killer.killed) == 1
        assert value(text, "goodput_flight_recorder_parser_deaths_total") == round_ + 1  # it died mid-parse
        assert value(text, "goodput_flight_recorder_dump_timestamp_seconds", workload="job", rank=str(round_)) is None
        assert value(render(source), "goodput_flight_recorder_parser_deaths_total") == round_ + 1  # not yet again
        clock.advance(PARSER_RETRY_AFTER)
        text = render(source)  # the retry, by a fresh parser process
        assert value(text, "goodput_collective_operations_total", workload="job", rank=str(round_), pg="0",
                     op="all_reduce") == entries
        assert source._parser.pid not in (None, *killer.killed)
    assert value(text, "goodput_flight_recorder_files") == 10
    assert value(text, "goodput_flight_recorder_parser_deaths_total") == 10
    assert value(text, "goodput_flight_recorder_rejected_total", reason="parser_died") == 0
    assert value(text, "goodput_flight_recorder_rejected_total", reason="too_large") == 0
    died = [r.getMessage() for r in caplog.records if "killed by SIGKILL" in r.getMessage()]
    assert len(died) == 10 and all("reading it again" in line for line in died)
    source.close()


def test_a_parser_that_dies_every_time_ends_in_parser_died(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    source = _source(tmp_path, clock)
    path = tmp_path / "job" / "nccl_trace_rank_0"
    _big_dump(path, ENTRIES)
    caplog.set_level(logging.WARNING, logger="exporter.sources.flight.source")
    killer = Killer(source, PARSER_TRIES)
    killer.start()
    wait = PARSER_RETRY_AFTER
    for death in range(1, PARSER_TRIES + 1):
        text = render(source)
        assert value(text, "goodput_flight_recorder_parser_deaths_total") == death
        gave_up = value(text, "goodput_flight_recorder_rejected_total", reason="parser_died")
        assert gave_up == (1 if death == PARSER_TRIES else 0)
        if death < PARSER_TRIES:
            clock.advance(wait * 0.9)  # too soon: the file is left alone
            assert value(render(source), "goodput_flight_recorder_parser_deaths_total") == death
            clock.advance(wait * 0.1)
            wait *= 2  # backing off
    killer.join(10)
    assert len(killer.killed) == PARSER_TRIES
    assert value(text, "goodput_flight_recorder_rejected_total", reason="too_large") == 0
    assert value(text, "goodput_flight_recorder_files") == 0
    (logged,) = [r.getMessage() for r in caplog.records if "(parser_died)" in r.getMessage()]
    assert str(path) in logged and "killed by SIGKILL" in logged
    clock.advance(3600)
    assert value(render(source), "goodput_flight_recorder_parser_deaths_total") == PARSER_TRIES  # given up: no more
    # a new version of the file gets tries of its own, and with the parser left alone it is read
    _big_dump(path, ENTRIES + 1)
    os.utime(path, (T0 + 1, T0 + 1))
    text = render(source)
    assert value(text, "goodput_collective_operations_total", workload="job", rank="0", op="all_reduce") == ENTRIES + 1
    assert value(text, "goodput_flight_recorder_rejected_total", reason="parser_died") == 1
    source.close()


def test_the_parsers_own_memory_limit_is_still_too_large(tmp_path: Path) -> None:
    """The parser that runs out of its own memory says so: too_large at once, no retries."""
    bomb = tmp_path / "evil" / "nccl_trace_rank_0"
    bomb.parent.mkdir()
    bomb.write_bytes(b"\x80\x02Nr\xff\xff\xff\x7f.")  # CPython gh-115952: a 9-byte memo-table bomb
    copy_scenario("healthy2", tmp_path, "good")
    source = source_for(tmp_path)
    text = render(source)
    assert value(text, "goodput_flight_recorder_rejected_total", reason="too_large") == 1
    assert value(text, "goodput_flight_recorder_parser_deaths_total") == 0
    assert value(text, "goodput_collective_operations_total", workload="good", rank="0", op="all_reduce") == 4
    source.close()
