"""Alerts on the exporter itself: a node not scraped, a source failing, and with global_view a whole cluster silent.
Group `goodput.alerts.exporter`."""

from __future__ import annotations

from ..settings import RulesSettings
from .alert import Alert


def alerts(s: RulesSettings) -> list[Alert]:
    node = s.node_label
    alerts = [
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
    if s.global_view:  # only a ruler that sees every cluster can page on one's silence
        c = s.cluster_label
        alerts.append(Alert(
            "GoodputClusterNotReporting", "cluster-not-reporting.md", "critical",
            f"group by ({c}) (max_over_time(goodput_exporter_build_info[{s.cluster_not_reporting_window}]))\n"
            f"unless group by ({c}) (goodput_exporter_build_info)", s.cluster_not_reporting_for,
            "A cluster's exporters stopped reaching the global view.",
            f"No goodput-exporter of cluster {{{{ $labels.{c} }}}} has reached this store for "
            f"{s.cluster_not_reporting_for}, though it reported within the last {s.cluster_not_reporting_window}: "
            "its agent, its remote write or its network is down, and every alert on its GPUs and jobs is blind.",
            names_cluster=True))
    return alerts
