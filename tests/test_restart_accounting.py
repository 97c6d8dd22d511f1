"""Restart accounting against the real daemon (`goodput-exporter` as a child process) and a real 2-rank torchrun
job (tests/train_resume.py, gloo on CPU, in a venv holding only PyTorch and goodput-client) that checkpoints every
4 steps, crashes in step 11 on its first attempt and is restarted by torchrun (`--max-restarts=1`), resuming from
step 8's checkpoint. Every figure the daemon reports is compared with the job's own timing log.

    a. one daemon throughout;
    b. the daemon stopped (SIGTERM: a clean shutdown writes its state file) after the crash and started again on
       the same state_dir before the resume;
    c. a corrupt state file: counted, logged, set aside and replaced, and the daemon serves on.

Why 2% of the downtime is meaningful: the downtime is a torchrun restart (the old workers stopped, new ones
started, PyTorch imported, the process group formed): 2 to 3 s here, and at least MIN_DOWNTIME (asserted), so 2%
of it is tens of milliseconds, while the job's log and the daemon read the same clocks (the daemon's figures come
from the client's started_at and elapsed readings, taken within a millisecond of the log's own). The wasted
seconds are two steps of ~0.1 s (an 80 ms sleep in compute), of which 2% is ~4 ms; the loop's perf_counter around
the `with` block and the client's own reading inside it differ by the block's entry and exit, microseconds.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from conftest import ROOT, free_port, samples, series, socket_path, value, wait_for
from full_disk import small_disk
from goodput_client import Telemetry

from exporter.sources.ingest.state import saved_accounts

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from job_env import Venv

pytest_plugins = ["job_env"]  # the session's job venv: PyTorch and goodput-client only

STEPS, EVERY, CRASH_STEP = 14, 4, 11
RESUMED = (CRASH_STEP - 1) // EVERY * EVERY  # the last checkpoint before the crash: step 8
REDONE = list(range(RESUMED + 1, CRASH_STEP))  # completed and reported before the crash, run again: 9, 10
STATE_FILE = "ingest-state.json"
MIN_DOWNTIME = 0.5  # seconds; 2% of it (10 ms) is still far above what the log's and the client's readings differ by


# --- the daemon ---------------------------------------------------------------------------------------------


@dataclass
class Daemon:
    proc: subprocess.Popen[str]
    url: str

    def metrics(self) -> str:
        response = httpx.get(f"{self.url}/metrics", timeout=5)
        response.raise_for_status()
        return response.text

    def metrics_when(self, predicate: Callable[[str], bool], timeout: float = 30) -> str:
        found: list[str] = []

        def check() -> bool:
            found[:] = [self.metrics()]
            return predicate(found[0])

        wait_for(check, timeout=timeout)
        return found[0]

    def stop(self) -> str:
        """SIGTERM, a clean shutdown; returns its log."""
        self.proc.send_signal(signal.SIGTERM)
        output, _ = self.proc.communicate(timeout=20)
        assert self.proc.returncode == 0, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
        return output


def start_daemon(spawn_cli: Callable[..., subprocess.Popen[str]], sock: str, state_dir: Path) -> Daemon:
    """The real command line, with only the ingest source on."""
    port = free_port()
    proc = spawn_cli("--web.listen-address", f"127.0.0.1:{port}", "--ingest.socket-path", sock,
                     "--ingest.state-dir", str(state_dir), "--ingest.interval", "100ms",
                     *(arg for name in ("nvml", "host", "fabric", "flight", "kubelet", "process")
                       for arg in (f"--{name}.enabled", "false")))
    daemon = Daemon(proc, f"http://127.0.0.1:{port}")

    def ready() -> bool:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        try:
            return httpx.get(f"{daemon.url}/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(ready, timeout=30)
    return daemon


def lifecycle_events(count: int) -> Callable[[str], bool]:
    """The exposition shows `count` lifecycle events accepted: collected in the same snapshot as the accounts."""
    return lambda text: value(text, "goodput_ingest_events_accepted_total", type="lifecycle") == count


# --- the job ------------------------------------------------------------------------------------------------


@contextmanager
def running_job(job_env: Venv, out: Path, sock: str, **env: str) -> Iterator[subprocess.Popen[str]]:
    """train_resume.py under the job venv's torchrun, outside the checkout, with one restart allowed; stopped
    (SIGTERM: torchrun passes it on to its workers, which run in sessions of their own) if still running at the
    end."""
    out.mkdir(exist_ok=True)
    script = out / "train_resume.py"  # not from tests/: nothing of the checkout on the job's sys.path
    shutil.copyfile(ROOT / "tests" / "train_resume.py", script)
    job = subprocess.Popen(
        [str(job_env.bin("torchrun")), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
         "--monitor-interval", "0.1", str(script)],
        env=job_env.environ(SOCKET=sock, OUT_DIR=str(out), STEPS=str(STEPS), CHECKPOINT_EVERY=str(EVERY),
                            CRASH_STEP=str(CRASH_STEP), **env),
        cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield job
    finally:
        if job.poll() is None:
            job.terminate()
            try:
                job.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                job.kill()
                job.communicate()


def finish(job: subprocess.Popen[str]) -> str:
    output, _ = job.communicate(timeout=240)
    assert job.returncode == 0, output[-5000:]
    return output


@dataclass
class Attempt:
    """One process of one rank, as its own log tells it."""

    started_at: float
    resumed_from_step: int | None
    workload: str
    restored: int | None
    steps: dict[int, float]  # step number: its duration as the loop measured it
    checkpoints: list[int]
    elapsed: float  # perf_counter seconds from Telemetry creation to the client's close()
    last_event_wall: float  # the wall time of its last event (the "end" that close() sends)
    finished: bool
    error: str | None


def read_log(path: Path) -> Attempt:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    kinds = [r["event"] for r in records]
    assert kinds[0] == "telemetry" and kinds[-1] == "close" and kinds.count("close") == 1, kinds
    telemetry, close = records[0], records[-1]
    steps = {r["step"]: r["duration"] for r in records if r["event"] == "step"}
    restored = [r["step"] for r in records if r["event"] == "restored"]
    return Attempt(telemetry["started_at"], telemetry["resumed_from_step"], telemetry["workload"],
                   restored[0] if restored else None, steps,
                   [r["step"] for r in records if r["event"] == "checkpoint"], close["elapsed"],
                   close["last_event_wall"], close["finished"], close["error"])


def read_logs(out: Path) -> dict[int, tuple[Attempt, Attempt]]:
    """Each rank's two attempts, after checking that the job did what it was made to do."""
    logs = {rank: (read_log(out / f"rank-{rank}-attempt-0.json"), read_log(out / f"rank-{rank}-attempt-1.json"))
            for rank in (0, 1)}
    assert not (out / "rank-0-attempt-2.json").exists()
    for rank, (first, second) in logs.items():
        # the first attempt completed steps 1..10 (both ranks: rank 0 waits for rank 1 in every all-reduce),
        # checkpointed 4 and 8, and failed in step 11: rank 1 by its own error, rank 0 in its all-reduce or by
        # torchrun's SIGTERM
        assert (first.resumed_from_step, first.restored) == (None, None)
        assert sorted(first.steps) == list(range(1, CRASH_STEP)), first.steps
        assert first.checkpoints == [EVERY, 2 * EVERY]
        assert not first.finished and first.error, first
        if rank == 1:
            assert f"simulated crash of rank 1 in step {CRASH_STEP}" in first.error
        # the second resumed from step 8's checkpoint and ran 9..14 to the end
        assert (second.resumed_from_step, second.restored) == (RESUMED, RESUMED)
        assert sorted(second.steps) == list(range(RESUMED + 1, STEPS + 1)), second.steps
        assert second.finished and second.error is None, second
        assert sorted(set(first.steps) & set(second.steps)) == REDONE
        assert second.workload == first.workload  # one torchrun run: one TORCHELASTIC_RUN_ID
    assert len({first.workload for first, _ in logs.values()}) == 1
    return logs


