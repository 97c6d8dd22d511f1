"""Bad dumps: each is rejected, counted once by reason and logged once; good dumps keep being read."""

from __future__ import annotations

import json
import logging
import os
import pickle
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import live_server, quick_config, series, value
from flight_helpers import DUMPS, T0, copy_scenario, nccl_dump, nccl_entry, render, source_for, write_dump

from exporter.cli import parse_serve_args
from exporter.config import ConfigError, load
from exporter.sources.flight.source import LOG_LINES_PER_PASS

GOOD = (DUMPS / "healthy2" / "nccl_trace_rank_0").read_bytes()
OLD = T0  # long ago: a broken file this old is not still being written


class RunsCode:
    """A pickle payload that would create `marker` if anything executed it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def _bytes(data: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data)


def _sparse_gigabyte(path: Path) -> None:
    with path.open("wb") as handle:
        handle.truncate(2**30)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _symlink(path: Path) -> None:
    target = path.with_name("elsewhere")
    target.mkdir()
    (target / "real").write_bytes(GOOD)
    path.symlink_to(target / "real")


def _socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))  # the file stays after the socket is closed


def _directory(path: Path) -> None:
    path.mkdir()


CASES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "empty": ("empty", _bytes(b"")),
    "truncated": ("truncated", _bytes(GOOD[: len(GOOD) // 2])),
    "random bytes": ("corrupt", _bytes(b"\x00" + bytes(range(256)) * 64)),
    "garbage between a pickle header and its end": ("corrupt", _bytes(b"\x80\x02" + b"\xff" * 300 + b".")),
    "json of the wrong shape": ("bad_schema", _bytes(json.dumps(
        {"version": "2.10", "entries": [{"record_id": "seven"}]}).encode())),
    "json that ends early": ("truncated", _bytes(b'{"version": "2.10", "entries": [')),
    "a pickle of a list": ("bad_schema", _bytes(pickle.dumps([1, 2, 3], protocol=2))),
    "an entry without sizes": ("bad_schema", _bytes(pickle.dumps(
        {"version": "2.10", "entries": [{k: v for k, v in nccl_entry(0, 1).items() if k != "input_sizes"}]}))),
    "version 3": ("unknown_version", _bytes(pickle.dumps(nccl_dump([], {}) | {"version": "3.0"}))),
    "version 1.4": ("unknown_version", _bytes(pickle.dumps(nccl_dump([], {}) | {"version": "1.4"}))),
    "no version": ("unknown_version", _bytes(pickle.dumps({"entries": []}))),
    "1 GB": ("too_large", _sparse_gigabyte),
    # 9 bytes that make CPython's C unpickler size its memo table for 2**31 objects (gh-115952)
    "a memo-table bomb": ("too_large", _bytes(b"\x80\x02Nr\xff\xff\xff\x7f.")),
    "a 5000-digit version": ("unknown_version", _bytes(pickle.dumps({"version": 10**5000}, protocol=2))),
    "a 5000-digit JSON number": ("corrupt", _bytes(b'{"version": 1' + b"0" * 5000 + b"}")),
    "a creation time past 2**63": ("bad_schema", _bytes(pickle.dumps(
        nccl_dump([nccl_entry(0, 1) | {"time_created_ns": 10**30}], {}), protocol=2))),
    "a 400-digit duration": ("bad_schema", _bytes(pickle.dumps(
        nccl_dump([nccl_entry(0, 1) | {"duration_ms": 10**400}], {}), protocol=2))),
    "a shape of strings": ("bad_schema", _bytes(pickle.dumps(  # would be a 4 GB string if multiplied
        nccl_dump([nccl_entry(0, 1, input_sizes=[["x", 4_000_000_000]])], {}), protocol=2))),
    "json cut inside a string": ("truncated", _bytes(
        json.dumps(nccl_dump([nccl_entry(0, 1)], {})).split("nccl:all_reduce")[0].encode() + b"nccl:al")),
    "a fifo": ("not_regular", _fifo),
    "a socket": ("not_regular", _socket),
    "a directory": ("not_regular", _directory),
    "a symlink": ("symlink", _symlink),
}
# what the log says each one is: its true nature, not a guess
KINDS = {"a fifo": "a FIFO (named pipe)", "a socket": "a socket", "a directory": "a directory",
         "a symlink": "a symbolic link"}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_dump_is_counted_once_and_logged_once(case: str, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    reason, make = CASES[case]
    copy_scenario("healthy2", tmp_path, "good")
    bad = tmp_path / "bad" / "nccl_trace_rank_0"
    bad.parent.mkdir()
    make(bad)
    if bad.exists() and not bad.is_symlink():
        os.utime(bad, (OLD, OLD))
    source = source_for(tmp_path)
    caplog.set_level(logging.WARNING, logger="exporter.sources.flight.source")
    for _ in range(3):
        text = render(source)
    assert value(text, "goodput_flight_recorder_rejected_total", reason=reason) == 1
    assert sum(value(text, "goodput_flight_recorder_rejected_total", reason=r["reason"])
               for r in series(text, "goodput_flight_recorder_rejected_total")) == 1
    logged = [r.getMessage() for r in caplog.records if str(bad) in r.getMessage()]
    assert len(logged) == 1 and f"({reason})" in logged[0]
    if case in KINDS:
        assert KINDS[case] in logged[0]
        assert [kind for kind in KINDS.values() if kind in logged[0]] == [KINDS[case]]
    # the good workload is still read, and the bad one reports nothing
    assert value(text, "goodput_collective_operations_total", workload="good", rank="0", pg="0",
                 op="all_reduce") == 4
    assert not [s for s in series(text, "goodput_flight_recorder_dump_timestamp_seconds") if s["workload"] == "bad"]


def test_a_pickle_that_tries_to_run_code_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "it-ran"
    for i, payload in enumerate([RunsCode(marker), {"version": "2.10", "entries": [RunsCode(marker)]}]):
        data = pickle.dumps(payload, protocol=2)
        assert b"system" in data  # the payload really names os.system
        write_dump(tmp_path / "evil" / f"nccl_trace_rank_{i}", {}, OLD)
        (tmp_path / "evil" / f"nccl_trace_rank_{i}").write_bytes(data)
    text = render(source_for(tmp_path))
    assert value(text, "goodput_flight_recorder_rejected_total", reason="unsafe") == 2
    assert not marker.exists()
    pickle.loads(pickle.dumps(RunsCode(marker)))  # the control: plain pickle.loads does run it
    assert marker.exists()


def test_a_half_written_dump_is_retried_not_counted(tmp_path: Path) -> None:
    path = tmp_path / "job" / "nccl_trace_rank_0"
    path.parent.mkdir()
    path.write_bytes(GOOD[:100])  # a writer without a rename, caught mid-write (mtime: now)
    source = source_for(tmp_path)
    text = render(source)
    assert value(text, "goodput_flight_recorder_rejected_total", reason="truncated") == 0
    assert value(text, "goodput_flight_recorder_files") == 0
    path.write_bytes(GOOD)  # the write completes
    text = render(source)
    assert sum(value(text, "goodput_flight_recorder_rejected_total", **s)
               for s in series(text, "goodput_flight_recorder_rejected_total")) == 0
    assert value(text, "goodput_collective_operations_total", workload="job", rank="0", op="all_reduce") == 4


def test_a_broken_new_version_keeps_the_last_good_dump(tmp_path: Path) -> None:
    copy_scenario("healthy2", tmp_path, "job")
    source = source_for(tmp_path)
    before = render(source)
    path = tmp_path / "job" / "nccl_trace_rank_1"
    path.write_bytes(b"\x80\x02" + b"\xff" * 300 + b".")
    os.utime(path, (OLD, OLD))
    after = render(source)
    labels = {"workload": "job", "rank": "1", "pg": "0", "op": "all_reduce"}
    assert value(after, "goodput_collective_operations_total", **labels) == 4
    assert value(after, "goodput_flight_recorder_rejected_total", reason="corrupt") == 1
    assert value(before, "goodput_flight_recorder_dump_timestamp_seconds", workload="job", rank="1") == \
        value(after, "goodput_flight_recorder_dump_timestamp_seconds", workload="job", rank="1")


def test_names_that_do_not_follow_the_pattern(tmp_path: Path) -> None:
    copy_scenario("healthy2", tmp_path, "job")
    (tmp_path / "job" / "notes.txt").write_text("hello")
    (tmp_path / "job" / "nccl_trace_rank_x").write_bytes(GOOD)
    (tmp_path / "job" / ".nccl_trace_rank_5").write_bytes(GOOD)  # hidden: a writer's temporary
    (tmp_path / "job" / "nccl_trace_rank_6.partial").write_bytes(GOOD[:10])
    (tmp_path / "job" / "nccl_trace_rank_0.json").write_bytes(GOOD)  # rank 0 twice
    os.utime(tmp_path / "job" / "nccl_trace_rank_0.json", (OLD, OLD))
    source = source_for(tmp_path)
    for _ in range(2):
        text = render(source)
    assert value(text, "goodput_flight_recorder_rejected_total", reason="bad_name") == 2
    assert value(text, "goodput_flight_recorder_rejected_total", reason="duplicate_rank") == 1
    assert value(text, "goodput_flight_recorder_files") == 2


def test_a_directory_of_10000_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    many = tmp_path / "many"
    many.mkdir()
    for rank in range(10_000):
        os.link(DUMPS / "hang4" / "nccl_trace_rank_0", many / f"nccl_trace_rank_{rank}")
    copy_scenario("healthy2", tmp_path, "good")
    now = time.time()
    for path in (tmp_path / "good").iterdir():
        os.utime(path, (now, now))  # the newest: kept under max_files
    source = source_for(tmp_path, max_files=100)
    caplog.set_level(logging.WARNING, logger="exporter.sources.flight.source")
    text = render(source)
    assert value(text, "goodput_flight_recorder_files") == 100
    assert value(text, "goodput_flight_recorder_rejected_total", reason="too_many_files") == 10_002 - 100
    assert value(text, "goodput_collective_operations_total", workload="good", rank="1", op="all_reduce") == 4
    assert len(caplog.records) == LOG_LINES_PER_PASS + 1  # then one line saying how many more
    caplog.clear()
    assert render(source) == text  # the next pass counts nothing again and logs nothing
    assert caplog.records == []


def test_the_daemon_keeps_serving_through_all_of_it(tmp_path: Path) -> None:
    root = tmp_path / "fr"
    copy_scenario("hang4", root)
    for i, (_, make) in enumerate(CASES.values()):
        path = root / "bad" / f"nccl_trace_rank_{i}"
        path.parent.mkdir(parents=True, exist_ok=True)
        make(path)
        if not path.is_symlink() and path.exists():
            os.utime(path, (OLD, OLD))
    config = quick_config(flight={"dir": str(root), "rank_missing_after": "1s"})
    with live_server(config) as live:
        text = live.metrics_when("goodput_collective_missing_rank", 1, workload="hang4", rank="1")
        for _ in range(5):
            text = live.metrics()
        total = sum(value(text, "goodput_flight_recorder_rejected_total", **s)
                    for s in series(text, "goodput_flight_recorder_rejected_total"))
        assert total == len(CASES)
        assert value(text, "goodput_exporter_source_up", source="flight") == 1
        assert live.client.get("/readyz").status_code == 200


def test_a_parse_past_its_time_is_stopped(tmp_path: Path) -> None:
    copy_scenario("healthy2", tmp_path, "job")
    source = source_for(tmp_path, timeout="1ms")  # no parse finishes that fast, not even the first
    text = render(source)
    assert value(text, "goodput_flight_recorder_rejected_total", reason="corrupt") == 2
    assert value(text, "goodput_flight_recorder_files") == 0
    source.close()


def test_the_parser_process_is_replaced_after_a_memory_bomb(tmp_path: Path) -> None:
    source = source_for(tmp_path)
    copy_scenario("healthy2", tmp_path, "job")
    render(source)
    first = source._parser.pid
    bomb = tmp_path / "evil" / "nccl_trace_rank_0"
    bomb.parent.mkdir()
    bomb.write_bytes(b"\x80\x02Nr\xff\xff\xff\x7f.")
    assert value(render(source), "goodput_flight_recorder_rejected_total", reason="too_large") == 1
    copy_scenario("healthy4", tmp_path, "later")  # read by a fresh parser
    text = render(source)
    assert value(text, "goodput_collective_operations_total", workload="later", rank="3", op="all_reduce") == 3
    assert source._parser.pid not in (None, first)
    source.close()


def test_a_bad_name_is_logged_with_the_names_accepted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "trace_rank_0").write_bytes(GOOD)
    caplog.set_level(logging.WARNING, logger="exporter.sources.flight.source")
    text = render(source_for(tmp_path))
    assert value(text, "goodput_flight_recorder_rejected_total", reason="bad_name") == 1
    (logged,) = [r.getMessage() for r in caplog.records if "trace_rank_0" in r.getMessage()]
    assert "(bad_name)" in logged
    assert "comm_lib_trace_rank_<rank>[.pkl|.json] or nccl_trace_rank_<rank>[.pkl|.json]" in logged
    assert "flight.prefixes" in logged


@pytest.mark.parametrize(("layer", "expected"), [
    ({"prefixes": []}, "flight.prefixes: name at least one file-name prefix"),
    ({"prefixes": [""]}, "flight.prefixes: '' is not a plain file-name prefix"),
    ({"prefixes": ["comm_lib_trace_rank_", "dumps/rank_"]}, "flight.prefixes: 'dumps/rank_' is not a plain"),
    ({"prefixes": [".hidden_rank_"]}, "flight.prefixes: '.hidden_rank_' is not a plain file-name prefix"),
    ({"prefixes": ["/run/fr/comm_lib_trace_rank_"]}, "'/run/fr/comm_lib_trace_rank_' is not a plain"),
    ({"prefixes": ["nul\0rank_"]}, "flight.prefixes: 'nul\\x00rank_' is not a plain file-name prefix"),
    ({"prefix": "a/b_"}, "flight.prefix: 'a/b_' is not a plain file-name prefix"),
    ({"prefix": "old_", "prefixes": ["new_"]}, "flight.prefix is deprecated and flight.prefixes is set too"),
])
def test_a_bad_prefix_is_a_config_error_naming_the_key(layer: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(None, {"flight": layer}, environ={})
    assert expected in str(info.value)


@pytest.mark.parametrize(("argv", "environ", "expected"), [
    (["--flight.prefixes", ""], {}, "flight.prefixes: name at least one file-name prefix"),
    (["--flight.prefixes", " , "], {}, "flight.prefixes: name at least one file-name prefix"),
    ([], {"GOODPUT_FLIGHT_PREFIXES": "comm_lib_trace_rank_,../up_"}, "'../up_' is not a plain file-name prefix"),
    (["--flight.prefix", ".x"], {}, "flight.prefix: '.x' is not a plain file-name prefix"),
])
def test_a_bad_prefix_from_a_flag_or_variable(argv: list[str], environ: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_serve_args(argv, environ)
    assert expected in str(info.value)
