"""goodput-client as its own distribution: what installing it brings, what importing it costs, the
deprecated exporter.client, its transport, and its wire contract against the real daemon."""

from __future__ import annotations

import importlib
import json
import math
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

import goodput_client
import pytest
from conftest import ROOT, LiveServer, free_port, live_server, quick_config, series, value, wait_for
from goodput_client import contract
from goodput_client.contract import (
    DEPRECATED_PHASES,
    EVENT_TYPES,
    EVENTS_PATH,
    FLOPS_DTYPES,
    LIFECYCLE_EVENTS,
    MAX_COUNT,
    MAX_ELAPSED,
    MAX_FLOPS,
    MAX_RANK,
    MAX_SECONDS,
    PHASES,
    UNTRACKED_PHASE,
    batch_body,
    encode,
    lifecycle_event,
    phase_event,
    step_event,
)
from goodput_client.transport import Transport

from exporter.sources.nvml.simulated import SimulatedGpus

if TYPE_CHECKING:
    from job_env import Venv

pytest_plugins = ["job_env"]  # the session's venvs: job_env (PyTorch and goodput-client), client_env (the client)

# what `import goodput_client` leaves to the first Telemetry (or never needs)
LAZY_MODULES = ("http", "http.client", "email", "ssl", "json", "socket", "select", "urllib", "urllib.parse",
                "logging", "re", "ipaddress", "typing", "pathlib", "asyncio", "goodput_client.transport",
                "goodput_client.launcher")
Record = Callable[[str, object], None]  # pytest's record_testsuite_property: figures for the JUnit report
DAEMON_MODULES = ("exporter", "fastapi", "httpx", "pydantic")
# the daemon's own dependencies: a training job must be able to go without every one of them
DAEMON_DISTRIBUTIONS = {"goodput-exporter", "fastapi", "starlette", "uvicorn", "httptools", "uvloop", "httpx",
                        "pydantic", "pydantic-core", "grpcio", "protobuf", "prometheus-client", "nvidia-ml-py",
                        "psutil", "pyyaml"}

MODULES_REPORT = """
import sys
before = set(sys.modules)
import goodput_client
imported = set(sys.modules) - before
print(" ".join(sorted(imported)))
telemetry = goodput_client.Telemetry(socket_path="/nonexistent/ingest.sock", flush_interval=0.01)
telemetry.close(timeout=2)
print(" ".join(sorted(set(sys.modules) - before - imported)))
"""

METADATA_REPORT = """
import importlib.metadata, json
found = importlib.metadata.distribution("goodput-client")
print(json.dumps({"version": found.version, "requires": found.requires,
                  "requires_python": found.metadata["Requires-Python"],
                  "license": found.metadata["License-Expression"]}))
"""


# --- the distribution ---------------------------------------------------------------------------------


def test_installing_the_client_brings_nothing_else(client_env: Venv) -> None:
    assert goodput_client.__version__ == "0.1.0"
    assert client_env.distributions() == {**client_env.shipped, "goodput-client": "0.1.0"}
    assert set(client_env.shipped) <= {"pip", "setuptools"}
    result = subprocess.run([str(client_env.python), "-c", METADATA_REPORT], env=client_env.environ(),
                            capture_output=True, text=True, timeout=60, check=True, cwd=client_env.root)
    assert json.loads(result.stdout) == {"version": "0.1.0", "requires": None, "requires_python": ">=3.9",
                                         "license": "Apache-2.0"}


def test_importing_the_client_leaves_the_transport_for_later(client_env: Venv) -> None:
    result = subprocess.run([str(client_env.python), "-c", MODULES_REPORT], env=client_env.environ(),
                            capture_output=True, text=True, timeout=60, check=True, cwd=client_env.root)
    on_import, on_first_use = (set(line.split()) for line in result.stdout.splitlines())
    assert {"goodput_client", "goodput_client.contract", "goodput_client.telemetry"} <= on_import
    assert on_import.isdisjoint(LAZY_MODULES), sorted(on_import & set(LAZY_MODULES))
    # the same modules are there once a Telemetry has tried to send: lazy, not missing
    assert {"goodput_client.transport", "goodput_client.launcher", "http.client", "json", "socket"} <= on_first_use
    # the import time itself is a benchmark figure (bench/client_ingest.py, in bench/results.md), not a
    # pass/fail on a noisy machine


