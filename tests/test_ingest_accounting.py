"""The ingest source's time accounting, event by event through the wire models and the rendered exposition: elapsed
and untracked, sessions and downtime, redone steps, FLOPs, the deprecated phase, and the state file across a daemon
restart (the whole job under torchrun is tests/test_restart_accounting.py)."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest
from conftest import ManualClock, samples
from full_disk import small_disk

from exporter.core.exposition import TEXT, Renderer
from exporter.sources.ingest.accounting import History
from exporter.sources.ingest.models import EventBatch
from exporter.sources.ingest.state import IngestState, saved_accounts
from exporter.sources.ingest.statefile import FILE_NAME, JOURNAL_MIN, JOURNAL_NAME, StateFile

START = 1_760_000_000.0
LATER = START + 3600.0
W, R = "llama", "0"


def state(tmp_path: Path | None = None, clock: ManualClock | None = None, **options: object) -> IngestState:
    """The daemon's clock an hour past START unless given: the events below are timed by their elapsed seconds, and
    the wall-clock bound on untracked time (tested on its own) does not bind."""
    return IngestState(32, 512, 600.0, clock or ManualClock(LATER),
                       state_file=StateFile(str(tmp_path)) if tmp_path else None, **options)  # type: ignore[arg-type]


def send(ingest: IngestState, *events: dict) -> None:
    full = [{"workload": W, "rank": 0, **e} for e in events]
    ingest.apply(EventBatch.model_validate_json(json.dumps({"events": full})).events)


def start(started_at: float, restart: bool = False, **extra: object) -> dict:
    return {"type": "lifecycle", "event": "restart" if restart else "start", "elapsed_seconds": 0.0,
            "started_at": started_at, **extra}


def phase(name: str, seconds: float, elapsed: float | None) -> dict:
    event: dict = {"type": "phase", "phase": name, "seconds": seconds}
    if elapsed is not None:
        event["elapsed_seconds"] = elapsed
    return event


def step(number: int | None, duration: float, elapsed: float | None = None, **extra: object) -> dict:
    event: dict = {"type": "step", "duration_seconds": duration, **extra}
    if number is not None:
        event["step"] = number
    if elapsed is not None:
        event["elapsed_seconds"] = elapsed
    return event


def metrics(ingest: IngestState) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return samples(Renderer().render(ingest.snapshot(), TEXT).decode())


def of(found: dict, name: str, **labels: str) -> float:
    return found[(name, frozenset({"workload": W, "rank": R, **labels}.items()))]


def phases_sum(found: dict) -> float:
    return sum(v for (name, labels), v in found.items()
               if name == "goodput_phase_seconds_total" and dict(labels)["workload"] == W)


def run_steps(ingest: IngestState, first: int, last: int, at: float, durations: dict[int, float]) -> float:
    """Steps first..last, each a 1 s compute phase, a 0.2 s data wait and 0.3 s between phases (untracked);
    returns the elapsed after the last."""
    for number in range(first, last + 1):
        at += 0.2
        send(ingest, phase("data_wait", 0.2, at))
        at += 1.0
        send(ingest, phase("compute", 1.0, at))
        at += 0.3
        durations.setdefault(number, 1.5)
        send(ingest, step(number, 1.5, at, flops=2e12))
    return at


def test_elapsed_is_every_phase_plus_untracked_and_the_deprecated_phase_counts_as_checkpoint_save() -> None:
    ingest = state()
    send(ingest, start(START))
    at = run_steps(ingest, 1, 4, 0.0, {})
    send(ingest, phase("checkpoint", 2.0, at + 2.5))  # 0.5 s untracked before it
    found = metrics(ingest)
    assert of(found, "goodput_elapsed_seconds_total") == pytest.approx(at + 2.5)
    assert phases_sum(found) == pytest.approx(at + 2.5)
    assert of(found, "goodput_phase_seconds_total", phase="untracked") == pytest.approx(4 * 0.3 + 0.5)
    assert of(found, "goodput_phase_seconds_total", phase="checkpoint_save") == 2.0
    assert ("goodput_phase_seconds_total", frozenset({"workload": W, "rank": R, "phase": "checkpoint"}.items())) \
        not in found
    assert of(found, "goodput_model_flops_total", dtype="bf16") == 4 * 2e12
    assert of(found, "goodput_step_number") == 4


def test_a_step_inside_a_phase_cannot_make_untracked_shrink() -> None:
    """`with step(): with phase("compute"):` sends the step inside the phase on a client that sends elapsed with it
    (an older one); untracked never goes down, and the total stays exact."""
    ingest = state()
    send(ingest, start(START))
    send(ingest, step(1, 1.0, 1.0))  # ended inside a compute phase that ends at 1.2
    assert of(metrics(ingest), "goodput_phase_seconds_total", phase="untracked") == pytest.approx(1.0)
    send(ingest, phase("compute", 1.2, 1.2))
    found = metrics(ingest)
    assert of(found, "goodput_phase_seconds_total", phase="untracked") == pytest.approx(1.0)
    assert of(found, "goodput_elapsed_seconds_total") == pytest.approx(2.2) == phases_sum(found)


def test_an_older_client_without_elapsed_has_no_untracked() -> None:
    ingest = state()
    send(ingest, {"type": "lifecycle", "event": "start"}, phase("compute", 3.0, None), step(None, 3.0))
    found = metrics(ingest)
    assert of(found, "goodput_phase_seconds_total", phase="untracked") == 0
    assert of(found, "goodput_elapsed_seconds_total") == 3.0


def test_a_rank_first_heard_of_mid_run_counts_from_there() -> None:
    """A daemon started (without state) while a job runs: the hours before are not charged as untracked."""
    ingest = state()
    send(ingest, phase("compute", 2.0, 7200.0))
    found = metrics(ingest)
    assert of(found, "goodput_phase_seconds_total", phase="untracked") == 0
    assert of(found, "goodput_elapsed_seconds_total") == 2.0


def crash_and_resume(ingest: IngestState, clock: ManualClock, durations: dict[int, float]) -> tuple[float, float]:
    """Steps 1..10, down 42 s, restarted from step 8's checkpoint, steps 9..12; returns (first, second) elapsed."""
    send(ingest, start(START))
    first = run_steps(ingest, 1, 10, 0.0, durations)
    clock.advance(first + 42.0)
    restarted = START + first + 42.0
    send(ingest, start(restarted, restart=True, resumed_from_step=8), phase("checkpoint_restore", 0.5, 0.5))
    second = run_steps(ingest, 9, 12, 0.5, {k: 9.9 for k in range(9, 13)})  # redone steps are not re-remembered
    return first, second