# --- the comparison ------------------------------------------------------------------------------------------


def account(text: str, workload: str, rank: int) -> dict[str, float]:
    labels = {"workload": workload, "rank": str(rank)}
    figures = {name: value(text, f"goodput_{name}", **labels) for name in (
        "elapsed_seconds_total", "downtime_seconds_total", "wasted_steps_total", "wasted_seconds_total",
        "wasted_compute_seconds_total", "step_number", "workload_restarts_total")}
    phases = {row["phase"]: value(text, "goodput_phase_seconds_total", **row)
              for row in series(text, "goodput_phase_seconds_total")
              if row["workload"] == workload and row["rank"] == str(rank)}
    assert None not in figures.values() and "untracked" in phases, (figures, phases)
    return {**figures, **{f"phase:{name}": seconds for name, seconds in phases.items()}}


def phase_sum(figures: dict[str, float]) -> float:
    return math.fsum(v for k, v in figures.items() if k.startswith("phase:"))


def check_accounting(text: str, logs: dict[int, tuple[Attempt, Attempt]], report: str) -> None:
    """Acceptance 1's equalities, per rank, between the daemon's exposition and the job's logs."""
    workload = logs[0][0].workload
    for rank, (first, second) in logs.items():
        figures = account(text, workload, rank)
        wasted_seconds = math.fsum(first.steps[n] for n in REDONE)  # their first durations
        downtime = second.started_at - first.last_event_wall
        elapsed = first.elapsed + second.elapsed
        print(f"\n[{report}] rank {rank}: expected (from the job's log) vs the daemon's"
              f"\n  wasted steps    {len(REDONE)} vs {figures['wasted_steps_total']:g}"
              f"\n  wasted seconds  {wasted_seconds:.6f} vs {figures['wasted_seconds_total']:.6f}"
              f"\n  downtime        {downtime:.6f} vs {figures['downtime_seconds_total']:.6f}"
              f"\n  elapsed         {elapsed:.6f} ({first.elapsed:.6f} + {second.elapsed:.6f}) vs "
              f"{figures['elapsed_seconds_total']:.6f}"
              f"\n  sum of phases   {phase_sum(figures):.6f} (untracked {figures['phase:untracked']:.6f}) vs "
              f"elapsed {figures['elapsed_seconds_total']:.6f}"
              f"\n  wasted compute  {figures['wasted_compute_seconds_total']:.6f}")
        assert figures["wasted_steps_total"] == len(REDONE)
        assert figures["wasted_seconds_total"] == pytest.approx(wasted_seconds, rel=0.02)
        assert downtime >= MIN_DOWNTIME, f"a downtime of {downtime:.3f} s is too short for a 2% comparison"
        assert figures["downtime_seconds_total"] == pytest.approx(downtime, rel=0.02)
        assert phase_sum(figures) == pytest.approx(figures["elapsed_seconds_total"], rel=0.01)
        assert figures["elapsed_seconds_total"] == pytest.approx(elapsed, rel=0.01)
        # the rest of the picture: the redone steps' compute (an 80 ms sleep each) is part of their seconds,
        # every phase the job has shows, and so does the time between them
        assert len(REDONE) * 0.08 <= figures["wasted_compute_seconds_total"] <= figures["wasted_seconds_total"]
        for phase in ("compute", "data_wait", "comm_wait", "checkpoint_save", "checkpoint_restore", "untracked"):
            assert figures[f"phase:{phase}"] > 0, phase
        assert (figures["step_number"], figures["workload_restarts_total"]) == (STEPS, 1)


