"""Alerts on each GPU's failure risk level (gpu:goodput_gpu_risk_level:max, goodput.gpu_risk; the mapping from
NVIDIA's signals: exporter/health/risk.py, docs/health.md), one per level and its action: watch (info: a worsening
trend, nobody is notified), drain (warning: a ticket; `goodput-exporter health` takes the node out of scheduling at
its job's next checkpoint), replace (critical: an RMA case, page). Group `goodput.alerts.gpu_risk`: the alerts read
one recorded series per GPU."""

from __future__ import annotations

from exporter.health.risk import DRAIN, REPLACE, WATCH

from ..settings import RulesSettings
from .alert import Alert

RISK = "gpu:goodput_gpu_risk_level:max"


def alerts(s: RulesSettings) -> list[Alert]:
    gpu = f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.uuid }}}}) on {{{{ $labels.{s.node_label} }}}}"
    return [
        Alert(
            "GoodputGPURiskWatch", "gpu-risk-watch.md", "info",
            f"{RISK} == {WATCH}", s.risk_watch_for,
            "A GPU's error counters are trending the wrong way (risk level watch).",
            f"{gpu} is at risk level watch: non-fatal XIDs, corrected errors, replays, thermal throttling or a restart "
            "repeat within the hour. Nothing to do yet; watch whether it rises to drain."),
        Alert(
            "GoodputGPURiskDrain", "gpu-risk-drain.md", "warning",
            f"{RISK} == {DRAIN}", s.risk_drain_for,
            "A GPU needs a reset or will fail its job: drain its node at the next checkpoint (risk level drain).",
            f"{gpu} is at risk level drain: a reset is due, the GPU is lost, or it reported an uncorrectable error or "
            "an XID that needs a reset. Drain the node after its job's next checkpoint (goodput-exporter health "
            "does so where it runs) and reset the GPU."),
        Alert(
            "GoodputGPURiskReplace", "gpu-risk-replace.md", "critical",
            f"{RISK} == {REPLACE}", s.risk_replace_for,
            "A GPU is failing and must be replaced (risk level replace).",
            f"{gpu} is at risk level replace: a failed row remap, page retirement near its limit, XID 64, or XID 79 "
            "again within 24h. Drain the node now and open an RMA case with the vendor."),
    ]
