"""Metrics of the `health` source: the decisions of `goodput-exporter health`, read from its state file."""

from __future__ import annotations

from ...core.catalog import Declarer, Kind

_m = Declarer("health")

ACTIONS = _m(
    "goodput_health_actions_total", Kind.COUNTER, "",
    "Decisions of the node health check (`goodput-exporter health`) by action: drain (the node drained, or NonOK "
    "reported), resume (a goodput drain lifted once every GPU was below drain), wait (a drain waiting for the job's "
    "next checkpoint), refuse (a drain the breaker or the repeat window stopped), unknown (the daemon could not be "
    "read); reason: the cause (row_remap_pending, xid_79, ...) or, for refuse, breaker or repeat_window; dry_run "
    "true when it only said what it would do.", ("action", "reason", "dry_run"))
PENDING = _m(
    "goodput_health_drain_pending", Kind.GAUGE, "",
    "1 while the health check holds a drain until the job's next checkpoint save (or its deadline), else 0.", ())
LAST_RUN = _m(
    "goodput_health_last_run_timestamp_seconds", Kind.GAUGE, "seconds",
    "Unix time the node health check last ran; absent before it first ran.", ())

METRICS = _m.metrics
