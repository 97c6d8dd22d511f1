"""An alerting rule: prefix Goodput, a severity (critical pages, warning tickets), a static summary, a
templated description naming the workload, rank, node or GPU, and a runbook in docs/runbooks/.

Each alert is declared once here with the runbook file it links to; a test checks every runbook exists
and every alert has promtool tests that make it fire and keep it silent.

An alert on a training workload (`per_workload`: its series carry a `workload` label) also carries the funnel's
verdict on that workload while it fires (`verdict`, read again at each evaluation: layer/reason of
workload:goodput_bottleneck:info, or `unknown` where the workload reports no phases to judge), and the command that
walks the funnel for it (`diagnose`): the page says where to look first before anyone opens a dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import RulesSettings
from ..verdict import VERDICT

Rule = dict[str, object]


def verdict_annotation(s: RulesSettings) -> str:
    """The alerting workload's verdict now, as layer/reason: a query from the alert's template (Prometheus runs it
    when the alert is evaluated), on the alert's cluster and workload labels (an absent cluster label matches the
    series without one)."""
    c = s.cluster_label
    return (f'{{{{ with printf "{VERDICT}{{{c}=%q,workload=%q}}" $labels.{c} $labels.workload | query }}}}'
            "{{ with first . }}{{ .Labels.layer }}/{{ .Labels.reason }}{{ end }}{{ else }}unknown{{ end }}")


DIAGNOSE = "goodput-exporter diagnose --workload {{ $labels.workload }}"


@dataclass(frozen=True)
class Alert:
    name: str
    runbook: str  # file name under docs/runbooks/
    severity: str
    expr: str
    for_: str
    summary: str
    description: str
    per_workload: bool = False  # its series name a training workload: annotate the verdict and diagnose command
    names_cluster: bool = False  # its description names the cluster already
    # its module's group is goodput.alerts.<module>; an alert that reads several series of every GPU on its own
    # may go in goodput.alerts.<module>_<part>, so that no group takes a second at 10,000 GPUs
    part: str = ""

    def rule(self, s: RulesSettings) -> Rule:
        rule: Rule = {"alert": self.name, "expr": self.expr}
        if self.for_ not in ("0m", "0s"):
            rule["for"] = self.for_
        rule["labels"] = {"severity": self.severity}
        description = self.description
        if s.global_view and not self.names_cluster:  # one ruler pages for many clusters: say which
            description = f"Cluster {{{{ $labels.{s.cluster_label} }}}}: {description}"
        annotations = {"summary": self.summary, "description": description,
                       "runbook_url": f"{s.runbook_base_url.rstrip('/')}/{self.runbook}"}
        if self.per_workload:
            annotations |= {"verdict": verdict_annotation(s), "diagnose": DIAGNOSE}
        rule["annotations"] = annotations
        return rule