def test_the_job_environment_holds_the_client_and_torch_only(job_env: Venv, tmp_path: Path,
                                                             record_testsuite_property: Record) -> None:
    installed = job_env.distributions()
    assert installed["goodput-client"] == "0.1.0" and installed["torch"].startswith("2.13.0")
    assert DAEMON_DISTRIBUTIONS.isdisjoint(installed), sorted(DAEMON_DISTRIBUTIONS & set(installed))
    assert job_env.imports(*DAEMON_MODULES, cwd=tmp_path) == dict.fromkeys(DAEMON_MODULES)
    record_testsuite_property("job_venv_build_seconds", round(job_env.build_seconds, 1))


# --- the deprecated module ----------------------------------------------------------------------------


def test_exporter_client_is_a_deprecated_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "exporter.client", raising=False)  # imported earlier: import it afresh
    with pytest.warns(DeprecationWarning, match=r"install goodput-client and import goodput_client"):
        shim = importlib.import_module("exporter.client")
    assert shim.Telemetry is goodput_client.Telemetry
    assert (shim.PHASES, shim.DEFAULT_SOCKET) == (goodput_client.PHASES, goodput_client.DEFAULT_SOCKET)


def test_exporter_client_imports_nothing_else_of_the_daemon() -> None:
    code = "import sys, exporter.client; print(' '.join(sorted(m for m in sys.modules if m.startswith('exporter'))))"
    result = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", code], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.split() == ["exporter", "exporter.client"]


# --- the transport, against a small real HTTP server that records what it gets -------------------------