def test_a_restart_charges_its_downtime_and_the_redone_steps() -> None:
    clock = ManualClock(LATER)
    ingest = state(clock=clock)
    durations: dict[int, float] = {}
    first, second = crash_and_resume(ingest, clock, durations)
    found = metrics(ingest)
    assert of(found, "goodput_downtime_seconds_total") == pytest.approx(42.0)
    assert of(found, "goodput_wasted_steps_total") == 2
    assert of(found, "goodput_wasted_seconds_total") == pytest.approx(durations[9] + durations[10])
    assert of(found, "goodput_wasted_compute_seconds_total") == pytest.approx(2.0)
    assert of(found, "goodput_elapsed_seconds_total") == pytest.approx(first + second) == pytest.approx(
        phases_sum(found))
    assert of(found, "goodput_workload_restarts_total") == 1
    assert of(found, "goodput_step_number") == 12


def test_a_restart_that_names_no_step_is_told_by_its_first_step_number() -> None:
    clock = ManualClock(LATER)
    ingest = state(clock=clock)
    send(ingest, start(START))
    at = run_steps(ingest, 1, 6, 0.0, {})
    send(ingest, start(START + at + 5.0, restart=True))
    run_steps(ingest, 5, 6, 0.0, {})  # went back to the state after step 4
    found = metrics(ingest)
    assert of(found, "goodput_wasted_steps_total") == 2
    assert of(found, "goodput_wasted_seconds_total") == pytest.approx(3.0)
    assert of(found, "goodput_downtime_seconds_total") == pytest.approx(5.0)


