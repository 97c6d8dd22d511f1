"""Captures, the daemon's side: triggers become requests handed out once on a rank's POST /v1/events, answers are
counted and indexed, rate limits and the disk budget hold under a storm, refusals are remembered, the index outlives
a restart, and `goodput-exporter captures` prints it. Real daemon, real Unix socket, real files."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, ManualClock, live_server, quick_config, socket_path, value
from full_disk import small_disk
from goodput_client.contract import capture_event, flight_dump_name, poll_path, profile_trace_name

from exporter.core.exposition import TEXT, Batch, Renderer
from exporter.sources.ingest.captures import Captures
from exporter.sources.ingest.listener import IngestServer
from exporter.sources.ingest.models import CaptureEvent
from exporter.sources.ingest.settings import IngestConfig
from exporter.sources.ingest.state import IngestState
from exporter.sources.nvml.simulated import SimulatedGpus

HOUR = 3600.0


def uds(path: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://goodput", timeout=5)


def step(workload: str, rank: int) -> dict:
    return {"type": "step", "workload": workload, "rank": rank, "duration_seconds": 0.5}


def answer(request: dict, kind: str, result: str, path: str = "", size: int = 0, message: str = "") -> dict:
    """A rank's answer, built as the client builds it."""
    return capture_event(request["workload"], request["rank"], request["id"], kind, result, path=path, size=size,
                         message=message)


def write_as_client(request: dict, kind: str, size: int) -> str:
    """What a rank writes for one kind of a request: the file names of the wire contract, in the request's dir."""
    rank = request["rank"]
    path = os.path.join(request["dir"], profile_trace_name(rank) if kind == "profile" else flight_dump_name(rank))
    with open(path, "wb") as out:
        out.write(b"x" * size)
    return path


def event(request: dict, kind: str, result: str, **extra: object) -> CaptureEvent:
    return CaptureEvent.model_validate(answer(request, kind, result, **extra))  # type: ignore[arg-type]


def rendered(captures: Captures) -> str:
    batch = Batch()
    captures.render(batch)
    return Renderer().render(batch, TEXT).decode()


def capture_config(tmp_path: Path, **ingest: object) -> dict:
    return {"capture_dir": str(tmp_path / "captures"), "capture_workloads": ["llama*", "bert", "gpt"], **ingest}


def make_captures(tmp_path: Path, clock: ManualClock, directory: Path | None = None, **settings: object) -> Captures:
    """A Captures every workload opted in to, on the test's clock."""
    return Captures(str(directory or tmp_path / "captures"), ["*"], clock=clock, **settings)  # type: ignore[arg-type]


def ingest_source(live):  # type: ignore[no-untyped-def]
    return live.daemon.runners["ingest"].source


