"""Alerting rules: prefix Goodput, a severity (critical pages, warning tickets), a static summary, a
templated description naming the workload, rank, node or GPU, and a runbook in docs/runbooks/.

Each module here is one rule group, `goodput.alerts.<module>` (an alert may name a part of its own,
`goodput.alerts.<module>_<part>`), and declares its alerts once with the runbook file each links to; a test
checks every runbook exists and every alert has promtool tests that make it fire and keep it silent. A new group
is a new module and its name in GROUPS.
"""

from __future__ import annotations

from importlib import import_module

from ..settings import RulesSettings
from .alert import Alert, Rule

__all__ = ["GROUPS", "Alert", "alert_groups", "alerts"]

# the groups, in the order they are written to the rule file
GROUPS = ("workload", "collective", "inference", "gpu_health", "gpu_risk", "gpu_usage", "gpu_memory", "fabric",
          "exporter")


def _by_group(s: RulesSettings) -> dict[str, list[Alert]]:
    return {group: import_module(f"{__name__}.{group}").alerts(s) for group in GROUPS}


def alerts(s: RulesSettings) -> list[Alert]:
    """Every alert, group by group."""
    return [alert for group in _by_group(s).values() for alert in group]


def alert_groups(s: RulesSettings) -> list[dict[str, object]]:
    groups = _by_group(s)
    names = [alert.name for group in groups.values() for alert in group]
    if len(names) != len(set(names)):
        raise AssertionError(f"an alert is declared twice: {sorted(n for n in names if names.count(n) > 1)}")
    parts: dict[str, list[Rule]] = {}  # group name -> its rules, in the order declared
    for group, declared in groups.items():
        for alert in declared:
            name = f"goodput.alerts.{group}" + (f"_{alert.part}" if alert.part else "")
            parts.setdefault(name, []).append(alert.rule(s))
    return [{"name": name, "rules": group_rules} for name, group_rules in parts.items()]