def test_a_new_run_under_the_same_name_is_no_restart() -> None:
    """A job launched again ("start", not "restart"): its step 1 is not a redone step, the gap not downtime."""
    ingest = state()
    send(ingest, start(START))
    at = run_steps(ingest, 1, 6, 0.0, {})
    send(ingest, start(START + at + 3600.0))
    run_steps(ingest, 1, 3, 0.0, {})
    found = metrics(ingest)
    assert of(found, "goodput_wasted_steps_total") == 0
    assert of(found, "goodput_downtime_seconds_total") == 0
    assert of(found, "goodput_step_number") == 3


def runs(found: dict) -> dict[str, float]:
    return {dict(labels)["run"]: v for (name, labels), v in found.items()
            if name == "goodput_workload_run_start_timestamp_seconds" and dict(labels)["workload"] == W}


def test_a_resubmission_of_the_job_is_a_restart_and_its_runs_its_lineage() -> None:
    """The job named across its runs (GOODPUT_JOB): a "start" of another run is a restart of the job (the gap is
    downtime, the steps its first step number says it redoes are wasted), and both runs are its lineage."""
    ingest = state()
    send(ingest, start(START, run="run-a"))
    at = run_steps(ingest, 1, 10, 0.0, {})
    send(ingest, {"type": "lifecycle", "event": "end", "elapsed_seconds": at})
    resubmitted = START + at + 900.0  # a quarter of an hour in the queue
    send(ingest, start(resubmitted, run="run-b"))  # a Trainer resumed from step 8: its first step is 9
    second = run_steps(ingest, 9, 12, 0.0, {})
    found = metrics(ingest)
    assert of(found, "goodput_downtime_seconds_total") == pytest.approx(900.0)
    assert of(found, "goodput_wasted_steps_total") == 2
    assert of(found, "goodput_wasted_seconds_total") == pytest.approx(3.0)
    assert of(found, "goodput_workload_restarts_total") == 1
    assert of(found, "goodput_elapsed_seconds_total") == pytest.approx(at + second)
    assert of(found, "goodput_step_number") == 12
    assert runs(found) == {"run-a": START, "run-b": resubmitted}


def test_the_same_run_started_again_and_a_run_not_named_are_new_runs_not_resubmissions() -> None:
    """A start of the run the rank last belonged to (its launcher reused the name) is a new run, as before runs
    were named; so is a start that names none (an older client, a job its launcher names)."""
    for first, again in (("run-a", "run-a"), ("run-a", None), (None, "run-b")):
        ingest = state()
        send(ingest, start(START, **({"run": first} if first else {})))
        at = run_steps(ingest, 1, 6, 0.0, {})
        send(ingest, start(START + at + 60.0, **({"run": again} if again else {})))
        run_steps(ingest, 1, 3, 0.0, {})
        found = metrics(ingest)
        assert of(found, "goodput_downtime_seconds_total") == 0, (first, again)
        assert of(found, "goodput_wasted_steps_total") == 0, (first, again)
        assert of(found, "goodput_workload_restarts_total") == 0, (first, again)
        assert set(runs(found)) == {r for r in (first, again) if r}, (first, again)


def test_a_jobs_lineage_survives_a_daemon_restart_and_keeps_its_last_runs(tmp_path: Path) -> None:
    clock = ManualClock(LATER)
    before = state(tmp_path, clock)
    for n in range(20):  # twenty runs of one step each, a minute apart
        send(before, start(START + 60.0 * n, run=f"run-{n:02d}"))
        run_steps(before, 1 + n, 1 + n, 0.0, {})
    before.save()
    after = state(tmp_path, clock)
    send(after, start(START + 60.0 * 20, run="run-20"))
    found = metrics(after)
    assert runs(found) == {f"run-{n:02d}": START + 60.0 * n for n in range(5, 21)}  # the last 16
    assert of(found, "goodput_workload_restarts_total") == 20


def test_a_run_that_is_no_workload_name_rejects_the_batch() -> None:
    ingest = state()
    with pytest.raises(ValueError, match="run"):
        send(ingest, start(START, run="no spaces allowed"))


def test_redone_steps_older_than_the_history_are_counted_without_seconds(caplog: pytest.LogCaptureFixture) -> None:
    ingest = state(step_history=4)
    send(ingest, start(START))
    at = run_steps(ingest, 1, 100, 0.0, {})
    with caplog.at_level(logging.WARNING):
        send(ingest, start(START + at + 1.0, restart=True, resumed_from_step=2))
    found = metrics(ingest)
    assert of(found, "goodput_wasted_steps_total") == 98
    kept = of(found, "goodput_wasted_seconds_total") / 1.5
    assert 4 <= kept < 98 and kept == pytest.approx(round(kept))  # what the history kept (trimmed in chunks)
    assert "ingest.step_history" in caplog.text