# --- a. one daemon throughout ---------------------------------------------------------------------------------


def test_a_crash_and_torchrun_restart_are_accounted(job_env: Venv, tmp_path: Path, spawn_cli) -> None:  # type: ignore[no-untyped-def]
    sock = socket_path()
    daemon = start_daemon(spawn_cli, sock, tmp_path / "state")
    with running_job(job_env, tmp_path / "job", sock) as job:
        finish(job)
    logs = read_logs(tmp_path / "job")
    text = daemon.metrics_when(lifecycle_events(2 * 4))  # per rank: start, end, restart, end
    check_accounting(text, logs, "one daemon")
    assert value(text, "goodput_ingest_state_errors_total", reason="corrupt") == 0
    daemon.stop()


# --- b. the daemon restarted while the job is down --------------------------------------------------------------


def test_b_a_daemon_restart_between_crash_and_resume_loses_and_doubles_nothing(
        job_env: Venv, tmp_path: Path, spawn_cli) -> None:  # type: ignore[no-untyped-def]
    """The restarted workers wait for a gate file before creating their Telemetry (each first leaves a marker):
    once both markers are there, the first attempt's processes have all exited (torchrun restarts a failed
    attempt's workers only after stopping them all), their close() has delivered their last events, and nothing
    of the second attempt has been sent. The test then stops the daemon, starts it again on the same state_dir
    and socket, and opens the gate. The gate's wait is part of the downtime, as the logs measure it."""
    sock, state_dir, out = socket_path(), tmp_path / "state", tmp_path / "job"
    gate = tmp_path / "gate"
    daemon = start_daemon(spawn_cli, sock, state_dir)
    with running_job(job_env, out, sock, GATE=str(gate)) as job:
        wait_for(lambda: all((out / f"rank-{rank}-attempt-1.waiting").exists() for rank in (0, 1)) or job.poll(),
                 timeout=120)
        assert job.poll() is None, job.communicate()[0][-5000:]
        before = daemon.metrics_when(lifecycle_events(2 * 2))  # per rank: start, end
        first_log = daemon.stop()
        saved = json.loads((state_dir / STATE_FILE).read_text())  # a clean shutdown writes a whole snapshot
        assert saved["version"] == 2 and len(saved["accounts"]) == 2, saved
        daemon = start_daemon(spawn_cli, sock, state_dir)
        gate.touch()
        finish(job)
    logs = read_logs(out)
    text = daemon.metrics_when(lifecycle_events(2 * 2))  # per rank: restart, end
    check_accounting(text, logs, "daemon restarted")
    workload = logs[0][0].workload
    for rank, (first, second) in logs.items():
        old, new = account(before, workload, rank), account(text, workload, rank)
        # the first daemon had the first attempt and nothing of a restart
        assert old["elapsed_seconds_total"] == pytest.approx(first.elapsed, rel=0.01)
        assert (old["downtime_seconds_total"], old["wasted_steps_total"], old["phase:checkpoint_restore"]) == (0, 0, 0)
        # the second continued from where the first stopped: what it adds is the second attempt, once
        assert new["elapsed_seconds_total"] - old["elapsed_seconds_total"] == pytest.approx(second.elapsed, rel=0.01)
        for key, seconds in old.items():
            if key.startswith("phase:"):
                assert new[key] >= seconds, key
        print(f"\n[daemon restarted] rank {rank}: first daemon's elapsed {old['elapsed_seconds_total']:.6f} "
              f"vs the first attempt's {first.elapsed:.6f}; the second daemon added "
              f"{new['elapsed_seconds_total'] - old['elapsed_seconds_total']:.6f} vs the second attempt's "
              f"{second.elapsed:.6f}")
    assert value(text, "goodput_ingest_state_errors_total", reason="corrupt") == 0
    second_log = daemon.stop()
    assert "restored the accounting of 2 ranks" in second_log, second_log[-3000:]
    assert "is corrupt" not in first_log + second_log


