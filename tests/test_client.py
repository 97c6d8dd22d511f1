"""goodput_client against a real daemon: a 2-rank PyTorch job (in a venv holding only PyTorch and
goodput-client), a slow rank, no daemon, load."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from conftest import ROOT, free_port, live_server, quick_config, series, socket_path, value, wait_for
from goodput_client import Telemetry, workload_folder

from exporter.sources.nvml.simulated import SimulatedGpus

if TYPE_CHECKING:
    from job_env import Venv

pytest_plugins = ["job_env"]  # the session's job venv: PyTorch and goodput-client only


def run_job(job_env: Venv, tmp_path: Path, sock: str, launcher: tuple[str, ...] = ("--standalone",),
            **env: str) -> dict[int, dict]:
    """Run train_ddp.py under the job venv's torchrun (`launcher`: its rendezvous arguments), outside the checkout;
    returns what each rank measured itself, after checking that the job saw only the installed client."""
    script = tmp_path / "train_ddp.py"  # not from tests/: nothing of the checkout on the job's sys.path
    shutil.copyfile(ROOT / "tests" / "train_ddp.py", script)
    result = subprocess.run(
        [str(job_env.bin("torchrun")), *launcher, "--nproc-per-node", "2", str(script)],
        env=job_env.environ(SOCKET=sock, OUT_DIR=str(tmp_path), **env), cwd=tmp_path, capture_output=True,
        text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    measured = {rank: json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)}
    for own in measured.values():
        environment = own.pop("environment")
        assert environment["daemon_modules"] == [], environment
        assert Path(environment["client_file"]).is_relative_to(job_env.root), environment
    return measured


def job_workload(live: object, steps: int) -> tuple[str, str]:
    """torchrun --standalone names the run (TORCHELASTIC_RUN_ID) itself: both ranks must share it."""
    found: list[str] = []

    def done() -> bool:
        text = live.metrics()  # type: ignore[attr-defined]
        rows = series(text, "goodput_steps_total")
        found[:] = [text]
        return len(rows) == 2 and all(value(text, "goodput_steps_total", **r) == steps for r in rows)

    wait_for(done)
    rows = series(found[0], "goodput_steps_total")
    assert {r["rank"] for r in rows} == {"0", "1"} and len({r["workload"] for r in rows}) == 1
    return rows[0]["workload"], found[0]


def phase_seconds(text: str, rank: int, phase: str, workload: str) -> float:
    return value(text, "goodput_phase_seconds_total", workload=workload, rank=str(rank), phase=phase)


def test_two_rank_job_reports_what_it_measured(job_env: Venv, tmp_path: Path) -> None:
    config = quick_config(flight={"dir": str(tmp_path / "fr"), "interval": "100ms"})
    with live_server(config, backend=SimulatedGpus(1)) as live:
        measured = run_job(job_env, tmp_path, config.ingest.socket_path, STEPS="12", FR_DIR=str(tmp_path / "fr"))
        workload, _ = job_workload(live, 12)
        # the periodic flight-recorder dumps reach the daemon's flight source: every all_reduce of
        # the job (weight and bias, every step), with the bytes of the gradients (16 + 1 floats)
        ops = {"workload": workload, "pg": "0", "op": "all_reduce"}
        for rank in ("0", "1"):
            live.metrics_when("goodput_collective_operations_total", 24, rank=rank, **ops)
            # and the dump written at close, every op completed: a periodic dump taken during the last all_reduce
            # already counts 24 ops, one in flight, until the flight source reads the last one
            live.metrics_when("goodput_collective_inflight", 0, rank=rank, workload=workload, pg="0")
        text = live.metrics()
    for rank in (0, 1):
        own = measured[rank]
        labels = {"workload": workload, "rank": str(rank)}
        assert own["dropped"] == 0 and own["sent"] == 12 * 4 + 2  # step, 3 phases per step; start, end
        assert value(text, "goodput_steps_total", **labels) == own["steps"] == 12
        assert value(text, "goodput_tokens_total", **labels) == own["tokens"] == 12 * 4 * 16
        assert value(text, "goodput_samples_total", **labels) == own["samples"] == 48
        eps = 1e-9  # float summation order
        for phase in ("compute", "comm_wait"):
            reported = phase_seconds(text, rank, phase, workload)
            assert own[f"{phase}_inner"] - eps <= reported <= own[f"{phase}_outer"] + eps, phase
        assert 0 < phase_seconds(text, rank, "data_wait", workload) <= own["data_wait_outer"] + eps
        step_sum = value(text, "goodput_step_duration_seconds_sum", **labels)
        assert own["step_inner"] - eps <= step_sum <= own["step_outer"] + eps
        assert value(text, "goodput_step_duration_seconds_count", **labels) == 12
        # the flight-recorder helper left this rank's buffer, as PyTorch wrote it, for the daemon
        assert own["dumps"] >= 1 and own["dump_errors"] == 0
        dump = pickle.loads((tmp_path / "fr" / workload / f"comm_lib_trace_rank_{rank}").read_bytes())
        names = [entry["profiling_name"] for entry in dump["entries"]]
        assert names.count("gloo:all_reduce") == 12 * 2  # weight and bias, every step
        assert value(text, "goodput_collective_bytes_total", rank=str(rank), **ops) == 12 * (16 + 1) * 4
        assert value(text, "goodput_collective_inflight", workload=workload, rank=str(rank), pg="0") == 0
    assert series(text, "goodput_collective_missing_rank") == []
    assert value(text, "goodput_flight_recorder_files") == 2


def test_a_torchrun_job_named_by_its_master_address_has_one_workload_in_both_sources(job_env: Venv,
                                                                                       tmp_path: Path) -> None:
    """torchrun with static rendezvous names no run (TORCHELASTIC_RUN_ID=none): the client names the job
    `<host>/127.0.0.1:<port>`, which no folder name can hold as it is. Its flight-recorder folder is written
    reversibly, and the flight series carry the same `workload` as the ingest series."""
    port = free_port()
    config = quick_config(flight={"dir": str(tmp_path / "fr"), "interval": "100ms"})
    with live_server(config, backend=SimulatedGpus(1)) as live:
        run_job(job_env, tmp_path, config.ingest.socket_path, STEPS="4", FR_DIR=str(tmp_path / "fr"),
                launcher=("--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port", str(port)))
        workload, _ = job_workload(live, 4)
        assert workload == f"{socket.gethostname().partition('.')[0]}/127.0.0.1:{port}"
        assert [p.name for p in (tmp_path / "fr").iterdir()] == [workload_folder(workload)]
        for rank in ("0", "1"):
            live.metrics_when("goodput_collective_operations_total", 8, rank=rank, workload=workload, pg="0",
                              op="all_reduce")
        text = live.metrics()
    assert {s["workload"] for s in series(text, "goodput_collective_operations_total")} == {workload}


def test_a_slow_data_loader_shows_on_its_rank(job_env: Venv, tmp_path: Path) -> None:
    config = quick_config()
    steps, slow = 8, 0.15
    with live_server(config, backend=SimulatedGpus(1)) as live:
        measured = run_job(job_env, tmp_path, config.ingest.socket_path, STEPS=str(steps), SLOW_RANK="1",
                           SLOW_SECONDS=str(slow))
        workload, text = job_workload(live, steps)
    slow_wait = phase_seconds(text, 1, "data_wait", workload)
    fast_wait = phase_seconds(text, 0, "data_wait", workload)
    assert steps * slow * 0.9 <= slow_wait <= measured[1]["data_wait_outer"] + 1e-9
    assert fast_wait < slow_wait / 5
    # the fast rank waits for the slow one inside the all-reduce
    assert phase_seconds(text, 0, "comm_wait", workload) > phase_seconds(text, 1, "comm_wait", workload)
    slow_steps = value(text, "goodput_step_duration_seconds_sum", workload=workload, rank="1")
    assert slow_steps >= steps * slow * 0.9


def test_without_a_daemon_nothing_raises_or_blocks(tmp_path: Path) -> None:
    telemetry = Telemetry("w", 0, socket_path=str(tmp_path / "absent.sock"), flush_interval=0.05)
    started = time.perf_counter()
    for _ in range(1000):
        with telemetry.step(tokens=1), telemetry.phase("compute"):
            pass
    assert time.perf_counter() - started < 0.5
    assert not telemetry.flush(2.0) or telemetry.sent == 0
    telemetry.close()
    assert telemetry.sent == 0 and telemetry.dropped == 2000 + 2  # start and end too


def test_a_daemon_that_never_answers_does_not_block_the_loop(tmp_path: Path) -> None:
    path = str(tmp_path / "stuck.sock")
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stuck.bind(path)
    stuck.listen(1)  # accepts connections, never answers
    try:
        telemetry = Telemetry("w", 0, socket_path=path, flush_interval=0.01, timeout=0.3)
        time.sleep(0.05)  # the sender is now stuck on the first request
        started = time.perf_counter()
        for _ in range(500):
            telemetry.record_phase("compute", 0.001)
        assert time.perf_counter() - started < 0.1
        telemetry.close(timeout=3)
        # a batch written into the connection's buffer is unanswered (it may have been read); one that could not
        # connect in time is dropped
        assert telemetry.sent == 0 and telemetry.dropped + telemetry.unknown == 500 + 2
        assert telemetry.unknown >= 1
    finally:
        stuck.close()


def test_a_batch_sent_whole_and_not_answered_in_time_is_unknown_not_dropped(tmp_path: Path) -> None:
    """A daemon that reads each request whole and answers after the client's timeout: the client cannot know whether
    it applied the batch, so its events are counted in `unknown`, never in `dropped` or `sent`."""
    path = str(tmp_path / "slow.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    requests: list[bytes] = []

    def read_and_wait() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            requests.append(body)
            time.sleep(1.0)  # past the client's 0.3 s timeout
            conn.close()

    threading.Thread(target=read_and_wait, daemon=True).start()
    try:
        telemetry = Telemetry("w", 0, socket_path=path, flush_interval=0.01, timeout=0.3)
        for _ in range(10):
            telemetry.record_phase("compute", 0.001)
        telemetry.close(timeout=5)
        assert requests, "the server read no request"
        sent_events = sum(len(json.loads(body)["events"]) for body in requests)
        assert telemetry.sent == 0 and telemetry.dropped == 0
        assert telemetry.unknown == sent_events == 10 + 2  # start and end too
    finally:
        server.close()


def test_no_daemon_at_all_is_dropped_not_unknown(tmp_path: Path) -> None:
    telemetry = Telemetry("w", 0, socket_path=str(tmp_path / "absent.sock"), flush_interval=0.01)
    telemetry.record_phase("compute", 0.001)
    telemetry.close(timeout=2)
    assert telemetry.unknown == 0 and telemetry.dropped == 1 + 2


def test_bounded_queue_drops_and_counts(tmp_path: Path) -> None:
    telemetry = Telemetry("w", 0, socket_path=str(tmp_path / "absent.sock"), flush_interval=60, max_queue=10)
    for _ in range(25):
        telemetry.record_phase("compute", 0.1)
    assert telemetry.dropped == 25 + 1 - 10  # the start event took one place
    telemetry.close(timeout=1)


def test_launcher_environment_names_the_rank(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-42")
    monkeypatch.setenv("RANK", "3")
    telemetry = Telemetry(socket_path=str(tmp_path / "x.sock"), flush_interval=60)
    assert (telemetry.workload, telemetry.rank) == ("run-42", 3)
    telemetry.phase("lunch")  # unknown phase: recorded as other, never raised
    telemetry.close(timeout=0.5)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    monkeypatch.setenv("SLURM_PROCID", "5")
    telemetry = Telemetry(socket_path=str(tmp_path / "x.sock"), flush_interval=60)
    assert (telemetry.workload, telemetry.rank) == ("777", 5)
    telemetry.close(timeout=0.5)


LOAD_CLIENT = """
import sys
from goodput_client import Telemetry
sock, rank, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = Telemetry("load", rank, socket_path=sock, flush_interval=0.02, max_queue=10**6)
for i in range(count):
    t.record_phase("compute", 0.001)
    if i % 10 == 0:
        t.record_step(0.01, tokens=100, samples=1)