def test_a_request_is_handed_out_once_and_its_answers_are_counted_and_indexed(tmp_path: Path) -> None:
    config = quick_config(ingest=capture_config(tmp_path))
    with live_server(config, backend=SimulatedGpus(1)) as live, uds(config.ingest.socket_path) as client:
        captures = ingest_source(live).captures
        assert client.post("/v1/events", json={"events": [step("llama-7b", 0)]}).json() == {"accepted": 1}
        assert captures.trigger("other", ["0"], "hang", "not opted in") is None  # logged, not counted
        capture_id = captures.trigger("llama-7b", ["0", "1"], "step_time_shift", "rank 0's step time shifted up")
        assert capture_id is not None and "-step_time_shift-" in capture_id
        directory = tmp_path / "captures" / "llama-7b" / capture_id
        assert stat.S_IMODE(directory.stat().st_mode) == 0o1777  # any rank's user may write; none delete another's

        # rank 0's next batch carries its request, once; rank 1 polls with an empty batch, named in the query
        response = client.post("/v1/events", json={"events": [step("llama-7b", 0)]})
        assert response.status_code == 200
        (request,) = response.json()["captures"]
        assert request == {"id": capture_id, "workload": "llama-7b", "rank": 0, "kinds": ["profile", "flight"],
                           "steps": 10, "dir": str(directory)}
        assert client.post("/v1/events", json={"events": [step("llama-7b", 0)]}).json() == {"accepted": 1}
        assert client.post("/v1/events", json={"events": []}).json() == {"accepted": 0}  # unnamed poll: nothing
        poll = client.post(poll_path("llama-7b", 1), json={"events": []})
        (request1,) = poll.json()["captures"]
        assert (poll.json()["accepted"], request1["rank"]) == (0, 1)
        assert client.post(poll_path("llama-7b", 1), json={"events": []}).json() == {"accepted": 0}

        # rank 0 writes both kinds; rank 1 has captures disabled; steps in the same batch still count
        trace = write_as_client(request, "profile", 3000)
        dump = write_as_client(request, "flight", 500)
        body = {"events": [answer(request, "profile", "written", trace, 3000),
                           answer(request, "flight", "written", dump, 999),  # the size on disk is what counts
                           step("llama-7b", 0),
                           answer(request1, "profile", "disabled", message="GOODPUT_CAPTURES=0"),
                           answer(request1, "flight", "disabled", message="GOODPUT_CAPTURES=0")]}
        assert client.post("/v1/events", json=body).json() == {"accepted": 5}
        text = live.metrics_when("goodput_captures_total", 1, trigger="step_time_shift", result="written")
        assert value(text, "goodput_captures_total", trigger="step_time_shift", result="refused") == 1
        assert value(text, "goodput_capture_bytes") == 3500
        assert value(text, "goodput_captures_total", trigger="hang", result="expired") == 0
        assert value(text, "goodput_ingest_events_accepted_total", type="capture") == 4
        assert value(text, "goodput_steps_total", workload="llama-7b", rank="0") == 4
        index = json.loads((tmp_path / "captures" / "index.json").read_text())
        (entry,) = index["captures"]
        assert entry["ranks"]["0"]["status"] == "written" and entry["ranks"]["1"]["status"] == "refused"
        assert entry["ranks"]["0"]["kinds"]["flight"] == {"result": "written", "path": dump, "bytes": 500,
                                                          "message": ""}
        assert entry["ranks"]["1"]["kinds"]["profile"]["message"] == "GOODPUT_CAPTURES=0"
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755  # finished: sealed


