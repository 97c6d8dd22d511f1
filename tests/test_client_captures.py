"""goodput_client's side of captures: the requests a daemon hands out in its answers, what the rank writes (a real
torch.profiler trace of a real loop, a real flight-recorder dump of a gloo group) and what it answers, the polls
of an idle rank. The daemon is a small real HTTP server on a Unix socket that speaks the wire contract."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import pickle
import socketserver
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import torch
import torch.distributed as dist
from conftest import ROOT, socket_path, wait_for
from goodput_client import Telemetry
from goodput_client.contract import (
    CAPTURE_RESULTS,
    EVENTS_PATH,
    MAX_CAPTURE_MESSAGE,
    flight_dump_name,
    profile_trace_name,
)


class Daemon(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """POST /v1/events as the contract has it: 200 {"accepted": N}, plus the capture requests waiting for a
    (workload, rank) that sent events in the batch or named itself in the query string, handed out once."""

    daemon_threads = True

    def __init__(self, path: str) -> None:
        super().__init__(path, Handler)
        self.posts: list[tuple[str, list[dict]]] = []  # (path with query, events), in order
        self.waiting: dict[tuple[str, int], list[dict]] = {}
        self.refuse_polls = False  # answer an empty batch 422, as a daemon older than polls does
        self.lock = threading.Lock()

    def ask(self, workload: str, rank: int, capture_id: str, kinds: list[str], steps: int, directory: Path) -> None:
        with self.lock:
            self.waiting.setdefault((workload, rank), []).append(
                {"id": capture_id, "workload": workload, "rank": rank, "kinds": kinds, "steps": steps,
                 "dir": str(directory)})

    def answers(self) -> list[dict]:
        with self.lock:
            return [e for _, events in self.posts for e in events if e["type"] == "capture"]

    def answer(self, capture_id: str, kind: str) -> dict | None:
        found = [a for a in self.answers() if a["id"] == capture_id and a["kind"] == kind]
        assert len(found) <= 1, found  # one answer per (request, kind)
        return found[0] if found else None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's transport uses it
    server: Daemon

    def do_POST(self) -> None:
        events = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["events"]
        parts = urlsplit(self.path)
        assert parts.path == EVENTS_PATH
        query = parse_qs(parts.query)
        keys = {(e["workload"], e["rank"]) for e in events}
        if query:
            keys.add((query["workload"][0], int(query["rank"][0])))
        with self.server.lock:
            self.server.posts.append((self.path, events))
            if not events and self.server.refuse_polls:
                return self.reply(422, {"error": "no events"})
            body: dict[str, object] = {"accepted": len(events)}
            handed = [r for key in sorted(keys) for r in self.server.waiting.pop(key, [])]
            if handed:
                body["captures"] = handed
        self.reply(200, body)

    def reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    server = Daemon(socket_path())
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def gloo() -> Iterator[None]:
    """A real single-process gloo group: the flight recorder records its collectives (on by default)."""
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def telemetry_for(daemon: Daemon, workload: str = "job", rank: int = 0, **options: object) -> Telemetry:
    return Telemetry(workload, rank, socket_path=daemon.server_address, flush_interval=0.02,  # type: ignore[arg-type]
                     **options)  # type: ignore[arg-type]


def train(telemetry: Telemetry, until: object, sleeps: list[float] | None = None, limit: int = 200) -> list[float]:
    """A tiny model's training steps on the CPU, each timed by the client, until `until()` holds; the seconds
    each step slept on top of its compute (`sleeps`, cycled), in order."""
    model = torch.nn.Linear(32, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    slept: list[float] = []
    for number in range(limit):
        if until():  # type: ignore[operator]
            return slept
        with telemetry.step(samples=8):
            loss = model(torch.randn(8, 32)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            pause = sleeps[number % len(sleeps)] if sleeps else 0.002
            time.sleep(pause)
            slept.append(pause)
    raise AssertionError(f"not done after {limit} steps")


def trace_steps(path: Path) -> list[dict]:
    trace = json.loads(path.read_text())
    return sorted((e for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")),
                  key=lambda e: e["ts"])


def test_a_profile_capture_writes_a_chrome_trace_of_the_steps_asked_for(daemon: Daemon, tmp_path: Path) -> None:
    telemetry = telemetry_for(daemon, rank=3)
    daemon.ask("job", 3, "cap-1", ["profile"], 4, tmp_path / "cap-1")
    wait_for(lambda: telemetry._profile is not None, timeout=5)  # taken up from the answer to the first batch
    # steps of known lengths, so that the trace's step marks can be checked against them
    slept = train(telemetry, lambda: daemon.answer("cap-1", "profile"), sleeps=[0.01, 0.03])
    answer = daemon.answer("cap-1", "profile")
    trace = tmp_path / "cap-1" / profile_trace_name(3)
    assert answer is not None
    assert (answer["result"], answer["path"], answer["bytes"]) == ("written", str(trace), trace.stat().st_size)
    assert answer["workload"] == "job" and answer["rank"] == 3
    assert sorted(p.name for p in trace.parent.iterdir()) == ["rank-3.pt.trace.json"]  # no .partial left
    steps = trace_steps(trace)
    assert [e["name"] for e in steps] == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    # the first step's end starts the profiler, the second is its warm-up, the third to sixth are marked
    for event, pause in zip(steps, slept[2:6], strict=True):
        assert pause * 1e6 <= event["dur"] <= (pause + 0.25) * 1e6, (event, pause)
    # no process group: the client names the rank itself, where Holistic Trace Analysis reads it
    assert json.loads(trace.read_text())["distributedInfo"] == {"rank": 3}
    assert not torch.autograd._profiler_enabled()  # stopped: the loop goes on without it
    assert telemetry._profile is None
    telemetry.close()


def test_both_kinds_in_a_gloo_group_write_a_trace_and_a_flight_recorder_dump(daemon: Daemon, tmp_path: Path,
                                                                             gloo: None) -> None:
    telemetry = telemetry_for(daemon)
    dist.all_reduce(torch.ones(16))
    daemon.ask("job", 0, "cap-2", ["profile", "flight"], 2, tmp_path / "cap-2")
    train(telemetry, lambda: daemon.answer("cap-2", "profile"))
    flight = daemon.answer("cap-2", "flight")
    dump = tmp_path / "cap-2" / flight_dump_name(0)
    assert flight is not None
    assert (flight["result"], flight["path"], flight["bytes"]) == ("written", str(dump), dump.stat().st_size)
    recorded = pickle.loads(dump.read_bytes())  # what `_dump_fr_trace` returns, as torchfrtrace reads it
    assert [e["profiling_name"] for e in recorded["entries"]] == ["gloo:all_reduce"]
    trace = tmp_path / "cap-2" / profile_trace_name(0)
    assert daemon.answer("cap-2", "profile")["path"] == str(trace)  # type: ignore[index]
    info = json.loads(trace.read_text())["distributedInfo"]  # the profiler's own, from the process group
    assert (info["backend"], info["rank"], info["world_size"]) == ("gloo", 0, 1)
    assert len(trace_steps(trace)) == 2
    telemetry.close()


def test_a_disabled_client_answers_disabled_and_writes_nothing(daemon: Daemon, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOODPUT_CAPTURES", "0")
    by_env = telemetry_for(daemon, workload="env")
    by_argument = telemetry_for(daemon, workload="argument", captures=False)
    for telemetry in (by_env, by_argument):
        daemon.ask(telemetry.workload, 0, f"cap-{telemetry.workload}", ["profile", "flight"], 2, tmp_path / "c")
        telemetry.record_step(0.01)
    wait_for(lambda: len(daemon.answers()) == 4, timeout=5)
    for answer in daemon.answers():
        assert answer["result"] == "disabled"
        assert answer["message"].startswith("captures are off in this process")
    assert "GOODPUT_CAPTURES=0" in daemon.answer("cap-env", "flight")["message"]  # type: ignore[index]
    assert "captures=False" in daemon.answer("cap-argument", "flight")["message"]  # type: ignore[index]
    assert not (tmp_path / "c").exists()
    assert by_env._profile is None and by_argument._profile is None
    for telemetry in (by_env, by_argument):
        telemetry.close()
    assert all(events for _, events in daemon.posts)  # a disabled client never polls


def test_a_process_without_pytorch_answers_unsupported(daemon: Daemon, tmp_path: Path) -> None:
    daemon.ask("job", 0, "cap-3", ["profile", "flight"], 2, tmp_path / "cap-3")
    script = ("import sys; from goodput_client import Telemetry\n"
              f"t = Telemetry('job', 0, socket_path={daemon.server_address!r}, flush_interval=0.02)\n"
              "import time; time.sleep(0.3); t.record_step(0.01); t.close()\n"
              "assert 'torch' not in sys.modules\n")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT / "client")}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=30)
    for kind in ("profile", "flight"):
        answer = daemon.answer("cap-3", kind)
        assert answer is not None
        assert (answer["result"], answer["message"]) == ("unsupported", "PyTorch is not imported by this process")
    assert not (tmp_path / "cap-3").exists()


def test_a_flight_capture_without_a_process_group_is_unsupported(daemon: Daemon, tmp_path: Path) -> None:
    assert not dist.is_initialized()
    telemetry = telemetry_for(daemon)
    daemon.ask("job", 0, "cap-4", ["flight"], 2, tmp_path / "cap-4")
    telemetry.record_step(0.01)
    answer = wait_for(lambda: daemon.answer("cap-4", "flight"), timeout=5)
    assert (answer["result"], answer["message"]) == (  # type: ignore[index]
        "unsupported", "no process group is initialized in this process")
    telemetry.close()


def test_a_second_profile_while_one_runs_is_busy_and_close_ends_the_first(daemon: Daemon, tmp_path: Path) -> None:
    telemetry = telemetry_for(daemon)
    daemon.ask("job", 0, "long", ["profile"], 500, tmp_path / "long")
    daemon.ask("job", 0, "second", ["profile"], 2, tmp_path / "second")
    wait_for(lambda: daemon.answer("second", "profile"), timeout=5)  # both in the answer to the first batch
    assert daemon.answer("second", "profile")["result"] == "failed"  # type: ignore[index]
    assert daemon.answer("second", "profile")["message"].startswith("busy")  # type: ignore[index]
    assert not (tmp_path / "second").exists()
    train(telemetry, lambda: telemetry._profile is not None and telemetry._profile._marked >= 4)
    daemon.ask("job", 0, "third", ["profile"], 2, tmp_path / "third")  # while it records: busy too
    train(telemetry, lambda: daemon.answer("third", "profile"))
    assert daemon.answer("third", "profile")["message"].startswith("busy")  # type: ignore[index]
    assert daemon.answer("long", "profile") is None  # still recording
    telemetry.close()  # ends the capture: what was recorded is exported and answered
    answer = daemon.answer("long", "profile")
    assert answer is not None and answer["result"] == "written", answer
    marked = len(trace_steps(Path(answer["path"])))
    assert answer["message"] == f"the process ended after {marked - 1} of 500 steps"  # the last one cut short
    assert marked >= 5
    assert not torch.autograd._profiler_enabled()


def test_ranks_as_threads_of_one_process_profile_one_at_a_time(daemon: Daemon, tmp_path: Path) -> None:
    """Two ranks' Telemetry in one process (threads), both asked for one capture: the profiler is process-global, so
    one records it and the other answers busy, and the process lives on; the next capture starts again."""
    ranks = [telemetry_for(daemon, rank=rank) for rank in (0, 1)]
    for rank in (0, 1):
        daemon.ask("job", rank, "both", ["profile"], 3, tmp_path / "both")
    done = threading.Event()

    def loop(telemetry: Telemetry) -> None:
        train(telemetry, lambda: done.is_set(), limit=2000)

    threads = [threading.Thread(target=loop, args=(t,)) for t in ranks]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len([a for a in daemon.answers() if a["id"] == "both"]) == 2, timeout=60)
        results = sorted((a["result"], a["message"][:4]) for a in daemon.answers() if a["id"] == "both")
        assert results == [("failed", "busy"), ("written", "")], results
        busy = next(a["rank"] for a in daemon.answers() if a["id"] == "both" and a["result"] == "failed")
        daemon.ask("job", busy, "next", ["profile"], 2, tmp_path / "next")
        wait_for(lambda: daemon.answer("next", "profile"), timeout=60)
        assert daemon.answer("next", "profile")["result"] == "written"  # type: ignore[index]
    finally:
        done.set()
        for thread in threads:
            thread.join(60)
    for telemetry in ranks:
        telemetry.close()
    assert not torch.autograd._profiler_enabled()


def test_a_closed_telemetry_is_released(daemon: Daemon) -> None:
    telemetry = telemetry_for(daemon, captures=False)
    telemetry.close()
    released = weakref.ref(telemetry)
    del telemetry
    gc.collect()
    assert released() is None  # nothing (atexit's hook included) keeps a closed one alive


def test_a_profile_that_never_started_is_answered_at_close(daemon: Daemon, tmp_path: Path) -> None:
    telemetry = telemetry_for(daemon)
    daemon.ask("job", 0, "idle", ["profile"], 3, tmp_path / "idle")
    daemon.ask("job", 0, "bad", ["profile"], 0, tmp_path / "bad")
    telemetry.record_phase("compute", 0.1)
    wait_for(lambda: telemetry._profile is not None, timeout=5)
    telemetry.close()  # no step boundary came: never started, never left unanswered
    assert daemon.answer("idle", "profile")["result"] == "failed"  # type: ignore[index]
    assert "never started" in daemon.answer("idle", "profile")["message"]  # type: ignore[index]
    bad = daemon.answer("bad", "profile")
    assert bad is not None and bad["result"] == "failed" and "steps 0" in bad["message"]
    assert all(a["result"] in CAPTURE_RESULTS and len(a["message"]) <= MAX_CAPTURE_MESSAGE
               for a in daemon.answers())


def test_an_idle_client_polls_with_its_name_in_the_query_string(daemon: Daemon, tmp_path: Path) -> None:
    telemetry = telemetry_for(daemon, workload="team/job:7", rank=2)
    telemetry.poll_interval = 0.2
    wait_for(lambda: any(not events for _, events in daemon.posts), timeout=5)
    path = next(p for p, events in daemon.posts if not events)
    assert path == f"{EVENTS_PATH}?workload=team%2Fjob%3A7&rank=2"
    # a request waiting for it is handed out in the answer to a poll: a hung loop is still asked for its dump
    daemon.ask("team/job:7", 2, "hung", ["flight"], 1, tmp_path / "hung")
    answer = wait_for(lambda: daemon.answer("hung", "flight"), timeout=5)
    assert answer["result"] == "unsupported"  # type: ignore[index]  # no process group here
    assert telemetry.poll_errors == 0 and telemetry.dropped == 0
    telemetry.close()


def test_a_refused_poll_is_not_sent_again_and_loses_no_event(daemon: Daemon) -> None:
    daemon.refuse_polls = True
    telemetry = telemetry_for(daemon)
    telemetry.poll_interval = 0.05
    wait_for(lambda: telemetry.poll_errors == 1, timeout=5)
    time.sleep(0.3)
    telemetry.close()
    assert telemetry.poll_errors == 1 and telemetry.dropped == 0
    assert len([p for p in daemon.posts if not p[1]]) == 1


def test_a_job_never_asked_never_starts_the_profiler(daemon: Daemon) -> None:
    """In a fresh process: the capture module is never imported, the profiler never enabled, the slot empty."""
    script = ("import sys, torch; from goodput_client import Telemetry\n"
              f"t = Telemetry('job', 0, socket_path={daemon.server_address!r}, flush_interval=0.02)\n"
              "for _ in range(50):\n"
              "    with t.step(): torch.ones(8).sum()\n"
              "t.close()\n"
              "print(t.sent, t._profile, 'goodput_client.capture' in sys.modules,\n"
              "      torch.autograd._profiler_enabled())\n")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT / "client")}
    result = subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=60, capture_output=True,
                            text=True)
    assert result.stdout.split() == ["52", "None", "False", "False"]  # start, 50 steps, end


def test_a_request_for_another_rank_or_malformed_is_not_answered(daemon: Daemon, tmp_path: Path) -> None:
    telemetry = telemetry_for(daemon)
    daemon.ask("job", 0, "../escape", ["flight"], 1, tmp_path / "x")  # an id that is no capture id
    daemon.ask("job", 0, "nokind", ["trace"], 1, tmp_path / "x")
    with daemon.lock:  # delivered with this rank's, for rank 1
        daemon.waiting[("job", 0)].append({"id": "other", "workload": "job", "rank": 1, "kinds": ["flight"],
                                           "steps": 1, "dir": str(tmp_path / "x")})
    daemon.ask("job", 0, "relative", ["flight"], 1, Path("relative/dir"))
    telemetry.record_step(0.01)
    answer = wait_for(lambda: daemon.answer("relative", "flight"), timeout=5)
    assert answer["result"] == "failed" and "not an absolute path" in answer["message"]  # type: ignore[index]
    with contextlib.suppress(AssertionError):
        wait_for(lambda: len(daemon.answers()) > 1, timeout=0.3)
    assert [a["id"] for a in daemon.answers()] == ["relative"]
    telemetry.close()


def test_close_on_another_thread_answers_and_leaves_the_profiler_to_its_own(daemon: Daemon, tmp_path: Path) -> None:
    """PyTorch crashes the process when a profiler is stopped on another thread than the one that started it: a
    close there answers at once, and the profiled thread's next step stops it. In a fresh process, so that a
    crash is this test's failure alone."""
    daemon.ask("job", 0, "elsewhere", ["profile"], 50, tmp_path / "elsewhere")
    script = f"""
import threading, time, torch
from goodput_client import Telemetry
t = Telemetry('job', 0, socket_path={daemon.server_address!r}, flush_interval=0.02)
while t._profile is None:
    time.sleep(0.01)
closed = threading.Event()
def train():
    for number in range(4):
        if number == 3:
            closed.wait()
        with t.step():
            torch.ones(8).sum()
    print(t._profile, torch.autograd._profiler_enabled())
worker = threading.Thread(target=train)
worker.start()
while t._profile._marked < 2:
    time.sleep(0.01)
t.close()
closed.set()
worker.join()
"""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT / "client")}
    result = subprocess.run([sys.executable, "-c", script], env=env, timeout=60, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["None", "False"]  # stopped by the thread that started it
    answer = daemon.answer("elsewhere", "profile")
    assert answer is not None and answer["result"] == "failed"
    assert answer["message"].startswith("closed on another thread")
    assert not (tmp_path / "elsewhere" / profile_trace_name(0)).exists()