# --- d. kill -9, on a disk with room and on a full one -------------------------------------------------------------

KILLED = "killed"


@contextmanager
def running_ranks(sock: str, ranks: int = 2) -> Iterator[None]:
    """`ranks` ranks of one workload, each a Telemetry on a thread of this process, stepping (10 ms of compute, 64
    tokens, 2 samples a step) until the block ends."""
    stop = threading.Event()

    def run(rank: int) -> None:
        telemetry = Telemetry(KILLED, rank, socket_path=sock, flush_interval=0.05, captures=False, timeout=0.5)
        while not stop.is_set():
            with telemetry.step(tokens=64, samples=2), telemetry.phase("compute"):
                time.sleep(0.01)
        telemetry.close(timeout=2)

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(ranks)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


def rank_counters(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every counter of the workload's ranks (the step duration histogram's too)."""
    return {(name, labels): figure for (name, labels), figure in samples(text).items()
            if name.endswith(("_total", "_count", "_sum", "_bucket")) and (("workload", KILLED) in labels)}


def killed_and_restarted(daemon: Daemon, spawn_cli, sock: str, state_dir: Path) -> tuple[dict, dict, Daemon]:  # type: ignore[no-untyped-def,type-arg]
    """The counters a scrape saw last, kill -9, a restart on the same state_dir, and the counters once both ranks
    report again."""
    before = rank_counters(daemon.metrics())
    daemon.proc.kill()
    daemon.proc.wait(10)
    daemon = start_daemon(spawn_cli, sock, state_dir)
    text = daemon.metrics_when(lambda t: all(value(t, "goodput_steps_total", workload=KILLED, rank=r) is not None
                                             for r in ("0", "1")))  # the first scrape with both ranks live again
    return before, rank_counters(text), daemon


def value_of(counters: dict, name: str, rank: str) -> float:  # type: ignore[type-arg]
    (figure,) = [v for (n, labels), v in counters.items() if n == name and ("rank", rank) in labels]
    return figure


def check_none_lower(before: dict, after: dict, report: str) -> None:  # type: ignore[type-arg]
    lower = {f"{n}{dict(labels)}": (figure, after.get((n, labels))) for (n, labels), figure in before.items()
             if after.get((n, labels), -1.0) < figure}
    assert not lower, f"{report}: counters lower after the restart (before, after): {lower}"
    assert {n for n, _ in before} >= {"goodput_steps_total", "goodput_tokens_total", "goodput_samples_total",
                                       "goodput_elapsed_seconds_total", "goodput_phase_seconds_total",
                                       "goodput_step_duration_seconds_count", "goodput_step_time_shifts_total",
                                       "goodput_workload_restarts_total"}


def test_d_kill_9_then_a_full_disk_and_kill_9_again_moves_no_counter_back(tmp_path: Path, spawn_cli) -> None:  # type: ignore[no-untyped-def]
    """A 2-rank job keeps stepping while its node's daemon is killed (SIGKILL) and started again twice: once with
    room on the state directory's file system, once with it full (a real tmpfs, filled). Each time, every counter of
    every rank (steps, tokens and samples too) continues from at least what the last scrape before the kill saw."""
    sock = socket_path()
    with small_disk(tmp_path / "state") as disk:
        daemon = start_daemon(spawn_cli, sock, disk.path)
        with running_ranks(sock):
            daemon.metrics_when(lambda t: (value(t, "goodput_steps_total", workload=KILLED, rank="1") or 0) >= 20)
            before, after, daemon = killed_and_restarted(daemon, spawn_cli, sock, disk.path)
            check_none_lower(before, after, "kill -9")
            print(f"\n[kill -9] rank 0 steps {value_of(before, 'goodput_steps_total', '0'):.0f} -> "
                  f"{value_of(after, 'goodput_steps_total', '0'):.0f}")

            disk.fill()
            filled = value(daemon.metrics(), "goodput_steps_total", workload=KILLED, rank="0") or 0
            daemon.metrics_when(lambda t: (value(t, "goodput_steps_total", workload=KILLED, rank="0") or 0)
                                >= filled + 20)  # collects on the full disk
            before, after, daemon = killed_and_restarted(daemon, spawn_cli, sock, disk.path)
            check_none_lower(before, after, "kill -9 on a full disk")
            print(f"[kill -9, full disk] rank 0 steps {value_of(before, 'goodput_steps_total', '0'):.0f} -> "
                  f"{value_of(after, 'goodput_steps_total', '0'):.0f}, elapsed "
                  f"{value_of(before, 'goodput_elapsed_seconds_total', '0'):.2f} -> "
                  f"{value_of(after, 'goodput_elapsed_seconds_total', '0'):.2f}")
        disk.free()
        daemon.stop()


def test_e_a_disk_full_from_the_start_withholds_the_counters_so_kill_9_moves_none_back(
        tmp_path: Path, spawn_cli) -> None:  # type: ignore[no-untyped-def]
    """The state directory's file system (a real 2 MiB tmpfs) is full before the daemon starts, so not one save
    succeeds: a 2-rank job reports for a few seconds, every scrape is kept, the daemon is killed (SIGKILL), the disk
    freed and the daemon started again. No counter series of the job is lower after the restart than in any scrape
    before the kill: while nothing of an account could be saved, its counters were withheld (counted, logged), its
    gauges shown; once the daemon can save, they are published."""
    sock = socket_path()
    with small_disk(tmp_path / "state", "2m") as disk:
        disk.fill()
        daemon = start_daemon(spawn_cli, sock, disk.path)
        seen: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}  # each series' highest figure in any scrape
        scrapes: list[str] = []

        def scrape() -> str:
            text = daemon.metrics()
            scrapes.append(text)
            for key, figure in rank_counters(text).items():
                seen[key] = max(figure, seen.get(key, figure))
            return text

        def stepped(text: str, at_least: float) -> bool:
            return all((value(text, "goodput_step_number", workload=KILLED, rank=r) or 0) >= at_least for r in "01")

        with running_ranks(sock):
            wait_for(lambda: stepped(scrape(), 100), timeout=30, interval=0.02)  # ~1.5 s of job, scraped throughout
            last = scrape()
            assert value(last, "goodput_ingest_state_withheld_ranks") == 2
            assert (value(last, "goodput_ingest_state_errors_total", reason="unwritable") or 0) > 0
            assert value(last, "goodput_workload_last_event_timestamp_seconds", workload=KILLED, rank="0")
            step_before = value(last, "goodput_step_number", workload=KILLED, rank="0")
            daemon.proc.kill()
            log = daemon.proc.communicate(timeout=10)[0]
            assert "withheld" in log and "Traceback" not in log, log[-3000:]

            disk.free()
            daemon = start_daemon(spawn_cli, sock, disk.path)
            text = daemon.metrics_when(lambda t: all(value(t, "goodput_steps_total", workload=KILLED, rank=r)
                                                     is not None for r in "01"))  # published: saved
            after = rank_counters(text)
            assert value(text, "goodput_ingest_state_withheld_ranks") == 0
            assert value(text, "goodput_step_number", workload=KILLED, rank="0") >= step_before
        lower = {f"{n}{dict(labels)}": (figure, after.get((n, labels))) for (n, labels), figure in seen.items()
                 if after.get((n, labels), -1.0) < figure}
        assert not lower, f"counters lower after the restart than a scrape before the kill saw (seen, after): {lower}"
        assert len(after) >= 30 and {n for n, _ in after} >= {
            "goodput_steps_total", "goodput_tokens_total", "goodput_elapsed_seconds_total",
            "goodput_step_duration_seconds_bucket"}  # the job's counters, all back once the daemon could save
        print(f"\n[disk full from the start, kill -9] {len(scrapes)} scrapes before the kill saw {len(seen)} counter "
              f"series of the job (step number {step_before:.0f}); after the restart {len(after)}, rank 0 steps "
              f"{value_of(after, 'goodput_steps_total', '0'):.0f}")
        daemon.stop()


# --- c. a corrupt state file ------------------------------------------------------------------------------------

CORRUPT = {
    "binary garbage": b"\x00\x9f\xff\xfe{\"version\": 1\x80\x81 not json \xc3\x28",
    "zero-filled": b"\x00" * 64,  # what a crash mid-write can leave on some file systems
    "truncated": b'{"version": 1, "accounts": [{"workload": "w", "rank": "0", "acc',
    "a list": b"[1, 2, 3]",
    "accounts not a list": b'{"version": 1, "accounts": {"w": 1}}',
}


@pytest.mark.parametrize("content", list(CORRUPT.values()), ids=list(CORRUPT))
def test_c_a_corrupt_state_file_is_counted_logged_set_aside_and_replaced(
        tmp_path: Path, spawn_cli, content: bytes) -> None:  # type: ignore[no-untyped-def]
    state_dir, sock = tmp_path / "state", socket_path()
    state_dir.mkdir()
    (state_dir / STATE_FILE).write_bytes(content)
    daemon = start_daemon(spawn_cli, sock, state_dir)
    text = daemon.metrics_when(lambda t: value(t, "goodput_ingest_state_errors_total", reason="corrupt") is not None)
    assert value(text, "goodput_ingest_state_errors_total", reason="corrupt") == 1
    assert value(text, "goodput_ingest_state_errors_total", reason="unreadable") == 0
    assert (state_dir / f"{STATE_FILE}.corrupt").read_bytes() == content  # set aside, as it was
    assert not (state_dir / STATE_FILE).exists()
    report_to(sock)
    wait_for(lambda: saved_account(state_dir / STATE_FILE), timeout=15)  # the next write: a valid file
    text = daemon.metrics()  # and the daemon serves on, with the rank's accounting
    assert value(text, "goodput_elapsed_seconds_total", workload="corrupt-test", rank="0") > 0
    assert value(text, "goodput_ingest_state_errors_total", reason="corrupt") == 1
    log = daemon.stop()
    assert "is corrupt" in log and f"{STATE_FILE}.corrupt" in log, log[-3000:]


def test_c_a_malformed_account_is_counted_logged_and_replaced(tmp_path: Path, spawn_cli) -> None:  # type: ignore[no-untyped-def]
    """A file of the right shape holding an account this version did not write: the daemon restores the others
    and counts the file as corrupt."""
    state_dir, sock = tmp_path / "state", socket_path()
    state_dir.mkdir()
    content = json.dumps({"version": 1, "accounts": [{"workload": "w", "rank": "0", "account": {"phases": "x"}}]})
    (state_dir / STATE_FILE).write_text(content)
    daemon = start_daemon(spawn_cli, sock, state_dir)
    text = daemon.metrics_when(lambda t: value(t, "goodput_ingest_state_errors_total", reason="corrupt") is not None)
    assert value(text, "goodput_ingest_state_errors_total", reason="corrupt") == 1
    assert (state_dir / f"{STATE_FILE}.corrupt").read_text() == content  # a copy kept for a look
    report_to(sock)
    wait_for(lambda: saved_account(state_dir / STATE_FILE), timeout=15)
    saved = json.loads((state_dir / STATE_FILE).read_text())
    assert [(a["workload"], a["rank"]) for a in saved["accounts"]] == [("corrupt-test", "0")]
    log = daemon.stop()
    assert "malformed" in log, log[-3000:]


def report_to(sock: str) -> None:
    """A few events of a rank, from this process's client."""
    telemetry = Telemetry("corrupt-test", 0, socket_path=sock, flush_interval=0.02)
    with telemetry.step(), telemetry.phase("compute"):
        time.sleep(0.01)
    telemetry.close()
    assert (telemetry.sent, telemetry.dropped) == (4, 0)  # start, phase, step, end


def saved_account(path: Path) -> bool:
    """The state directory holds the rank's account (in its snapshot or its journal)."""
    try:
        saved = saved_accounts(str(path.parent))
    except OSError:
        return False
    account = saved.get(("corrupt-test", "0"))
    return account is not None and account.phases["compute"] > 0