def test_the_accounting_survives_a_daemon_restart_between_crash_and_resume(tmp_path: Path) -> None:
    clock = ManualClock(LATER)
    before = state(tmp_path, clock)
    send(before, start(START))
    durations: dict[int, float] = {}
    first = run_steps(before, 1, 10, 0.0, durations)
    before.save()  # what the daemon does on SIGTERM
    clock.advance(first + 60.0)
    after = state(tmp_path, clock)
    send(after, start(START + first + 60.0, restart=True, resumed_from_step=8))
    second = run_steps(after, 9, 12, 0.0, {})
    found = metrics(after)
    assert of(found, "goodput_downtime_seconds_total") == pytest.approx(60.0)
    assert of(found, "goodput_wasted_steps_total") == 2
    assert of(found, "goodput_wasted_seconds_total") == pytest.approx(durations[9] + durations[10])
    assert of(found, "goodput_elapsed_seconds_total") == pytest.approx(first + second)
    assert of(found, "goodput_phase_seconds_total", phase="compute") == pytest.approx(14.0)  # 10 + 4, once each


@pytest.mark.parametrize("content", [b"\x00garbage{", b'{"version": 1, "accounts": {"no": "list"}}',
                                     b'{"version": 1, "accounts": [{"workload": "w", "rank": "0", "account": {}}]}'])
def test_a_corrupt_state_file_is_counted_set_aside_and_replaced(tmp_path: Path, content: bytes,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / FILE_NAME).write_bytes(content)
    with caplog.at_level(logging.ERROR):
        ingest = state(tmp_path)
    found = samples(Renderer().render(ingest.snapshot(), TEXT).decode())
    assert found[("goodput_ingest_state_errors_total", frozenset({"reason": "corrupt"}.items()))] == 1
    assert "corrupt" in caplog.text or "malformed" in caplog.text
    send(ingest, start(START), phase("compute", 1.0, 1.0))
    ingest.save()
    saved = json.loads((tmp_path / FILE_NAME).read_text())
    assert saved["version"] == 2 and [a["workload"] for a in saved["accounts"]] == [W]


