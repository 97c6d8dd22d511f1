"""Grafana dashboards, one per level of the goodput funnel, built with grafana-foundation-sdk into the JSON
files under dashboards/ (`make dashboards`; a test fails when those files are stale). The same rules
settings that render rules/ decide the recording-rule names and thresholds the panels use."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from ..rules.settings import RulesSettings
from . import cluster, collectives, host, kernels, memory, serving, workload
from .kit import LEVELS, Level, Names

BUILDERS: dict[str, Callable[[Names], Dashboard]] = {
    "cluster": cluster.build, "collectives": collectives.build, "host": host.build, "memory": memory.build,
    "kernels": kernels.build, "workload": workload.build, "serving": serving.build,
}


# The SDK writes an interval variable's auto settings on every variable; @grafana/schema's VariableModel has
# no such fields (Grafana reads them only on interval variables), so the schema test rejects them elsewhere.
_INTERVAL_ONLY = ("auto", "auto_min", "auto_count")


def _finish(model: dict[str, Any]) -> dict[str, Any]:
    """Give rows and panels stable ids in layout order (Grafana needs them unique within a dashboard) and drop
    the interval-only fields from other variables."""
    for index, panel in enumerate(model.get("panels", []), start=1):
        panel["id"] = index
    for variable in model.get("templating", {}).get("list", []):
        if variable.get("type") != "interval":
            for key in _INTERVAL_ONLY:
                variable.pop(key, None)
    return model


def build(level: Level, settings: RulesSettings | None = None) -> dict[str, Any]:
    names = Names(settings or RulesSettings())
    dashboard = BUILDERS[level.slug](names).build()
    return _finish(json.loads(json.dumps(dashboard, cls=JSONEncoder)))


def render(settings: RulesSettings | None = None) -> dict[str, str]:
    """{file name: JSON text} of every dashboard."""
    return {level.filename: json.dumps(build(level, settings), indent=2) + "\n" for level in LEVELS}


def write(out: str | Path, settings: RulesSettings | None = None) -> list[Path]:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render(settings).items():
        path = folder / name
        path.write_text(text)
        written.append(path)
    return written
