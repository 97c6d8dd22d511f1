"""The walk as a person reads it (its GPUs at risk, then level by level, each check with its figure, then the
verdict, the queries to paste and the runbook), or as JSON for tools (docs/diagnose.schema.json)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..rules.verdict import LAYERS
from .walk import CheckReading, Diagnosis, GpuRisk, Runbook, TermReading

NOT = {">": "<=", ">=": "<", "<": ">=", "==": "!="}
STATUS = {"failed": "FAILED", "passed": "passed", "no_data": "no data"}


def number(value: float) -> str:
    return f"{value:.3g}"


def term_text(reading: TermReading) -> str:
    term = reading.term
    if reading.value is None:
        return f"{term.name}: no data"
    op = term.op if reading.holds else NOT[term.op]
    return f"{term.name} {number(reading.value)} {op} {term.threshold:g}"


def duration(seconds: float) -> str:
    """1d 4h, 3h 20m, 12m, 45s."""
    seconds = max(0.0, seconds)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} {int(seconds % size // sub_size)}{sub}"
    return f"{int(seconds // 60)}m" if seconds >= 60 else f"{int(seconds)}s"


def forecast_line(figures: dict[str, float]) -> str | None:
    """The forecast of when the workload finishes, on one line; None without a target."""
    if "target_step" not in figures:
        return None
    step, target = figures.get("step"), figures["target_step"]
    progress = figures.get("progress_ratio")
    line = f"  forecast: step {step:.0f} of {target:.0f}" if step is not None else f"  forecast: target {target:.0f}"
    if progress is not None:
        line += f" ({progress:.0%})"
    if "seconds_p50" not in figures:
        return line + "; no finish forecast (no step within the stale window, or no step time yet)"
    line += f"; finishes in {duration(figures['seconds_p50'])} (P50), {duration(figures.get('seconds_p90', 0.0))} (P90)"
    if "gpu_hours_p50" in figures:
        line += f", {figures['gpu_hours_p50']:.3g} GPU-hours to go (P90 {figures.get('gpu_hours_p90', 0.0):.3g})"
    if figures.get("interruptions"):
        line += f", {figures['interruptions']:.2g} interruptions expected"
    if figures.get("badput_gpu_hours"):
        line += f"; badput costs {figures['badput_gpu_hours']:.3g} GPU-hours more than its best goodput would"
    deadline, finish = figures.get("deadline"), figures.get("finish_p50")
    if deadline is not None and finish is not None:
        late = finish - deadline
        line += f"; {'late by ' + duration(late) if late > 0 else 'on time, ' + duration(-late) + ' to spare'} (P50)"
    return line


def risk_lines(diagnosis: Diagnosis) -> list[str]:
    """Its GPUs at risk level watch or worse, one line each, worst first; one line saying none otherwise."""
    if not diagnosis.gpus:
        return ["  GPU risk: no GPU of this workload known (no goodput_gpu_workload_info series of it)"]
    if not diagnosis.risks:
        return [f"  GPU risk: no GPU of this workload at risk (of {diagnosis.gpus} GPU"
                f"{'s' if diagnosis.gpus > 1 else ''})"]
    return [f"  GPU risk: GPU {risk.gpu or '?'} ({risk.uuid}) on node {risk.node}: {risk.level_name} "
            f"({', '.join(risk.reasons) or 'no reason holds now: the rules recorded it an evaluation ago'}); "
            f"runbook: {risk.runbook.url}" for risk in diagnosis.risks]


def _check_line(reading: CheckReading, deciding: bool) -> str:
    line = f"    {STATUS[reading.status]:<8} {reading.check.reason:<28} {'; '.join(map(term_text, reading.terms))}"
    if deciding:
        line += "   <- the verdict"
    elif reading.holds_unrecorded:
        line += "   (holds now; not in the rules' last evaluation)"
    return line


def text(diagnoses: list[Diagnosis]) -> str:
    lines: list[str] = []
    for diagnosis in diagnoses:
        target = diagnosis.target
        where = f"  {diagnosis.cluster_label}={target.cluster}" if target.cluster is not None else ""
        goodput = ("no time accounted in the window" if target.goodput is None
                   else f"{target.goodput:.0%} ({number(target.goodput)})")
        if lines:
            lines.append("")
        lines.append(f"{target.workload}{where}  goodput {goodput}")
        for culprit in diagnosis.culprits:
            pod = f", pod {culprit.pod}" if culprit.pod else ""
            lines.append(f"  culprit: rank {culprit.rank} on node {culprit.node}{pod}: {culprit.why}")
        if diagnosis.culprits:
            lines.append(f"  (the GPU, host and fabric figures below are read on the culprits' node(s): "
                         f"{', '.join(diagnosis.culprit_nodes)})")
        forecast = forecast_line(diagnosis.forecast)
        if forecast is not None:
            lines.append(forecast)
        lines += risk_lines(diagnosis)
        deciding = diagnosis.deciding
        for layer in LAYERS[:-1]:
            lines.append(f"  {layer}")
            lines += [_check_line(c, c is deciding) for c in diagnosis.checks if c.check.layer == layer]
        lines.append(f"  verdict: {target.layer}" + ("" if diagnosis.healthy else f" ({target.reason})"))
        lines.append("  evidence (paste into Prometheus):")
        lines += [f"    {query}" for query in diagnosis.evidence]
        if deciding is not None:
            lines.append(f"  runbook: {deciding.runbook.url}")
    if len(diagnoses) > 1:
        verdicts = Counter(d.target.layer for d in diagnoses if not d.healthy)
        healthy = sum(d.healthy for d in diagnoses)
        summary = f"{len(diagnoses)} workloads: {healthy} healthy"
        if verdicts:
            summary += ", " + ", ".join(f"{count} {layer}" for layer, count in sorted(verdicts.items()))
        lines += ["", summary]
    return "\n".join(lines) + "\n"


def _runbook(runbook: Runbook) -> dict[str, str]:
    return {"file": runbook.file, "url": runbook.url}


def _risk(risk: GpuRisk) -> dict[str, Any]:
    return {"node": risk.node, "gpu": risk.gpu, "uuid": risk.uuid, "level": risk.level_name, "value": risk.level,
            "reasons": list(risk.reasons), "runbook": _runbook(risk.runbook)}


def document(diagnoses: list[Diagnosis], *, prometheus: str, at: float, settings: str,
             warnings: list[str]) -> dict[str, Any]:
    """The JSON document `--json` prints."""
    workloads = []
    for diagnosis in diagnoses:
        target, deciding = diagnosis.target, diagnosis.deciding
        workloads.append({
            "workload": target.workload,
            "cluster": target.cluster,
            "goodput_ratio": target.goodput,
            "layer": target.layer,
            "reason": target.reason,
            "culprits": [{"rank": c.rank, "node": c.node, "pod": c.pod, "why": c.why} for c in diagnosis.culprits],
            "checks": [{
                "order": reading.check.order,
                "layer": reading.check.layer,
                "reason": reading.check.reason,
                "status": reading.status,
                "verdict": reading is deciding,
                "terms": [{"name": t.term.name, "query": t.query, "value": t.value, "op": t.term.op,
                           "threshold": t.term.threshold, "holds": t.holds} for t in reading.terms],
                "evidence": reading.evidence,
                "runbook": _runbook(reading.runbook),
            } for reading in diagnosis.checks],
            "evidence": diagnosis.evidence,
            "runbook": None if deciding is None else _runbook(deciding.runbook),
            "forecast": diagnosis.forecast or None,
            "gpu_risk": {"gpus": diagnosis.gpus, "query": diagnosis.risk_query,
                         "at_risk": [_risk(risk) for risk in diagnosis.risks]},
        })
    return {"prometheus": prometheus, "time": at, "settings": settings, "warnings": warnings, "workloads": workloads}
