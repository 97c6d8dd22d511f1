"""goodput_client accounting every second of a rank: the elapsed time its events carry, global step numbers
across restarts, model FLOPs and their data type, the checkpoint phases, and the decoder FLOPs helper. The
events are read as they arrive at a real HTTP server (and, last, at the real daemon), under a fake clock."""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import goodput_client
import goodput_client.telemetry as telemetry_module
import pytest
from conftest import ManualClock, live_server, quick_config, value
from goodput_client import Telemetry, decoder_flops_per_token
from goodput_client.contract import FLOPS_DTYPES, MAX_COUNT, PHASES

from exporter.sources.nvml.simulated import SimulatedGpus

Events = list[dict[str, object]]


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.events.extend(body["events"])  # type: ignore[attr-defined]
        reply = json.dumps({"accepted": len(body["events"])}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def wire() -> Iterator[tuple[str, Events]]:
    """A loopback HTTP server that keeps every event posted to it: (its URL, the events, in order)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.daemon_threads = True
    server.events = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.events  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> ManualClock:
    """The client's perf_counter, at 1024 s: binary fractions of a second from here are exact."""
    clock = ManualClock(1024.0)
    monkeypatch.setattr(telemetry_module, "_perf", clock)
    return clock


@pytest.fixture
def sent() -> Iterator[tuple[str, Events]]:
    with wire() as recorded:
        yield recorded


def telemetry_to(url: str, **kwargs: object) -> Telemetry:
    return Telemetry("acct", 0, url=url, flush_interval=0.02, **kwargs)  # type: ignore[arg-type]


def closed(telemetry: Telemetry, events: Events) -> Events:
    """Close the Telemetry; every event it sent, in order, once all arrived."""
    telemetry.close()
    assert telemetry.dropped == 0
    assert len(events) == telemetry.sent
    return events


def of(events: Events, kind: str) -> Events:
    return [e for e in events if e["type"] == kind]


# --- elapsed time -----------------------------------------------------------------------------------------


def test_every_event_carries_the_elapsed_time_at_its_end(clock: ManualClock, sent: tuple[str, Events]) -> None:
    url, events = sent
    before = time.time()
    telemetry = telemetry_to(url)
    assert before <= telemetry.started_at <= time.time()
    clock.advance(1.0)  # untracked: no phase covers it
    with telemetry.phase("startup"):
        clock.advance(2.0)
    clock.advance(0.5)
    telemetry.record_phase("compute", 0.25)  # ends now

    def loader() -> Iterator[int]:
        for item in range(2):
            clock.advance(0.125)  # the wait for each item
            yield item

    for _ in telemetry.data_wait(loader()):
        clock.advance(1.0)
    clock.advance(0.25)
    telemetry.lifecycle("restart")
    with telemetry.step(tokens=8):
        clock.advance(0.75)
    clock.advance(4.0)
    telemetry.record_step(0.5, tokens=8)  # ends now
    clock.advance(0.0625)
    wire_events = closed(telemetry, events)
    assert wire_events == [
        {"type": "lifecycle", "workload": "acct", "rank": 0, "event": "start", "elapsed_seconds": 0.0,
         "started_at": telemetry.started_at},
        {"type": "phase", "workload": "acct", "rank": 0, "phase": "startup", "seconds": 2.0, "elapsed_seconds": 3.0},
        {"type": "phase", "workload": "acct", "rank": 0, "phase": "compute", "seconds": 0.25, "elapsed_seconds": 3.5},
        {"type": "phase", "workload": "acct", "rank": 0, "phase": "data_wait", "seconds": 0.125,
         "elapsed_seconds": 3.625},
        {"type": "phase", "workload": "acct", "rank": 0, "phase": "data_wait", "seconds": 0.125,
         "elapsed_seconds": 4.75},
        {"type": "lifecycle", "workload": "acct", "rank": 0, "event": "restart", "elapsed_seconds": 6.0},
        {"type": "step", "workload": "acct", "rank": 0, "duration_seconds": 0.75, "tokens": 8, "samples": 0,
         "step": 1, "elapsed_seconds": 6.75},
        {"type": "step", "workload": "acct", "rank": 0, "duration_seconds": 0.5, "tokens": 8, "samples": 0,
         "step": 2, "elapsed_seconds": 10.75},
        {"type": "lifecycle", "workload": "acct", "rank": 0, "event": "end", "elapsed_seconds": 10.8125},
    ]


def test_a_step_that_ends_inside_a_phase_block_carries_no_elapsed_time(clock: ManualClock,
                                                                       sent: tuple[str, Events]) -> None:
    url, events = sent
    telemetry = telemetry_to(url)
    with telemetry.phase("compute"):
        with telemetry.step(tokens=1):  # a step inside the phase: the phase reports these seconds
            clock.advance(1.0)
        with telemetry.phase("comm_wait"):
            clock.advance(0.5)
        telemetry.record_step(0.25)  # still inside compute
    with telemetry.step(tokens=2), telemetry.phase("compute"):  # the phase ends first: the step is outside
        clock.advance(2.0)

    def loader() -> Iterator[int]:
        telemetry.record_step(0.125, tokens=3)  # a step that ends during a data_wait wait
        yield 1

    for _ in telemetry.data_wait(loader()):
        telemetry.record_step(0.125, tokens=4)  # after the wait
    with pytest.raises(RuntimeError), telemetry.phase("other"):
        raise RuntimeError("a phase that raises is still closed")
    telemetry.record_step(0.125, tokens=5)
    steps = of(closed(telemetry, events), "step")
    assert [(s["tokens"], s.get("elapsed_seconds")) for s in steps] == [
        (1, None), (0, None), (2, 3.5), (3, None), (4, 3.5), (5, 3.5)]
    phases = of(events, "phase")
    assert [(p["phase"], p["seconds"], p["elapsed_seconds"]) for p in phases] == [
        ("comm_wait", 0.5, 1.5), ("compute", 1.5, 1.5), ("compute", 2.0, 3.5), ("data_wait", 0.0, 3.5),
        ("other", 0.0, 3.5)]


def test_a_phase_block_that_does_not_return_reports_its_time_as_it_passes(clock: ManualClock,
                                                                          sent: tuple[str, Events]) -> None:
    """A block open over open_phase_interval (a collective that hangs) reports its time so far as a phase that ends
    then, and goes on from there: the daemon accrues a hung rank's time while it hangs. The parts add up to the
    block's length, each with the elapsed time at its end; a block shorter than the interval is one event."""
    url, events = sent
    telemetry = telemetry_to(url)
    telemetry.open_phase_interval = 1.0

    def arrived(count: int) -> None:
        deadline = time.monotonic() + 10
        while len(of(events, "phase")) < count:
            assert time.monotonic() < deadline, events
            time.sleep(0.01)

    with telemetry.phase("compute"):
        clock.advance(0.5)  # under the interval: reported once, at its end
    with telemetry.phase("comm_wait"):
        clock.advance(2.5)
        arrived(2)  # the sender reported the 2.5 s so far
        clock.advance(0.5)
        time.sleep(0.1)  # several sender passes: 0.5 s more is under the interval
        assert len(of(events, "phase")) == 2
        clock.advance(1.0)
        arrived(3)
        clock.advance(0.25)
    phases = of(closed(telemetry, events), "phase")
    assert [(p["phase"], p["seconds"], p["elapsed_seconds"]) for p in phases] == [
        ("compute", 0.5, 0.5), ("comm_wait", 2.5, 3.0), ("comm_wait", 1.5, 4.5), ("comm_wait", 0.25, 4.75)]


def test_close_inside_a_phase_block_reports_its_time_before_the_end_and_nothing_after(
        clock: ManualClock, sent: tuple[str, Events]) -> None:
    """close() while a `with` block is still open (atexit, or a job that closes its reporter inside the block): the
    block's time so far goes before the `end`, and neither the block's own end nor the sender's open-phase report
    comes after it; the daemon's account of an ended rank takes nothing more."""
    url, events = sent
    telemetry = telemetry_to(url)
    telemetry.open_phase_interval = 0.0  # the sender would report the open block on each pass
    with telemetry.phase("comm_wait"):
        clock.advance(1.5)
        telemetry.close()
        clock.advance(2.0)
        time.sleep(0.1)
    assert telemetry.dropped == 0 and len(events) == telemetry.sent
    after_start = [(e["type"], e.get("phase") or e.get("event"), e.get("seconds"), e["elapsed_seconds"])
                   for e in events[1:]]
    assert after_start[-1] == ("lifecycle", "end", None, 1.5), after_start
    assert sum(e[2] for e in after_start if e[0] == "phase") == 1.5  # type: ignore[misc]


# --- step numbers -----------------------------------------------------------------------------------------


def test_steps_are_numbered_on_from_resumed_from_step(sent: tuple[str, Events]) -> None:
    url, events = sent
    fresh = telemetry_to(url)
    fresh.record_step(0.5)
    with fresh.step():
        pass
    numbers = [e.get("step") for e in of(closed(fresh, events), "step")]
    assert numbers == [1, 2]
    assert "resumed_from_step" not in events[0]
    events.clear()
    resumed = telemetry_to(url, resumed_from_step=100)
    for _ in range(3):
        with resumed.step(tokens=1):
            pass
    with pytest.raises(ValueError), resumed.step():  # a step that raised did not complete: no number taken
        raise ValueError
    resumed.record_step(0.5)
    closed(resumed, events)
    assert events[0]["event"] == "restart" and events[0]["resumed_from_step"] == 100
    assert [e["step"] for e in of(events, "step")] == [101, 102, 103, 104]


def test_a_launcher_restart_without_resumed_from_step_numbers_no_steps(sent: tuple[str, Events],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun restarted the process and the job named no checkpoint: numbering its steps from 1 would charge every
    step the rank did before as redone. Only explicit numbers are sent; resumed_from_step=0 on a fresh run is a
    start (nothing to go back from)."""
    url, events = sent
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    restarted = telemetry_to(url)
    restarted.record_step(0.5)
    restarted.record_step(0.5, step=41)
    restarted.record_step(0.5)
    closed(restarted, events)
    assert events[0]["event"] == "restart"
    assert [e.get("step") for e in of(events, "step")] == [None, 41, 42]
    events.clear()
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    fresh = telemetry_to(url, resumed_from_step=0)
    fresh.record_step(0.5)
    closed(fresh, events)
    assert events[0]["event"] == "start" and events[0]["resumed_from_step"] == 0
    assert [e["step"] for e in of(events, "step")] == [1]


@pytest.mark.parametrize(("variables", "first"), [
    ({}, "start"), ({"TORCHELASTIC_RESTART_COUNT": "0"}, "start"), ({"TORCHELASTIC_RESTART_COUNT": "2"}, "restart"),
    ({"SLURM_RESTART_COUNT": "1"}, "restart"), ({"TORCHELASTIC_RESTART_COUNT": "x"}, "start")])
def test_a_process_the_launcher_restarted_opens_with_a_restart(sent: tuple[str, Events], variables: dict[str, str],
                                                                first: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's agent (TORCHELASTIC_RESTART_COUNT) and Slurm (SLURM_RESTART_COUNT) say a process is a restart
    even when the job resumes from no checkpoint: the daemon charges its downtime."""
    url, events = sent
    for name in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, setting in variables.items():
        monkeypatch.setenv(name, setting)
    closed(telemetry_to(url), events)
    assert events[0]["event"] == first and events[0]["started_at"] > 0 and events[0]["elapsed_seconds"] == 0
    assert all("started_at" not in e for e in events[1:])


@pytest.mark.parametrize(("variables", "workload", "run"), [
    ({"GOODPUT_JOB": "llm-7b", "TORCHELASTIC_RUN_ID": "rdzv-2"}, "llm-7b", "rdzv-2"),
    ({"GOODPUT_JOB": "llm-7b", "SLURM_JOB_ID": "4243"}, "llm-7b", "4243"),
    ({"TORCHELASTIC_RUN_ID": "rdzv-2"}, "rdzv-2", None),  # the launcher names the workload: no run of its own
    ({"GOODPUT_JOB": "llm-7b"}, "llm-7b", None)])  # no launcher to name the run
def test_a_job_named_across_its_runs_names_its_run_in_its_first_event(
        sent: tuple[str, Events], variables: dict[str, str], workload: str, run: str | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GOODPUT_JOB names the workload; the launcher's name is the run, sent with the first event only, so that the
    daemon takes the start of another run as a resubmission of the job."""
    url, events = sent
    for name in ("GOODPUT_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, setting in variables.items():
        monkeypatch.setenv(name, setting)
    telemetry = Telemetry(url=url, rank=0, flush_interval=0.05)
    telemetry.record_step(0.1)
    closed(telemetry, events)
    assert {e["workload"] for e in events} == {workload}
    assert events[0]["event"] == "start" and events[0].get("run") == run
    assert all("run" not in e for e in events[1:])


def test_an_explicit_step_number_resets_the_count(sent: tuple[str, Events]) -> None:
    url, events = sent
    telemetry = telemetry_to(url, resumed_from_step=10)
    with telemetry.step(step=500):
        pass
    with telemetry.step():
        pass
    telemetry.record_step(0.5, step=7)
    with telemetry.step() as s:
        s.step = 42  # set inside the block
    telemetry.record_step(0.5)
    telemetry.record_step(0.5, step=MAX_COUNT)
    assert [e["step"] for e in of(closed(telemetry, events), "step")] == [500, 501, 7, 42, 43, MAX_COUNT]


def test_a_restart_with_resumed_from_step_resets_the_count(sent: tuple[str, Events]) -> None:
    url, events = sent
    telemetry = telemetry_to(url)
    for _ in range(3):
        telemetry.record_step(0.5)
    telemetry.lifecycle("restart", resumed_from_step=1)  # the checkpoint after step 1 reloaded: 2 and 3 again
    for _ in range(3):
        telemetry.record_step(0.5)
    telemetry.lifecycle("restart")  # none named: the count goes on
    telemetry.record_step(0.5)
    telemetry.lifecycle("restart", resumed_from_step=0)
    telemetry.record_step(0.5)
    closed(telemetry, events)
    assert [(e["type"], e.get("step", e.get("resumed_from_step"))) for e in events[1:-1]] == [
        ("step", 1), ("step", 2), ("step", 3), ("lifecycle", 1), ("step", 2), ("step", 3), ("step", 4),
        ("lifecycle", None), ("step", 5), ("lifecycle", 0), ("step", 1)]
    assert all(e["event"] == "restart" and "started_at" not in e for e in of(events, "lifecycle")[1:-1])


def test_a_step_number_out_of_range_is_left_out_and_the_step_sent(sent: tuple[str, Events],
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    url, events = sent
    with caplog.at_level("WARNING", logger="goodput_client"):
        telemetry = telemetry_to(url)
        for bad in (0, -3, 1.5, True, MAX_COUNT + 1, "7", None):
            telemetry.record_step(0.5, tokens=9, step=bad)  # type: ignore[arg-type]
        telemetry.lifecycle("restart", resumed_from_step=-1)  # not sent, and the count goes on
        telemetry.lifecycle("end", resumed_from_step=3)  # only with start or restart
        telemetry.record_step(0.5, tokens=9)
        closed(telemetry, events)
    steps = of(events, "step")
    assert [s.get("step") for s in steps] == [None, None, None, None, None, None, 7, 8]
    assert all(s["tokens"] == 9 and s["duration_seconds"] == 0.5 for s in steps)
    assert [e.get("resumed_from_step") for e in of(events, "lifecycle")] == [None, None, None, None]
    assert [r.getMessage() for r in caplog.records] == [
        f"goodput telemetry: step number 0 not sent: expected an int within [1, {MAX_COUNT}]",
        f"goodput telemetry: resumed_from_step=-1 not sent with 'restart': expected an int within [0, {MAX_COUNT}]"
        ", with 'start' or 'restart'"]


# --- FLOPs --------------------------------------------------------------------------------------------------


def test_flops_per_token_times_the_tokens_known_at_the_steps_end(sent: tuple[str, Events]) -> None:
    url, events = sent
    telemetry = telemetry_to(url, flops_per_token=1.5e9, dtype="fp8")
    with telemetry.step() as s:
        s.tokens = 2048  # known once the batch is
    with telemetry.step(tokens=4096, flops=5e12):  # the step's own figure wins
        pass
    telemetry.record_step(0.5, tokens=10)
    telemetry.record_step(0.5)  # no tokens: 0 FLOPs
    flops = [(e["flops"], e["dtype"]) for e in of(closed(telemetry, events), "step")]
    assert flops == [(3.072e12, "fp8"), (5e12, "fp8"), (1.5e10, "fp8"), (0.0, "fp8")]


def test_flops_per_step_and_the_default_dtype(sent: tuple[str, Events]) -> None:
    url, events = sent
    telemetry = telemetry_to(url, flops_per_step=3e15)
    with telemetry.step(tokens=7):
        pass
    telemetry.record_step(0.5, flops=1e15)
    with telemetry.step() as s:
        s.flops = 2e15
    flops = [(e["flops"], e["dtype"]) for e in of(closed(telemetry, events), "step")]
    assert flops == [(3e15, "bf16"), (1e15, "bf16"), (2e15, "bf16")]


def test_without_a_figure_a_step_carries_no_flops(sent: tuple[str, Events]) -> None:
    url, events = sent
    telemetry = telemetry_to(url, dtype="tf32")
    telemetry.record_step(0.5, tokens=100)
    telemetry.record_step(0.5, flops=7)
    first, second = of(closed(telemetry, events), "step")
    assert "flops" not in first and "dtype" not in first
    assert (second["flops"], second["dtype"]) == (7.0, "tf32")


def test_flops_that_are_no_count_are_left_out_and_the_step_sent(sent: tuple[str, Events],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    url, events = sent
    with caplog.at_level("WARNING", logger="goodput_client"):
        telemetry = telemetry_to(url, flops_per_token=1e20)
        for bad in (math.nan, math.inf, -1.0, 2e30, "many", True, 10**400):
            telemetry.record_step(0.5, tokens=3, flops=bad)  # type: ignore[arg-type]
        telemetry.record_step(0.5, tokens=10**11)  # per token times tokens: over MAX_FLOPS
        telemetry.record_step(0.5, tokens=2)
        closed(telemetry, events)
    steps = of(events, "step")
    assert [s.get("flops") for s in steps] == [None] * 8 + [2e20]
    assert [s.get("step") for s in steps] == list(range(1, 10))
    assert [r.getMessage() for r in caplog.records] == [
        "goodput telemetry: flops nan not sent: expected a finite number within [0, 1e+30]"]


# --- phases -------------------------------------------------------------------------------------------------


def test_checkpoint_is_recorded_as_checkpoint_save_with_one_warning(sent: tuple[str, Events],
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    url, events = sent
    with caplog.at_level("WARNING", logger="goodput_client"):
        telemetry = telemetry_to(url)
        for name in PHASES:  # every phase as it is, unwarned
            with telemetry.phase(name):
                pass
        for _ in range(2):
            with telemetry.phase("checkpoint"):
                pass
        telemetry.record_phase("checkpoint", 1.0)
        telemetry.record_phase("lunch", 1.0)
        closed(telemetry, events)
    assert [e["phase"] for e in of(events, "phase")] == [*PHASES, *["checkpoint_save"] * 3, "other"]
    assert {"checkpoint_save", "checkpoint_restore", "compile"} <= set(PHASES)
    assert [r.getMessage() for r in caplog.records] == [
        "goodput telemetry: phase 'checkpoint' is deprecated and recorded as 'checkpoint_save'; "
        "use 'checkpoint_save' instead",
        "goodput telemetry: unknown phase 'lunch' recorded as 'other'"]


# --- configuration ---------------------------------------------------------------------------------------------

BAD_CONFIGURATIONS = {
    "an unknown dtype": ({"dtype": "int8"}, "dtype='int8'"),
    "a dtype in capitals": ({"dtype": "BF16"}, "dtype='BF16'"),
    "a negative resumed_from_step": ({"resumed_from_step": -1}, "resumed_from_step=-1"),
    "a resumed_from_step that is a float": ({"resumed_from_step": 3.0}, "resumed_from_step=3.0"),
    "a resumed_from_step that is a string": ({"resumed_from_step": "3"}, "resumed_from_step='3'"),
    "a resumed_from_step that is a bool": ({"resumed_from_step": True}, "resumed_from_step=True"),
    "a resumed_from_step over MAX_COUNT": ({"resumed_from_step": MAX_COUNT + 1}, "resumed_from_step="),
    "both FLOPs figures": ({"flops_per_step": 1e15, "flops_per_token": 1e9}, "flops_per_step and flops_per_token"),
    "FLOPs per step NaN": ({"flops_per_step": math.nan}, "flops_per_step=nan"),
    "FLOPs per step negative": ({"flops_per_step": -1.0}, "flops_per_step=-1.0"),
    "FLOPs per token infinite": ({"flops_per_token": math.inf}, "flops_per_token=inf"),
    "FLOPs per token a string": ({"flops_per_token": "6e9"}, "flops_per_token='6e9'"),
}


@pytest.mark.parametrize(("kwargs", "message"), BAD_CONFIGURATIONS.values(), ids=BAD_CONFIGURATIONS.keys())
def test_a_bad_configuration_raises_at_construction(kwargs: dict[str, object], message: str) -> None:
    def senders() -> int:
        return sum(thread.name == "goodput-telemetry" for thread in threading.enumerate())

    before = senders()
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        Telemetry("w", 0, socket_path="/nonexistent/goodput.sock", **kwargs)  # type: ignore[arg-type]
    assert senders() == before  # raised before anything started


def test_every_dtype_and_resumed_from_step_zero_are_accepted() -> None:
    for dtype in FLOPS_DTYPES:
        telemetry = Telemetry("w", 0, socket_path="/nonexistent/goodput.sock", flush_interval=60, dtype=dtype,
                              resumed_from_step=0, flops_per_token=0)
        assert (telemetry.dtype, telemetry.resumed_from_step, telemetry.flops_per_token) == (dtype, 0, 0.0)
        telemetry.close(timeout=0.1)


# --- the decoder FLOPs helper ------------------------------------------------------------------------------------


def test_decoder_flops_per_token_by_hand() -> None:
    assert goodput_client.decoder_flops_per_token is goodput_client.flops.decoder_flops_per_token
    # GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, 96 heads of 128, context 2048):
    # 6 * 175e9 = 1.05e12 for the weights; 12 * 96 * 96 * 128 * 2048 = 28,991,029,248 for the attention
    assert decoder_flops_per_token(175e9, 96, 96, 128, 2048) == 1_078_991_029_248.0
    assert decoder_flops_per_token(1, 1, 1, 1, 1) == 18.0
    assert isinstance(decoder_flops_per_token(10, 1, 1, 1, 1), float)


def test_decoder_flops_per_token_gives_palms_own_mfu() -> None:
    """PaLM 540B (Chowdhery et al. 2022: 540.35e9 parameters, 118 layers, 48 heads of 256, sequences of 2048)
    trained at 238.3K tokens/s on 6144 TPU v4 chips of 275 TFLOP/s (bf16): 46.2% MFU, as the paper states."""
    per_token = decoder_flops_per_token(540.35e9, 118, 48, 256, 2048)
    assert per_token == 6 * 540.35e9 + 12 * 118 * 48 * 256 * 2048  # 3.2421e12 + 3.5635e10
    assert round(per_token * 238.3e3 / (6144 * 275e12), 3) == 0.462


BAD_SHAPES = {
    "no parameters": (0, 96, 96, 128, 2048),
    "negative parameters": (-1e9, 96, 96, 128, 2048),
    "NaN parameters": (math.nan, 96, 96, 128, 2048),
    "infinite parameters": (math.inf, 96, 96, 128, 2048),
    "parameters as a string": ("175e9", 96, 96, 128, 2048),
    "parameters as a bool": (True, 96, 96, 128, 2048),
    "no layers": (175e9, 0, 96, 128, 2048),
    "fractional heads": (175e9, 96, 95.5, 128, 2048),
    "a float head dimension": (175e9, 96, 96, 128.0, 2048),
    "a negative sequence": (175e9, 96, 96, 128, -2048),
    "a bool sequence": (175e9, 96, 96, 128, True),
}


@pytest.mark.parametrize("shape", BAD_SHAPES.values(), ids=BAD_SHAPES.keys())
def test_decoder_flops_per_token_refuses_a_bad_shape(shape: tuple[object, ...]) -> None:
    with pytest.raises(ValueError, match="expected"):
        decoder_flops_per_token(*shape)  # type: ignore[arg-type]


# --- against the daemon ---------------------------------------------------------------------------------------


def test_the_daemon_takes_all_the_client_sends(clock: ManualClock) -> None:
    config = quick_config()
    with live_server(config, backend=SimulatedGpus(1)) as live:
        telemetry = Telemetry("acct-live", 0, socket_path=config.ingest.socket_path, flush_interval=0.02,
                              resumed_from_step=4, flops_per_token=1e9, dtype="fp8")
        with telemetry.phase("checkpoint_restore"):
            clock.advance(2.0)
        for _ in range(3):
            with telemetry.step(tokens=1000), telemetry.phase("compute"):
                clock.advance(1.0)
        with telemetry.phase("checkpoint"):  # deprecated: checkpoint_save
            clock.advance(0.5)
        telemetry.record_step(0.25, tokens=1000, step=0)  # no number sent
        telemetry.lifecycle("restart", resumed_from_step=5)
        telemetry.record_step(0.25, tokens=1000, flops=math.nan)  # no FLOPs sent: step 6
        labels = {"workload": "acct-live", "rank": "0"}
        text = live.metrics_when("goodput_steps_total", 5, **labels)
        telemetry.close()
        assert (telemetry.sent, telemetry.dropped) == (1 + 1 + 3 * 2 + 1 + 1 + 1 + 1 + 1, 0)
    assert value(text, "goodput_step_number", **labels) == 6
    assert value(text, "goodput_model_flops_total", dtype="fp8", **labels) == 4 * 1e12
    assert value(text, "goodput_phase_seconds_total", phase="checkpoint_save", **labels) == 0.5
    assert value(text, "goodput_phase_seconds_total", phase="checkpoint_restore", **labels) == 2.0
    assert value(text, "goodput_phase_seconds_total", phase="compute", **labels) == 3.0