def test_bad_answers_are_recorded_not_trusted_and_never_cost_the_batch(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    config = quick_config(ingest=capture_config(tmp_path))
    outside = tmp_path / "elsewhere.json"
    outside.write_bytes(b"y" * 10_000)
    with live_server(config, backend=SimulatedGpus(1)) as live, uds(config.ingest.socket_path) as client:
        captures = ingest_source(live).captures
        capture_id = captures.trigger("bert", ["3"], "rank_missing", "rank 3 missing from allreduce #7 of pg 0")
        (request,) = client.post("/v1/events", json={"events": [step("bert", 3)]}).json()["captures"]
        link = os.path.join(request["dir"], "rank-3.pt.trace.json")
        os.symlink(outside, link)  # through a link to a file outside: not the capture's
        caplog.set_level(logging.INFO, logger="exporter.sources.ingest")
        body = {"events": [answer(request, "profile", "written", link, 10_000),
                           answer(request, "flight", "written", str(outside), 10_000),
                           {**answer(request, "flight", "written"), "id": "20990101T000000Z-hang-abcdef"},
                           step("bert", 3)]}
        assert client.post("/v1/events", json=body).json() == {"accepted": 4}
        text = live.metrics_when("goodput_captures_total", 1, trigger="rank_missing", result="failed")
        assert value(text, "goodput_steps_total", workload="bert", rank="3") == 2
        assert value(text, "goodput_capture_bytes") == os.lstat(link).st_size  # the link, not what it points at
        entry = json.loads((tmp_path / "captures" / "index.json").read_text())["captures"][0]
        assert entry["id"] == capture_id
        assert "outside the capture's directory" in entry["ranks"]["3"]["kinds"]["profile"]["message"]
        assert "outside the capture's directory" in entry["ranks"]["3"]["kinds"]["flight"]["message"]
        assert "never asked for" in caplog.text and "20990101T000000Z-hang-abcdef" in caplog.text
        # a poll naming a rank badly is refused whole and counted, like any invalid request
        bad = client.post("/v1/events", params={"workload": "bert", "rank": "-1"}, json={"events": []})
        assert bad.status_code == 422 and "rank" in bad.json()["error"]
        half = client.post("/v1/events", params={"workload": "bert"}, json={"events": []})
        assert half.status_code == 422 and "both" in half.json()["error"]
        live.metrics_when("goodput_ingest_rejected_requests_total", 2, reason="invalid")


def test_a_storm_of_triggers_respects_the_rate_limits(tmp_path: Path) -> None:
    """Acceptance 5: 1000 triggers at once, from several threads, across 3 workloads."""
    config = quick_config(ingest=capture_config(tmp_path, capture_max_per_hour=2))
    with live_server(config, backend=SimulatedGpus(1)) as live:
        captures = ingest_source(live).captures
        started: list[str | None] = []
        workloads = ("llama", "bert", "gpt")

        def storm(offset: int) -> None:
            for i in range(offset, 1000, 8):
                started.append(captures.trigger(workloads[i % 3], [str(i % 4)], "hang", f"storm {i}"))

        threads = [threading.Thread(target=storm, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ids = [s for s in started if s is not None]
        assert len(started) == 1000 and len(ids) == 2  # the node's hourly cap
        text = live.metrics_when("goodput_capture_skipped_total", 998, trigger="hang", reason="rate_limited")
        assert value(text, "goodput_capture_skipped_total", trigger="hang", reason="refused_recently") == 0
        index = json.loads((tmp_path / "captures" / "index.json").read_text())
        assert sorted(c["id"] for c in index["captures"]) == sorted(ids)
        assert len({c["workload"] for c in index["captures"]}) == 2  # never two of one workload in its interval


def test_rate_limits_over_time(tmp_path: Path) -> None:
    clock = ManualClock()
    captures = make_captures(tmp_path, clock, interval=60.0, max_per_hour=6)

    def burst() -> int:
        return sum(captures.trigger(w, ["0"], "step_time_shift", "") is not None
                   for _ in range(334) for w in ("a", "b", "c"))

    assert burst() == 3  # one per workload: its interval
    clock.advance(61)
    assert burst() == 3
    clock.advance(61)
    assert burst() == 0  # 6 this hour: the node's cap
    clock.advance(HOUR - 121)
    assert burst() == 3  # the first three left the sliding hour
    text = rendered(captures)
    assert value(text, "goodput_capture_skipped_total", trigger="step_time_shift",
                 reason="rate_limited") == 4 * 1002 - 9


def test_a_rank_that_cannot_capture_is_not_asked_again_within_the_interval(tmp_path: Path) -> None:
    """Acceptance 5, through the events server: a client with captures disabled answers once, then is left alone
    for capture_interval (the clock is the test's)."""
    clock = ManualClock()
    config = IngestConfig(socket_path=socket_path(), capture_dir=str(tmp_path / "c"), capture_workloads=["job"])
    interval = config.capture_interval
    captures = Captures(config.capture_dir, config.capture_workloads, interval=interval, clock=clock)
    state = IngestState(8, 8, 600, clock=clock)
    server = IngestServer(config, state, captures)
    server.start()
    try:
        with uds(config.socket_path) as client:
            def post(*events: dict) -> dict:
                response = client.post("/v1/events", json={"events": list(events)})
                assert response.status_code == 200, response.text
                return response.json()

            assert captures.trigger("job", ["0", "1"], "step_time_shift", "first")
            (request,) = post(step("job", 0))["captures"]
            clock.advance(60)  # it answers a minute later
            post(answer(request, "profile", "disabled", message="captures are off in this job"),
                 answer(request, "flight", "disabled", message="captures are off in this job"))
            clock.advance(interval - 59)  # past the workload's interval, not past rank 0's refusal
            second = captures.trigger("job", ["0", "1"], "step_time_shift", "second")
            assert second is not None
            assert "captures" not in post(step("job", 0))  # rank 0 is not asked
            (for_rank1,) = post(step("job", 1))["captures"]
            assert for_rank1["id"] == second
            clock.advance(interval)
            assert captures.trigger("job", ["0"], "step_time_shift", "third") is not None  # the refusal is old
            assert post(step("job", 0))["captures"][0]["rank"] == 0
    finally:
        server.stop()
    text = rendered(captures)
    assert value(text, "goodput_captures_total", trigger="step_time_shift", result="refused") == 1
    assert value(text, "goodput_capture_skipped_total", trigger="step_time_shift", reason="refused_recently") == 0
    index = json.loads((tmp_path / "c" / "index.json").read_text())
    second_entry = next(c for c in index["captures"] if c["id"] == second)
    assert second_entry["skipped_ranks"] == ["0"] and list(second_entry["ranks"]) == ["1"]


def test_only_refusing_ranks_skip_the_capture(tmp_path: Path) -> None:
    clock = ManualClock()
    captures = make_captures(tmp_path, clock, interval=600.0)
    first = captures.trigger("w", ["2"], "hang", "")
    (request,) = captures.pending([("w", "2")])
    assert request["id"] == first
    clock.advance(100)
    captures.answer(event(request, "profile", "unsupported", message="no torch.profiler"))
    captures.answer(event(request, "flight", "unsupported", message="no process group"))
    clock.advance(550)  # the workload's interval passed; the refusal (at the answer) has not
    assert captures.trigger("w", ["2"], "hang", "") is None
    text = rendered(captures)
    assert value(text, "goodput_capture_skipped_total", trigger="hang", reason="refused_recently") == 1
    assert value(text, "goodput_capture_skipped_total", trigger="hang", reason="rate_limited") == 0
    assert value(text, "goodput_captures_total", trigger="hang", result="refused") == 1
    clock.advance(50)
    assert captures.trigger("w", ["2"], "hang", "") is not None


def test_unanswered_requests_expire(tmp_path: Path) -> None:
    clock = ManualClock()
    captures = make_captures(tmp_path, clock, timeout=600.0)
    capture_id = captures.trigger("w", ["0", "1"], "hang", "rank 0 waits in a collective for 300s")
    (request,) = captures.pending([("w", "0")])
    dump = write_as_client(request, "flight", 2048)
    captures.answer(event(request, "flight", "written", path=dump, size=2048))  # a hung loop takes no steps
    clock.advance(599)
    captures.expire()
    assert captures.running
    clock.advance(1)
    captures.expire()
    captures.prune()
    assert not captures.running
    assert captures.pending([("w", "1")]) == []  # its request was never picked up: withdrawn
    text = rendered(captures)
    assert value(text, "goodput_captures_total", trigger="hang", result="written") == 1  # what it did write
    assert value(text, "goodput_captures_total", trigger="hang", result="expired") == 1
    assert value(text, "goodput_capture_bytes") == 2048
    entry = json.loads(captures.index_path.read_text())["captures"][0]
    assert entry["id"] == capture_id and entry["ranks"]["1"]["status"] == "expired"
    assert entry["ranks"]["0"]["kinds"]["profile"]["result"] == "expired"
    # a late answer is indexed, not counted twice
    trace = os.path.join(request["dir"], "late.json")
    Path(trace).write_bytes(b"z")
    captures.answer(event(request, "profile", "written", path=trace, size=1))
    assert value(rendered(captures), "goodput_captures_total", trigger="hang", result="written") == 1
    assert json.loads(captures.index_path.read_text())["captures"][0]["ranks"]["0"]["kinds"]["profile"][
        "result"] == "written"


def test_the_disk_budget_prunes_the_oldest_finished_captures(tmp_path: Path) -> None:
    mib = 2**20
    config = quick_config(ingest=capture_config(tmp_path, capture_max_bytes=mib))
    with live_server(config, backend=SimulatedGpus(1)) as live, uds(config.ingest.socket_path) as client:
        captures = ingest_source(live).captures
        ids = []
        for n, workload in enumerate(("llama-a", "llama-b", "llama-c", "llama-d")):
            ids.append(captures.trigger(workload, ["0"], "step_time_shift", f"#{n}"))
            (request,) = client.post("/v1/events", json={"events": [step(workload, 0)]}).json()["captures"]
            events = [answer(request, kind, "written", write_as_client(request, kind, 200 * 1024), 200 * 1024)
                      for kind in ("profile", "flight")]
            assert client.post("/v1/events", json={"events": events}).status_code == 200
        # 4 x 400 KiB > 1 MiB: the two oldest go, whole
        text = live.metrics_when("goodput_captures_pruned_total", 2)
        assert value(text, "goodput_capture_bytes") == 2 * 400 * 1024
        assert not (tmp_path / "captures" / "llama-a" / ids[0]).exists()
        assert not (tmp_path / "captures" / "llama-b" / ids[1]).exists()
        assert (tmp_path / "captures" / "llama-d" / ids[3] / "comm_lib_trace_rank_0").exists()
        index = json.loads((tmp_path / "captures" / "index.json").read_text())
        assert [c["id"] for c in index["captures"]] == ids[2:]

        # a capture still running is never pruned; while running ones hold the budget, triggers are skipped
        running = captures.trigger("gpt", ["0"], "hang", "")
        (request,) = client.post("/v1/events", json={"events": [step("gpt", 0)]}).json()["captures"]
        write_as_client(request, "profile", mib + 1)  # being written: no answer yet
        text = live.metrics_when("goodput_captures_pruned_total", 4)  # the finished ones went, not the running one
        assert value(text, "goodput_capture_bytes") == mib + 1
        assert captures.trigger("bert", ["0"], "hang", "") is None
        live.metrics_when("goodput_capture_skipped_total", 1, trigger="hang", reason="budget")
        assert (tmp_path / "captures" / "gpt" / running).is_dir()


def test_the_index_survives_a_restart(tmp_path: Path) -> None:
    clock = ManualClock()
    directory = tmp_path / "c"
    first = make_captures(tmp_path, clock, directory=directory, interval=1800.0)
    capture_id = first.trigger("w", ["0", "1", "2"], "step_time_shift", "before")
    (request,) = first.pending([("w", "0")])
    first.answer(event(request, "profile", "disabled"))
    first.answer(event(request, "flight", "disabled"))
    first.pending([("w", "1")])  # handed out: not handed out again after the restart
    clock.advance(10)
    second = make_captures(tmp_path, clock, directory=directory, interval=1800.0)
    assert second.pending([("w", "1")]) == []
    (again,) = second.pending([("w", "2")])  # never handed out before the restart
    assert again["id"] == capture_id
    assert second.trigger("w", ["0", "1"], "step_time_shift", "after") is None  # its interval holds
    assert value(rendered(second), "goodput_capture_skipped_total", trigger="step_time_shift",
                 reason="rate_limited") == 1
    clock.advance(1800)
    third = second.trigger("w", ["0", "1"], "step_time_shift", "later")
    # rank 0's refusal (at t+0) is old now; it is asked again
    assert third is not None and second.pending([("w", "0")])[0]["id"] == third
    assert [c["id"] for c in json.loads(second.index_path.read_text())["captures"]] == [capture_id, third]


def test_a_capture_during_a_full_disk_is_listed_as_failed_once_space_returns(tmp_path: Path) -> None:
    """The capture directory on a real file system that is full: the ranks' answers (failed) cannot be indexed, and
    what they left of their files stays; once space returns, the next collect writes the index (the failed writes
    counted meanwhile), the unfinished files are gone, and `goodput-exporter captures` lists the capture."""
    clock = ManualClock()
    with small_disk(tmp_path / "disk") as disk:
        directory = disk.path / "captures"
        captures = make_captures(tmp_path, clock, directory=directory)
        disk.fill()
        capture_id = captures.trigger("llama", ["0", "1"], "step_time_shift", "while full")
        assert capture_id is not None
        for request in captures.pending([("llama", "0"), ("llama", "1")]):
            partial = Path(request["dir"]) / (profile_trace_name(request["rank"]) + ".partial.tmp")
            partial.touch()  # what Kineto leaves when its write fails: an empty file takes no block
            for kind in ("profile", "flight"):
                captures.answer(event(request, kind, "failed", message="OSError: [Errno 28] No space left on device"))
        captures.expire()  # a collect: the index still cannot be written
        assert not (directory / "index.json").exists()
        assert value(rendered(captures), "goodput_capture_index_errors_total", reason="unwritable") >= 3

        disk.free()
        captures.expire()  # the next collect after space returned
        listed = json.loads((directory / "index.json").read_text())["captures"]
        assert [(c["id"], sorted(r["status"] for r in c["ranks"].values())) for c in listed] == \
            [(capture_id, ["failed", "failed"])]
        assert not list((directory / "llama" / capture_id).iterdir())  # the unfinished files were removed
        out = json.loads(run_cli("--dir", str(directory), "--json").stdout)
        assert [(c["id"], [r["status"] for r in c["ranks"].values()]) for c in out["captures"]] == \
            [(capture_id, ["failed", "failed"])]


def test_the_index_is_written_at_shutdown_when_its_last_write_failed(tmp_path: Path) -> None:
    clock = ManualClock()
    with small_disk(tmp_path / "disk") as disk:
        captures = make_captures(tmp_path, clock, directory=disk.path / "captures")
        disk.fill()
        capture_id = captures.trigger("llama", ["0"], "hang", "while full")
        assert not captures.index_path.exists()
        disk.free()
        captures.close()  # what the ingest source does at shutdown
        assert [c["id"] for c in json.loads(captures.index_path.read_text())["captures"]] == [capture_id]


def test_a_corrupt_index_is_set_aside_and_started_fresh(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "c"
    directory.mkdir()
    (directory / "index.json").write_text('{"version": 1, "captures": [')
    caplog.set_level(logging.ERROR, logger="exporter.sources.ingest")
    result = run_cli("--dir", str(directory))
    assert result.returncode == 2 and "index.json is not JSON" in result.stderr
    captures = make_captures(tmp_path, ManualClock(), directory=directory)
    assert "is corrupt" in caplog.text and "index.json.corrupt" in caplog.text
    assert (directory / "index.json.corrupt").read_text() == '{"version": 1, "captures": ['
    assert captures.trigger("w", ["0"], "hang", "") is not None
    assert len(json.loads((directory / "index.json").read_text())["captures"]) == 1
    # one malformed entry: the rest is used, a copy is kept
    index = json.loads((directory / "index.json").read_text())
    index["captures"].append({**index["captures"][0], "id": "x", "dir": "/etc"})
    (directory / "index.json").write_text(json.dumps(index))
    captures = make_captures(tmp_path, ManualClock(), directory=directory)
    assert "the rest of it is used" in caplog.text
    assert json.loads((directory / "index.json.corrupt").read_text())["captures"][1]["dir"] == "/etc"
    assert captures.trigger("w", ["0"], "hang", "") is None  # the kept capture's rate limit holds


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_")}
    return subprocess.run([sys.executable, "-m", "exporter", "captures", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**environment, **(env or {})}, timeout=30)


def test_the_captures_command(tmp_path: Path) -> None:
    directory = tmp_path / "c"
    directory.mkdir()
    empty = run_cli("--dir", str(directory))
    assert (empty.returncode, empty.stdout) == (0, "no captures\n")
    clock = ManualClock()
    captures = make_captures(tmp_path, clock, directory=directory, max_per_hour=10)
    old = captures.trigger("llama", ["0", "1"], "hang", "")
    clock.advance(60)
    new = captures.trigger("bert", ["0"], "step_time_shift", "")
    (request,) = captures.pending([("bert", "0")])
    path = write_as_client(request, "profile", 4096)
    captures.answer(event(request, "profile", "written", path=path, size=4096))
    captures.answer(event(request, "flight", "failed", message="no process group"))
    captures.prune()
    text = run_cli("--dir", str(directory))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["ID", "WORKLOAD", "TRIGGER", "WRITTEN/ASKED", "BYTES", "DIR"]
    assert lines[1].split() == [new, "bert", "step_time_shift", "1/1", "4.0", "KiB", str(directory / "bert" / new)]
    assert lines[2].split()[:5] == [old, "llama", "hang", "0/2", "(2"]  # newest first; llama still waits
    config = tmp_path / "config.yaml"
    config.write_text(f"ingest:\n  capture_dir: {directory}\n")
    as_json = run_cli("--config", str(config), "--json", "--workload", "llama*")
    assert as_json.returncode == 0, as_json.stderr
    listed = json.loads(as_json.stdout)
    assert listed["dir"] == str(directory) and [c["id"] for c in listed["captures"]] == [old]
    assert listed["captures"][0]["ranks"]["1"] == {"status": "requested", "kinds": {}}
    from_env = run_cli("--workload", "nobody", env={"GOODPUT_INGEST_CAPTURE_DIR": str(directory)})
    assert (from_env.returncode, from_env.stdout) == (0, "no captures\n")
    missing = run_cli("--dir", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such directory" in missing.stderr and not missing.stdout
    off = run_cli()
    assert off.returncode == 2 and "ingest.capture_dir is empty" in off.stderr
    (directory / "index.json").write_text('{"version": 99, "captures": []}')
    wrong = run_cli("--dir", str(directory), "--json")
    assert wrong.returncode == 2 and "not a version 1 capture index" in wrong.stderr
    listed_help = subprocess.run([sys.executable, "-m", "exporter", "--help"], capture_output=True, text=True,
                                 cwd=ROOT, check=True).stdout
    assert "\n  captures " in listed_help


def test_no_capture_dir_no_captures() -> None:
    config = quick_config()
    with live_server(config, backend=SimulatedGpus(1)) as live, uds(config.ingest.socket_path) as client:
        assert ingest_source(live).captures is None
        late = {"type": "capture", "workload": "w", "rank": 0, "id": "20260101T000000Z-hang-abcdef",
                "kind": "flight", "result": "failed", "message": "x"}
        assert client.post("/v1/events", json={"events": [late]}).json() == {"accepted": 1}
        text = live.metrics_when("goodput_ingest_events_accepted_total", 1, type="capture")
        assert value(text, "goodput_captures_total", trigger="hang", result="failed") is None


def test_a_step_time_shift_is_counted_and_asks_every_rank_of_the_workload_for_a_capture(tmp_path: Path) -> None:
    """The change detector inside the daemon: rank 1's steps go from 20 to 30 ms; rank 0's hold. The shift is
    counted on rank 1 only, its baseline moves, and the capture covers both ranks, for the trace of the slow one
    to be compared with its peer's; the adaptive host source is held at its shortest interval meanwhile."""
    config = quick_config(ingest=capture_config(tmp_path),
                          host={"adaptive": True, "interval": "200ms", "min_interval": "50ms", "max_interval": "60s"})
    with live_server(config, backend=SimulatedGpus(1)) as live, uds(config.ingest.socket_path) as client:
        def steps(rank: int, seconds: float, count: int) -> dict:
            return client.post("/v1/events", json={"events": [
                {"type": "step", "workload": "gpt", "rank": rank, "duration_seconds": seconds * (1 + 0.01 * (i % 3))}
                for i in range(count)]}).json()

        for rank in (0, 1):
            assert steps(rank, 0.02, 60) == {"accepted": 60}
        assert ingest_source(live).captures.running == 0
        assert live.daemon.runners["host"].cadence._boosted_until == float("-inf")  # no capture, no boost
        (slow,) = steps(1, 0.03, 60)["captures"]  # the batch that showed the shift is answered with the request
        assert slow["rank"] == 1 and "-step_time_shift-" in slow["id"]
        text = live.metrics_when("goodput_step_time_shifts_total", 1, workload="gpt", rank="1", direction="up")
        assert value(text, "goodput_step_time_shifts_total", workload="gpt", rank="0", direction="up") == 0
        assert value(text, "goodput_step_time_shifts_total", workload="gpt", rank="1", direction="down") == 0
        gpt = {"workload": "gpt"}
        assert value(text, "goodput_step_time_baseline_seconds", rank="0", **gpt) == pytest.approx(0.0202, rel=0.02)
        assert value(text, "goodput_step_time_baseline_seconds", rank="1", **gpt) == pytest.approx(0.0303, rel=0.05)
        last = value(text, "goodput_step_time_seconds", rank="1", window="last", **gpt)
        assert last == pytest.approx(0.0303, rel=0.02)
        assert value(text, "goodput_step_time_seconds", rank="0", window="1m", **gpt) == pytest.approx(0.0202, rel=0.02)
        cadence = live.daemon.runners["host"].cadence
        assert cadence._boosted_until > cadence._clock() + 100  # CAPTURE_BOOST_SECONDS from the capture's start
        assert live.metrics_when("goodput_exporter_source_interval_seconds", 0.05, source="host")
        # rank 0's next POST carries its part of the same capture; rank 1 is not asked twice
        (peer,) = steps(0, 0.02, 1)["captures"]
        assert (peer["rank"], peer["id"], peer["dir"]) == (0, slow["id"], slow["dir"])
        assert "captures" not in steps(1, 0.03, 1)
