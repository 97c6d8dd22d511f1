"""An alerting rule: prefix Goodput, a severity (critical pages, warning tickets), a static summary, a
templated description naming the workload, rank, node or GPU, and a runbook in docs/runbooks/.

Each alert is declared once here with the runbook file it links to; a test checks every runbook exists
and every alert has promtool tests that make it fire and keep it silent.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import RulesSettings

Rule = dict[str, object]


@dataclass(frozen=True)
class Alert:
    name: str
    runbook: str  # file name under docs/runbooks/
    severity: str
    expr: str
    for_: str
    summary: str
    description: str

    def rule(self, s: RulesSettings) -> Rule:
        rule: Rule = {"alert": self.name, "expr": self.expr}
        if self.for_ not in ("0m", "0s"):
            rule["for"] = self.for_
        rule["labels"] = {"severity": self.severity}
        rule["annotations"] = {"summary": self.summary, "description": self.description,
                               "runbook_url": f"{s.runbook_base_url.rstrip('/')}/{self.runbook}"}
        return rule
