"""Alerts on the exporter itself: a node not scraped, a source failing. Group `goodput.alerts.exporter`."""

from __future__ import annotations

from ..settings import RulesSettings
from .alert import Alert


def alerts(s: RulesSettings) -> list[Alert]:
    node = s.node_label
    return [
        Alert(
            "GoodputExporterDown", "exporter-down.md", "warning",
            f'up{{job="{s.exporter_job}"}} == 0', s.exporter_down_for,
            "Prometheus cannot scrape a goodput-exporter.",
            f"The goodput-exporter on {{{{ $labels.{node} }}}} has not answered Prometheus for "
            f"{s.exporter_down_for}: that node's GPUs and jobs are unobserved."),
        Alert(
            "GoodputExporterSourceFailing", "exporter-source-failing.md", "warning",
            "goodput_exporter_source_up == 0", s.source_failing_for,
            "A goodput-exporter source keeps failing.",
            f"Source {{{{ $labels.source }}}} of the goodput-exporter on {{{{ $labels.{node} }}}} has failed "
            f"for {s.source_failing_for}; goodput_exporter_source_errors_total says why."),
    ]