@dataclass(frozen=True)
class Received:
    path: str
    authorization: str | None
    content_type: str | None
    events: list[dict[str, object]]


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the daemon
    timeout = 0.3  # an idle connection is closed after this (uvicorn: 5 s)

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1  # type: ignore[attr-defined]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.received.append(Received(  # type: ignore[attr-defined]
            self.path, self.headers["Authorization"], self.headers["Content-Type"], body["events"]))
        reply = json.dumps({"accepted": len(body["events"])}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:  # quiet, including the idle timeouts
        pass


class _UnixRecorder(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


def quick_telemetry(*args: object, **kwargs: object) -> goodput_client.Telemetry:
    """A Telemetry that sends soon after each event."""
    return goodput_client.Telemetry(*args, flush_interval=0.02, **kwargs)  # type: ignore[arg-type]


@contextmanager
def recording_server(unix_path: Path | None = None) -> Iterator[socketserver.BaseServer]:
    """A recording HTTP/1.1 server on `unix_path`, or on a loopback TCP port when None."""
    server: socketserver.BaseServer
    if unix_path is not None:
        server = _UnixRecorder(str(unix_path), _Recorder)
    else:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        server.daemon_threads = True
    server.connections = 0  # type: ignore[attr-defined]
    server.received = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_one_connection_carries_the_posts_and_a_closed_one_is_replaced(tmp_path: Path) -> None:
    with recording_server(tmp_path / "r.sock") as server:
        transport = Transport(socket_path=str(tmp_path / "r.sock"))
        bodies = [encode(batch_body([phase_event("w", 0, "compute", n)])) for n in range(4)]
        for body in bodies[:3]:
            assert transport.post(EVENTS_PATH, body) == (200, '{"accepted": 1}')
        assert server.connections == 1  # type: ignore[attr-defined]
        time.sleep(_Recorder.timeout * 3)  # the server closes the idle connection meanwhile
        assert transport.post(EVENTS_PATH, bodies[3]) == (200, '{"accepted": 1}')
        transport.close()
        assert server.connections == 2  # type: ignore[attr-defined]
        # each batch arrived once: a connection found closed is replaced before it is written to
        assert [r.events[0]["seconds"] for r in server.received] == [0, 1, 2, 3]  # type: ignore[attr-defined]


def test_a_url_with_a_path_and_a_token() -> None:
    with recording_server() as server:
        port = server.server_address[1]  # type: ignore[index]
        telemetry = quick_telemetry("run-1", 3, url=f"http://127.0.0.1:{port}/goodput/", token="s3cret")
        telemetry.record_step(0.25, tokens=7, samples=1)
        telemetry.record_phase("no-such-phase", 0.5)
        telemetry.close()
        received = server.received  # type: ignore[attr-defined]
    assert (telemetry.sent, telemetry.dropped) == (4, 0)
    assert {(r.path, r.authorization, r.content_type) for r in received} == {
        ("/goodput/v1/events", "Bearer s3cret", "application/json")}
    events = [e for r in received for e in r.events]
    elapsed = [e.pop("elapsed_seconds") for e in events]  # exact figures: tests/test_client_accounting.py
    assert elapsed[0] == 0 and elapsed == sorted(elapsed)
    assert events == [
        lifecycle_event("run-1", 3, "start", started_at=telemetry.started_at),
        step_event("run-1", 3, 0.25, 7, 1, step=1), phase_event("run-1", 3, "other", 0.5),
        lifecycle_event("run-1", 3, "end")]


def test_an_unknown_lifecycle_event_is_dropped_before_it_spoils_a_batch(tmp_path: Path) -> None:
    with recording_server(tmp_path / "r.sock") as server:
        telemetry = quick_telemetry("w", 0, socket_path=str(tmp_path / "r.sock"))
        telemetry.lifecycle("stopped")
        telemetry.lifecycle("restart")
        telemetry.close()
        events = [e["event"] for r in server.received for e in r.events]  # type: ignore[attr-defined]
    assert events == ["start", "restart", "end"]
    assert (telemetry.sent, telemetry.dropped) == (3, 1)


def test_an_unknown_phase_is_sent_as_other_and_logged_once(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    with recording_server(tmp_path / "r.sock") as server, caplog.at_level("WARNING", logger="goodput_client"):
        telemetry = quick_telemetry("w", 0, socket_path=str(tmp_path / "r.sock"))
        for name in ("lunch", "lunch", "nap"):
            with telemetry.phase(name):
                pass
        telemetry.close()
        phases = [e["phase"] for r in server.received for e in r.events if e["type"] == "phase"]  # type: ignore[attr-defined]
    assert phases == [contract.FALLBACK_PHASE] * 3
    assert [r.getMessage() for r in caplog.records] == ["goodput telemetry: unknown phase 'lunch' recorded as 'other'"]


def test_a_url_that_is_not_http_is_counted_as_drops_never_raised() -> None:
    telemetry = quick_telemetry("w", 0, url="ftp://127.0.0.1/")
    telemetry.record_phase("compute", 0.1)
    telemetry.close(timeout=2)
    assert (telemetry.sent, telemetry.dropped) == (0, 3)


def test_a_number_json_cannot_carry_drops_its_batch_never_raised(tmp_path: Path) -> None:
    with recording_server(tmp_path / "r.sock") as server:
        telemetry = goodput_client.Telemetry("w", 0, socket_path=str(tmp_path / "r.sock"), flush_interval=60)
        assert telemetry.flush()  # the start event, alone
        telemetry.record_phase("compute", math.inf)
        telemetry.record_step(math.nan)
        assert telemetry.flush()
        telemetry.record_phase("compute", 0.5)
        telemetry.close()
        events = [e for r in server.received for e in r.events]  # type: ignore[attr-defined]
    assert [e["type"] for e in events] == ["lifecycle", "phase", "lifecycle"]
    assert (telemetry.sent, telemetry.dropped) == (3, 2)


# --- the wire contract, against the real daemon -------------------------------------------------------


@pytest.fixture(scope="module")
def daemon() -> Iterator[tuple[LiveServer, Transport]]:
    config = quick_config()
    with live_server(config, backend=SimulatedGpus(1)) as live:
        transport = Transport(socket_path=config.ingest.socket_path, timeout=10)
        yield live, transport
        transport.close()


def accepted(live: LiveServer) -> dict[str, float]:
    text = live.metrics()
    return {kind: value(text, "goodput_ingest_events_accepted_total", type=kind) or 0 for kind in EVENT_TYPES}


def test_contract_built_batches_become_series(daemon: tuple[LiveServer, Transport]) -> None:
    live, transport = daemon
    before = accepted(live)
    events = [lifecycle_event("contract", 0, "start"), lifecycle_event("contract", 0, "restart"),
              *(phase_event("contract", 0, phase, 0.25) for phase in PHASES),
              *(step_event("contract", 0, 0.5, tokens=100, samples=2) for _ in range(3)),
              contract.role_event("contract", 0, 1, 0), contract.role_event("contract", 0, 2, 3),
              contract.target_event("contract", 0, 100, 1.8e9), contract.target_event("contract", 0, 120, None)]
    status, text = transport.post(EVENTS_PATH, encode(batch_body(events)))
    assert (status, json.loads(text)) == (200, {"accepted": len(events)})
    labels = {"workload": "contract", "rank": "0"}
    metrics = live.metrics_when("goodput_steps_total", 3, **labels)
    for phase in PHASES:
        assert value(metrics, "goodput_phase_seconds_total", phase=phase, **labels) == pytest.approx(0.25), phase
    assert value(metrics, "goodput_tokens_total", **labels) == 300
    assert value(metrics, "goodput_samples_total", **labels) == 6
    assert value(metrics, "goodput_step_duration_seconds_sum", **labels) == pytest.approx(1.5)
    assert value(metrics, "goodput_workload_restarts_total", **labels) == 1
    # the last role the rank sent, one series
    assert [(row["pipeline_stage"], row["data_parallel_rank"]) for row in series(metrics, "goodput_rank_role_info")
            if row["workload"] == "contract"] == [("2", "3")]
    # the last target declared, whole: its deadline left out is no deadline
    assert value(metrics, "goodput_target_step_number", **labels) == 120
    assert value(metrics, "goodput_deadline_timestamp_seconds", **labels) is None
    after = accepted(live)
    assert {kind: after[kind] - before[kind] for kind in EVENT_TYPES} == {
        "step": 3, "phase": len(PHASES), "lifecycle": 2, "role": 2, "request": 0, "capture": 0,
        "target": 2}


LIMITS = "limits"
WITHIN_CONTRACT = {
    "every phase": [phase_event(LIMITS, 1, phase, 1.0) for phase in PHASES],
    "every deprecated phase": [phase_event(LIMITS, 1, phase, 1.0) for phase in DEPRECATED_PHASES],
    "every optional key": [
        lifecycle_event(LIMITS, 6, "start", elapsed_seconds=0.0, started_at=1.7e9, resumed_from_step=0,
                        run="torchrun-run-1"),
        phase_event(LIMITS, 6, "compute", 1.0, elapsed_seconds=1.0),
        step_event(LIMITS, 6, 1.0, 10, 1, step=1, flops=1e15, dtype="bf16", elapsed_seconds=1.5),
        lifecycle_event(LIMITS, 6, "restart", elapsed_seconds=2.0, resumed_from_step=1),
        lifecycle_event(LIMITS, 6, "end", elapsed_seconds=2.5)],
    "every dtype": [step_event(LIMITS, 7, 1.0, step=n + 1, flops=1.0, dtype=dtype)
                    for n, dtype in enumerate(FLOPS_DTYPES)],
    "the new keys' limits": [step_event(LIMITS, 8, 1.0, step=MAX_COUNT, flops=MAX_FLOPS, elapsed_seconds=MAX_ELAPSED),
                             step_event(LIMITS, 8, 1.0, flops=0.0, elapsed_seconds=0.0),
                             lifecycle_event(LIMITS, 8, "restart", resumed_from_step=MAX_COUNT)],
    "every lifecycle event": [lifecycle_event(LIMITS, 2, event) for event in LIFECYCLE_EVENTS],
    "MAX_SECONDS": [phase_event(LIMITS, 3, "compute", MAX_SECONDS), step_event(LIMITS, 3, MAX_SECONDS)],
    "zero and negative times, clamped": [step_event(LIMITS, 4, 0.0), step_event(LIMITS, 4, -1.0),
                                         phase_event(LIMITS, 4, "other", -1.0)],
    "MAX_COUNT": [step_event(LIMITS, 5, 1.0, MAX_COUNT, MAX_COUNT)],
    "the last rank": [step_event(LIMITS, MAX_RANK - 1, 1.0)],
    "the longest workload": [step_event("w" * 128, 0, 1.0)],
    "every workload character": [step_event("Az09_.:/-", 0, 1.0)],
    "the role's limits": [contract.role_event(LIMITS, 10, 0, 0),
                          contract.role_event(LIMITS, 10, contract.MAX_ROLE_INDEX - 1, contract.MAX_ROLE_INDEX - 1)],
    "the target's limits": [contract.target_event(LIMITS, 11, 1, contract.MAX_DEADLINE),
                            contract.target_event(LIMITS, 11, MAX_COUNT, 1e-3),
                            contract.target_event(LIMITS, 11, None, None)],
}
BEYOND_CONTRACT = {
    "an unknown phase": [phase_event(LIMITS, 9, "lunch", 1.0)],
    "an unknown lifecycle event": [lifecycle_event(LIMITS, 9, "stop")],
    "an unknown type": [{**step_event(LIMITS, 9, 1.0), "type": "epoch"}],
    "over MAX_SECONDS": [phase_event(LIMITS, 9, "compute", math.nextafter(MAX_SECONDS, math.inf))],
    "a step over MAX_SECONDS": [step_event(LIMITS, 9, math.nextafter(MAX_SECONDS, math.inf))],
    "over MAX_COUNT": [step_event(LIMITS, 9, 1.0, samples=MAX_COUNT + 1)],
    "MAX_RANK": [step_event(LIMITS, MAX_RANK, 1.0)],
    "a workload too long": [step_event("w" * 129, 0, 1.0)],
    "a workload starting with punctuation": [step_event("-w", 0, 1.0)],
    "another key": [{**step_event(LIMITS, 9, 1.0), "epoch": 1}],
    "the untracked phase, never sent": [phase_event(LIMITS, 9, UNTRACKED_PHASE, 1.0)],
    "step 0": [step_event(LIMITS, 9, 1.0, step=0)],
    "a step over MAX_COUNT": [step_event(LIMITS, 9, 1.0, step=MAX_COUNT + 1)],
    "negative flops": [step_event(LIMITS, 9, 1.0, flops=-1.0)],
    "flops over MAX_FLOPS": [step_event(LIMITS, 9, 1.0, flops=math.nextafter(MAX_FLOPS, math.inf))],
    "an unknown dtype": [step_event(LIMITS, 9, 1.0, flops=1.0, dtype="int8")],
    "elapsed over MAX_ELAPSED": [phase_event(LIMITS, 9, "compute", 1.0,
                                             elapsed_seconds=math.nextafter(MAX_ELAPSED, math.inf))],
    "a negative resumed_from_step": [lifecycle_event(LIMITS, 9, "restart", resumed_from_step=-1)],
    "started_at 0": [lifecycle_event(LIMITS, 9, "start", started_at=0.0)],
    "a run that is no workload name": [lifecycle_event(LIMITS, 9, "start", started_at=1.7e9, run="a run")],
    "a negative pipeline stage": [contract.role_event(LIMITS, 9, -1, 0)],
    "a role index at MAX_ROLE_INDEX": [contract.role_event(LIMITS, 9, 0, contract.MAX_ROLE_INDEX)],
    "a role without its replica": [{"type": "role", "workload": LIMITS, "rank": 9, "pipeline_stage": 1}],
    "target step 0": [contract.target_event(LIMITS, 9, 0, None)],
    "a target over MAX_COUNT": [contract.target_event(LIMITS, 9, MAX_COUNT + 1, None)],
    "a deadline 0": [contract.target_event(LIMITS, 9, None, 0.0)],
    "a deadline in milliseconds": [contract.target_event(LIMITS, 9, None, 1.8e12)],
}


@pytest.mark.parametrize("events", WITHIN_CONTRACT.values(), ids=WITHIN_CONTRACT.keys())
def test_the_daemon_accepts_what_the_contract_allows(daemon: tuple[LiveServer, Transport],
                                                     events: list[contract.Event]) -> None:
    status, text = daemon[1].post(EVENTS_PATH, encode(batch_body(events)))
    assert (status, json.loads(text)) == (200, {"accepted": len(events)})


@pytest.mark.parametrize("events", BEYOND_CONTRACT.values(), ids=BEYOND_CONTRACT.keys())
def test_the_daemon_rejects_what_the_contract_excludes(daemon: tuple[LiveServer, Transport],
                                                       events: list[contract.Event]) -> None:
    status, text = daemon[1].post(EVENTS_PATH, encode(batch_body(events)))
    assert status == 422, text


def test_a_token_and_a_url_reach_the_daemons_tcp_listener(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "token").write_text("s3cret\n")
    config = quick_config(ingest={"listen_address": f"127.0.0.1:{port}", "token_file": str(tmp_path / "token")})
    with live_server(config, backend=SimulatedGpus(1)) as live:
        good = quick_telemetry("tcp", 0, url=f"http://127.0.0.1:{port}", token="s3cret")
        bad = quick_telemetry("tcp", 1, url=f"http://127.0.0.1:{port}", token="guess")
        for telemetry in (good, bad):
            telemetry.record_step(0.5, tokens=10)
            telemetry.close()
        live.metrics_when("goodput_steps_total", 1, workload="tcp", rank="0")
        wait_for(lambda: (value(live.metrics(), "goodput_ingest_rejected_requests_total", reason="unauthorized")
                          or 0) >= 1)
        assert value(live.metrics(), "goodput_steps_total", workload="tcp", rank="1") is None
    assert (good.sent, good.dropped, bad.sent, bad.dropped) == (3, 0, 0, 3)


def test_a_rank_names_its_role_in_the_environment_or_by_a_call(daemon: tuple[LiveServer, Transport],
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    live, transport = daemon
    path = transport.socket_path
    monkeypatch.setenv(contract.PIPELINE_STAGE_ENV, "3")
    monkeypatch.setenv(contract.DATA_PARALLEL_RANK_ENV, "1")
    from_env = quick_telemetry("roles", 0, socket_path=path)
    monkeypatch.setenv(contract.PIPELINE_STAGE_ENV, "last")  # not a number: not sent, said once
    unreadable = quick_telemetry("roles", 1, socket_path=path)
    monkeypatch.delenv(contract.PIPELINE_STAGE_ENV)
    called = quick_telemetry("roles", 2, socket_path=path)
    called.role(1)
    called.role(-1, 0)  # refused, the last good role kept
    for telemetry in (from_env, unreadable, called):
        telemetry.record_step(0.1)
        telemetry.flush()
    text = live.metrics_when("goodput_steps_total", 1, workload="roles", rank="2")
    roles = {row["rank"]: (row["pipeline_stage"], row["data_parallel_rank"])
             for row in series(text, "goodput_rank_role_info") if row["workload"] == "roles"}
    assert roles == {"0": ("3", "1"), "2": ("1", "0")}
    assert sum("role not sent" in record.getMessage() for record in caplog.records) == 2
    for telemetry in (from_env, unreadable, called):
        telemetry.close()


def test_a_job_declares_its_target_and_deadline_in_the_environment_or_by_a_call(
        daemon: tuple[LiveServer, Transport], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    live, transport = daemon
    path = transport.socket_path
    monkeypatch.setenv(contract.TARGET_STEPS_ENV, "5000")
    monkeypatch.setenv(contract.DEADLINE_ENV, "2030-01-01T01:00:00+01:00")
    from_env = quick_telemetry("targets", 0, socket_path=path)
    monkeypatch.setenv(contract.TARGET_STEPS_ENV, "lots")  # not a number: not sent, said once
    monkeypatch.setenv(contract.DEADLINE_ENV, "2030-01-01T00:00:00")  # no UTC offset: a guess, not sent
    unreadable = quick_telemetry("targets", 1, socket_path=path)
    monkeypatch.delenv(contract.DEADLINE_ENV)
    monkeypatch.setenv(contract.TARGET_STEPS_ENV, "5000")
    called = quick_telemetry("targets", 2, socket_path=path)
    called.target(7000, deadline=1.9e9)  # the call wins over the environment
    called.target(0)  # refused, the last good target kept
    called._declare_target(100, None, 1)  # a framework's max_steps: below the call's precedence, not taken
    for telemetry in (from_env, unreadable, called):
        telemetry.record_step(0.1)
        telemetry.flush()
    text = live.metrics_when("goodput_steps_total", 1, workload="targets", rank="2")
    targets = {rank: value(text, "goodput_target_step_number", workload="targets", rank=rank) for rank in "012"}
    deadlines = {rank: value(text, "goodput_deadline_timestamp_seconds", workload="targets", rank=rank)
                 for rank in "012"}
    assert targets == {"0": 5000, "1": None, "2": 7000}  # absent, not 0, where nothing was declared
    assert deadlines == {"0": 1893456000, "1": None, "2": 1.9e9}
    messages = [record.getMessage() for record in caplog.records]
    assert sum("GOODPUT_TARGET_STEPS='lots' ignored" in m for m in messages) == 1
    assert sum("GOODPUT_DEADLINE='2030-01-01T00:00:00' ignored" in m for m in messages) == 1
    assert sum("target steps 0 not sent" in m for m in messages) == 1
    for telemetry in (from_env, unreadable, called):
        telemetry.close()