def test_an_unwritable_state_dir_is_counted_and_withholds_the_counters_until_their_first_save(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Nothing could ever be saved: the rank's counters are withheld (a restart would start them again from zero),
    its gauges shown, the withholding counted and logged; the daemon goes on, and the first save publishes them."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    ingest = state(blocker)
    send(ingest, start(START), phase("compute", 1.0, 1.0))
    with caplog.at_level(logging.INFO):
        found = metrics(ingest)  # a collect saves first
    assert found[("goodput_ingest_state_errors_total", frozenset({"reason": "unwritable"}.items()))] == 1
    assert found[("goodput_ingest_state_withheld_ranks", frozenset())] == 1
    assert not [name for name, labels in found if name.endswith("_total") and ("workload", W) in labels]
    assert of(found, "goodput_workload_last_event_timestamp_seconds") > 0
    assert "withheld" in caplog.text
    blocker.unlink()  # the next save can create the directory
    with caplog.at_level(logging.INFO):
        found = metrics(ingest)
    assert found[("goodput_ingest_state_withheld_ranks", frozenset())] == 0
    assert of(found, "goodput_phase_seconds_total", phase="compute") == 1.0
    assert "no rank's counters are withheld any more" in caplog.text


def test_a_new_process_whose_start_was_lost_is_told_by_its_elapsed_time() -> None:
    """The daemon was down when the restarted process sent its "restart": its first events, elapsed time going back,
    begin the session; the phase that revealed it is counted once, and its first step number says where it went
    back to."""
    ingest = state()
    send(ingest, start(START))
    at = run_steps(ingest, 1, 10, 0.0, {})
    send(ingest, phase("compute", 1.0, 2.0))  # the new process, 2 s in
    found = metrics(ingest)
    assert of(found, "goodput_elapsed_seconds_total") == pytest.approx(at + 2.0) == pytest.approx(phases_sum(found))
    send(ingest, step(6, 1.5, 2.3))  # it went back to the state after step 5
    found = metrics(ingest)
    assert of(found, "goodput_wasted_steps_total") == 5
    assert of(found, "goodput_wasted_seconds_total") == pytest.approx(5 * 1.5)


def test_two_processes_reporting_as_one_rank_cannot_outrun_the_wall_clock() -> None:
    """Two processes that name the same workload and rank (two launcher-less jobs on a node, both "default/0"):
    each time the other's smaller elapsed time arrives it looks like a new process; untracked time is bounded by the
    wall clock since the rank was first heard of, so elapsed stays within it."""
    clock = ManualClock(START)
    ingest = state(clock=clock)
    send(ingest, start(START))
    for second in range(1, 111):
        clock.now = START + second
        send(ingest, phase("compute", 0.5, float(second)))  # one process, started at START
        if second > 50:
            send(ingest, phase("compute", 0.5, second - 50.0))  # the other, started 50 s later
    found = metrics(ingest)
    assert of(found, "goodput_phase_seconds_total", phase="compute") == 110 * 0.5 + 60 * 0.5
    assert of(found, "goodput_elapsed_seconds_total") <= 110 + 5.0 + 1.0  # the wall clock since the start (and slack)
    assert of(found, "goodput_elapsed_seconds_total") == pytest.approx(phases_sum(found))


def test_a_step_number_sent_as_a_token_count_costs_nothing() -> None:
    """A restart from step 0 after a step numbered 10^12 reads only the history it keeps."""
    ingest = state()
    send(ingest, start(START), step(10**12, 1.0, 1.0))
    send(ingest, start(START + 10.0, restart=True, resumed_from_step=0))
    assert of(metrics(ingest), "goodput_wasted_steps_total") == 10**12


def test_a_dormant_ranks_accounting_stays_published_so_its_restart_shows_in_rates() -> None:
    """A rank that ended (a Python crash sends "end" from atexit) loses its step series after the grace; its
    accounting stays published until the restart window passes, so the jump of its restart is an increase."""
    clock = ManualClock(LATER)
    ingest = state(clock=clock)
    send(ingest, start(START))
    at = run_steps(ingest, 1, 10, 0.0, {})
    send(ingest, {"type": "lifecycle", "event": "end", "elapsed_seconds": at})
    clock.advance(600.0)
    found = metrics(ingest)
    assert ("goodput_steps_total", frozenset({"workload": W, "rank": R}.items())) not in found
    assert of(found, "goodput_downtime_seconds_total") == 0 and of(found, "goodput_elapsed_seconds_total") > 0
    send(ingest, start(START + at + 500.0, restart=True, resumed_from_step=8))
    assert of(metrics(ingest), "goodput_downtime_seconds_total") == pytest.approx(500.0)
    clock.advance(ingest.restart_window + 1000.0)
    assert not [k for k in metrics(ingest) if k[0] == "goodput_elapsed_seconds_total"]


def test_the_state_journal_replays_to_the_histories_it_followed() -> None:
    """Random steps (repeats, gaps, jumps past the history, new runs), deltas taken at random, some lost (a write
    that failed): applying those written, in order, always gives the live history."""
    rng = random.Random(35)
    for _ in range(200):
        live, replica = History(50), History(50)
        for _ in range(rng.randrange(1, 40)):
            for _ in range(rng.randrange(0, 30)):
                roll = rng.random()
                if roll < 0.02:
                    live = History(50)  # a new run: a new history
                    continue
                base = live.first + len(live)
                step = rng.choice([base, base + 1, base + rng.randrange(2, 9), base + rng.randrange(50, 200),
                                   max(0, base - rng.randrange(1, 60))])
                live.add(step, rng.random(), rng.random())
            delta = json.loads(json.dumps(live.delta()))  # as the journal writes and reads it
            if rng.random() < 0.3:
                continue  # the write failed: the next delta covers it
            replica.apply(delta)
            live.written()
            assert (replica.first, list(map(repr, replica.durations)), list(map(repr, replica.computes))) == \
                (live.first, list(map(repr, live.durations)), list(map(repr, live.computes)))


def test_a_restart_restores_the_snapshot_and_the_journal_after_it(tmp_path: Path) -> None:
    clock = ManualClock(LATER)
    before = state(tmp_path, clock)
    send(before, start(START))
    run_steps(before, 1, 10, 0.0, {})
    before.snapshot()  # the first save: a snapshot
    run_steps(before, 11, 20, 10.0, {})
    send(before, step(15, 1.0, 25.0, tokens=7, samples=3))  # a step seen again, and more tokens
    found = metrics(before)  # saved into the journal, then shown
    assert (tmp_path / JOURNAL_NAME).stat().st_size >= JOURNAL_MIN  # its space allocated ahead
    after = state(tmp_path, clock)  # a kill -9: no snapshot at shutdown
    live, restored = before._ranks[(W, R)].account, after._dormant[(W, R)]
    assert restored.to_dict() == live.to_dict()
    assert of(found, "goodput_steps_total") == restored.steps == 21
    assert of(found, "goodput_tokens_total") == restored.tokens == 7
    shown = metrics(after)  # dormant until the rank reports again: its accounting still published, as it was
    for name in ("goodput_elapsed_seconds_total", "goodput_downtime_seconds_total", "goodput_wasted_steps_total"):
        assert of(shown, name) == of(found, name), name


def test_a_full_disk_holds_the_shown_figures_at_what_is_saved(tmp_path: Path) -> None:
    """On a real full file system the journal's space allocated ahead takes the saves until it is used up; then the
    writes fail (counted) and the rank's series stay at what is on disk, so a restart (kill -9) shows no counter
    lower than a scrape saw. Once space returns the next save catches up."""
    clock = ManualClock(LATER)
    with small_disk(tmp_path / "disk", "1m") as disk:
        ingest = state(disk.path, clock)
        send(ingest, start(START))
        metrics(ingest)  # the first save: a snapshot, and the journal's space
        disk.fill()
        number, at = 0, 0.0
        unwritable = ("goodput_ingest_state_errors_total", frozenset({("reason", "unwritable")}))
        while (found := metrics(ingest))[unwritable] == 0:
            number += 1
            at = run_steps(ingest, number, number, at, {})
            assert number < 5000, "the journal's space was never used up"
        held = of(found, "goodput_elapsed_seconds_total")
        run_steps(ingest, number + 1, number + 10, at, {})  # more events, still not saved
        found = metrics(ingest)
        assert of(found, "goodput_elapsed_seconds_total") == held  # shown: what is on disk
        restarted = metrics(state(disk.path, clock))
        for (name, labels), figure in found.items():
            if name.endswith("_total") and ("rank", R) in labels and (name, labels) in restarted:
                assert restarted[(name, labels)] >= figure, name
        assert of(restarted, "goodput_elapsed_seconds_total") == held
        disk.free()
        found = metrics(ingest)  # the next save: a snapshot of everything
        assert of(found, "goodput_elapsed_seconds_total") == ingest._ranks[(W, R)].account.elapsed > held


def test_a_journal_line_cut_short_is_where_the_restore_stops(tmp_path: Path) -> None:
    """A daemon killed mid-write leaves half a line before the space allocated ahead (zeros): the lines before it are
    restored, and the restarted daemon writes on from there."""
    clock = ManualClock(LATER)
    before = state(tmp_path, clock)
    send(before, start(START))
    at = run_steps(before, 1, 3, 0.0, {})
    metrics(before)  # snapshot
    at = run_steps(before, 4, 5, at, {})
    metrics(before)  # a journal line
    kept = before._ranks[(W, R)].account.to_dict()
    run_steps(before, 6, 6, at, {})
    metrics(before)  # another, then cut short as a kill -9 mid-write would leave it
    journal = (tmp_path / JOURNAL_NAME).read_bytes()
    end = journal.index(b"\0") - 1
    start_of_last = journal.rindex(b"\n", 0, end) + 1
    (tmp_path / JOURNAL_NAME).write_bytes(journal[:start_of_last + (end - start_of_last) // 2] +
                                          b"\0" * (len(journal) - start_of_last))
    after = state(tmp_path, clock)
    assert after._dormant[(W, R)].to_dict() == kept
    send(after, step(7, 1.0, at + 2.0))
    metrics(after)  # written over the half line
    assert saved_accounts(str(tmp_path))[(W, R)].to_dict() == after._ranks[(W, R)].account.to_dict()