t.close(timeout=60)
print(t.sent, t.dropped)
"""


def test_sixteen_clients_under_load_lose_nothing_and_scrapes_keep_answering() -> None:
    config = quick_config(ingest={"socket_path": socket_path()})
    per_client = 5000
    with live_server(config, backend=SimulatedGpus(8)) as live:
        scrape_times: list[float] = []
        stop = threading.Event()

        def scrape() -> None:
            with httpx.Client(base_url=live.url, timeout=10) as client:
                while not stop.is_set():
                    started = time.perf_counter()
                    assert client.get("/metrics").status_code == 200
                    scrape_times.append(time.perf_counter() - started)
                    stop.wait(0.1)

        scraper = threading.Thread(target=scrape)
        scraper.start()
        procs = [subprocess.Popen([sys.executable, "-c", LOAD_CLIENT, config.ingest.socket_path, str(rank),
                                   str(per_client)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
                 for rank in range(16)]
        results = [proc.communicate(timeout=180)[0].split() for proc in procs]
        stop.set()
        scraper.join(10)
        sent = sum(int(r[0]) for r in results)
        dropped = sum(int(r[1]) for r in results)
        expected = 16 * (per_client + per_client // 10 + 2)
        assert (sent, dropped) == (expected, 0)
        text = live.metrics_when("goodput_ingest_events_accepted_total", 16 * per_client, type="phase")
        assert sum(value(text, "goodput_steps_total", workload="load", rank=str(r)) for r in range(16)) \
            == 16 * per_client // 10
        assert len(scrape_times) >= 5 and max(scrape_times) < 5.0


def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Instrument your training loop", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "example.py"
    script.write_text(code)
    config = quick_config()
    with live_server(config, backend=SimulatedGpus(1)) as live:
        env = {**os.environ, "GOODPUT_INGEST_SOCKET_PATH": config.ingest.socket_path, "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=60)
        text = live.metrics_when("goodput_steps_total", 20, workload="demo", rank="0")
    assert value(text, "goodput_phase_seconds_total", workload="demo", rank="0", phase="compute") >= 20 * 0.02
