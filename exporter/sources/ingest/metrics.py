"""Metrics of the `ingest` source: what training jobs report over the events API."""

from __future__ import annotations

from ...core.catalog import Declarer, Kind

_m = Declarer("ingest")

WR = ("workload", "rank")
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
STEP_DURATION = _m(
    "goodput_step_duration_seconds", Kind.HISTOGRAM, "seconds",
    "Wall time of each training step reported by the job.", WR, STEP_BUCKETS)
STEPS = _m("goodput_steps_total", Kind.COUNTER, "", "Training steps completed.", WR)
TOKENS = _m("goodput_tokens_total", Kind.COUNTER, "", "Tokens processed by completed steps.", WR)
SAMPLES = _m("goodput_samples_total", Kind.COUNTER, "", "Samples processed by completed steps.", WR)
PHASE_SECONDS = _m(
    "goodput_phase_seconds_total", Kind.COUNTER, "seconds",
    "Seconds the job spent per phase: compute (useful work), data_wait, comm_wait, checkpoint, startup, "
    "other (badput).", (*WR, "phase"))
RESTARTS = _m(
    "goodput_workload_restarts_total", Kind.COUNTER, "", "Restarts the job reported.", WR)
LAST_EVENT = _m(
    "goodput_workload_last_event_timestamp_seconds", Kind.GAUGE, "seconds",
    "Unix time the daemon last accepted an event from the workload's rank.", WR)
INGEST_ACCEPTED = _m(
    "goodput_ingest_events_accepted_total", Kind.COUNTER, "",
    "Events accepted from training jobs, by type (step, phase, lifecycle).", ("type",))
INGEST_REJECTED = _m(
    "goodput_ingest_rejected_requests_total", Kind.COUNTER, "",
    "Event requests rejected whole, by reason: invalid (bad JSON, types, values, unknown phase), oversize "
    "(body or batch too large), unauthorized (missing or wrong token), workload_cap, rank_cap.",
    ("reason",))

METRICS = _m.metrics
