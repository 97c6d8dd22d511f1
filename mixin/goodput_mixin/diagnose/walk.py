"""The walk of the funnel for some workloads, read from Prometheus at one instant.

The verdict and the checks that failed come from the rules (`workload:goodput_bottleneck:info` and the candidates
they record, rules/verdict.py): diagnose says what the rules decided, it does not decide again. Beside each check it
reads the figure the rule compared (verdict.checks declares it with its threshold), the worst of the workload's
series: its GPUs held within bottleneck_gpu_recent_window, its nodes, or its own series. One query per figure serves
every workload asked about, so the cost grows with the checks, not with the workloads.

Beside the walk, the failure risk of those GPUs (`gpu:goodput_gpu_risk_level:max`, rules/risk.py): each at watch or
worse, with the reasons that put it at its level and the runbook of the level's alert. The record keeps each GPU's
worst level and drops the reason that set it, so the reasons are the rules' own terms, read by reason.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from exporter.health.risk import LEVELS, WATCH

from ..rules import forecast as fc
from ..rules.alerts import alerts
from ..rules.alerts.gpu_risk import RISK
from ..rules.recording import COLLECTIVE_MISSING, RANK_POD, STRAGGLER_COST, STRAGGLER_LOST
from ..rules.risk import gpu_labels, risk_terms
from ..rules.settings import RulesSettings
from ..rules.verdict import CANDIDATE, HEALTHY, VERDICT, Check, Term, checks, order
from .prometheus import AskError, Prometheus, Sample

NODE_INFO = "workload:goodput_node:info"
SHOWN_NAMES = 10  # workloads named in an error that lists them


def string(value: str) -> str:
    """A PromQL string literal (Go's escapes, which JSON's are a subset of)."""
    return json.dumps(value, ensure_ascii=False)


_SELECTOR = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$", re.DOTALL)
_CALL = re.compile(r"^[a-z_]+(?: (?:by|without) \([^()]*\))? \(")


def with_matchers(expr: str, matchers: str) -> str | None:
    """`expr` with the matchers added, where it is one vector selector; else None."""
    found = _SELECTOR.match(expr)
    if found is None:
        return None
    name, inner = found.groups()
    return f"{name}{{{f'{inner}, ' if inner else ''}{matchers}}}"


def _closes_at_end(expr: str, start: int) -> bool:
    """Whether the parenthesis opened at `start` closes at the end of `expr`."""
    depth = 0
    for i, char in enumerate(expr[start:], start):
        depth += (char == "(") - (char == ")")
        if depth == 0:
            return i == len(expr) - 1
    return False


def paren(expr: str) -> str:
    """`expr`, in parentheses unless it is a selector or one call/aggregation: safe on either side of an operator."""
    call = _CALL.match(expr)
    if _SELECTOR.match(expr) or (call and _closes_at_end(expr, call.end() - 1)):
        return expr
    return f"({expr})"


def one_line(expr: str) -> str:
    return re.sub(r"\s*\n\s*", " ", expr).strip()


@dataclass(frozen=True)
class Runbook:
    file: str  # under docs/runbooks/
    url: str


@dataclass(frozen=True)
class Target:
    cluster: str | None
    workload: str
    layer: str
    reason: str
    goodput: float | None

    @property
    def key(self) -> tuple[str | None, str]:
        return self.cluster, self.workload


@dataclass
class TermReading:
    term: Term
    query: str  # the figure's series of this workload, to paste into Prometheus
    value: float | None  # the worst of them; None: no series

    @property
    def holds(self) -> bool | None:
        if self.value is None:
            return None
        op, threshold = self.term.op, self.term.threshold
        return {">": self.value > threshold, ">=": self.value >= threshold, "<": self.value < threshold,
                "==": self.value == threshold}[op]


@dataclass
class CheckReading:
    check: Check
    status: str  # failed (the rules recorded it), passed, or no_data (none of its figures has a series)
    terms: list[TermReading]
    evidence: list[str]
    runbook: Runbook

    @property
    def holds_unrecorded(self) -> bool:
        """Every figure crosses its threshold now, yet the rules did not record the check: one evaluation old, or
        a GPU whose earlier signal in the walk is the one recorded for it."""
        return self.status != "failed" and all(t.holds for t in self.terms)


@dataclass(frozen=True)
class Culprit:
    """A rank the others wait for, and the node it runs on: where to look first."""

    rank: str
    node: str  # the node label's value
    pod: str | None  # namespace/pod, where the kubelet source knows it
    why: str


@dataclass(frozen=True)
class GpuRisk:
    """A GPU of the workload at risk level watch or worse, as the rules record it (gpu:goodput_gpu_risk_level:max)."""

    node: str  # the node label's value
    gpu: str  # its index on the node
    uuid: str
    level: int  # 1 watch, 2 drain, 3 replace (exporter.health.risk)
    reasons: tuple[str, ...]  # the rules' reasons at its level (row_remap_pending, ...); empty: none holds now
    runbook: Runbook  # the runbook of the level's alert

    @property
    def level_name(self) -> str:
        return LEVELS[self.level]


def risk_reasons(settings: RulesSettings) -> str:
    """The rules' risk terms of each GPU by reason, those above ok: the terms gpu:goodput_gpu_risk_level:max keeps
    the worst of, aggregated with the reason kept."""
    return f"max by ({gpu_labels(settings)}, reason) (\n  {risk_terms(settings)}\n) > 0"


# the forecast's figures diagnose shows, by name in its JSON: the records the rules keep (rules/forecast.py)
FORECAST = {"step": fc.STEP, "target_step": fc.TARGET, "progress_ratio": fc.PROGRESS,
            "seconds_p50": fc.P50, "seconds_p90": fc.P90, "finish_p50": fc.FINISH_P50, "finish_p90": fc.FINISH_P90,
            "gpu_hours_p50": fc.GPU_HOURS_P50, "gpu_hours_p90": fc.GPU_HOURS_P90,
            "interruptions": fc.INTERRUPTIONS, "badput_gpu_hours": fc.BADPUT_GPU_HOURS, "deadline": fc.DEADLINE}


@dataclass
class Diagnosis:
    target: Target
    goodput_query: str
    cluster_label: str
    checks: list[CheckReading] = field(default_factory=list)
    # when it will finish, as the rules forecast it (FORECAST's names; those the rules record now); empty: no target
    forecast: dict[str, float] = field(default_factory=dict)
    # the ranks the others wait for (missing from a collective, or straggling), with their nodes; where there are
    # any, the GPU and node figures of the walk are read on the culprits' nodes only, not on the nodes that wait
    culprits: list[Culprit] = field(default_factory=list)
    # its GPUs (held within bottleneck_gpu_recent_window) at risk level watch or worse, worst first; how many it holds
    risks: list[GpuRisk] = field(default_factory=list)
    gpus: int = 0
    risk_query: str = ""  # the risk level of each of its GPUs, to paste into Prometheus

    @property
    def culprit_nodes(self) -> list[str]:
        return sorted({c.node for c in self.culprits})

    @property
    def healthy(self) -> bool:
        return self.target.layer == HEALTHY[0]

    @property
    def deciding(self) -> CheckReading | None:
        """The check that decided the verdict; None when healthy (or the rules name a reason this version does not
        know)."""
        return next((c for c in self.checks if c.check.reason == self.target.reason), None)

    @property
    def evidence(self) -> list[str]:
        deciding = self.deciding
        if deciding is None:
            return [self.goodput_query]
        return [*deciding.evidence, self.candidates_query]

    @property
    def candidates_query(self) -> str:
        return f"{CANDIDATE}{{{self.matchers}}}"

    @property
    def matchers(self) -> str:
        return matchers(self.target, self.cluster_label)


def matchers(target: Target, cluster_label: str) -> str:
    parts = [] if target.cluster is None else [f"{cluster_label}={string(target.cluster)}"]
    return ", ".join([*parts, f"workload={string(target.workload)}"])


class Walk:
    """Reads the walk of the workloads asked about from one Prometheus at one instant."""

    def __init__(self, prometheus: Prometheus, settings: RulesSettings, at: float) -> None:
        self.prometheus = prometheus
        self.s = settings
        self.at = at
        self._answers: dict[str, list[Sample]] = {}
        self.checks = checks(settings)
        runbooks = {alert.name: alert.runbook for alert in alerts(settings)}
        base = settings.runbook_base_url.rstrip("/")
        self.runbooks = {check.reason: Runbook(runbooks[check.alert], f"{base}/{runbooks[check.alert]}")
                         for check in self.checks}
        # the runbook of each risk level's alert (GoodputGPURiskWatch, ...: `RISK == level`)
        self.risk_runbooks = {int(alert.expr.rsplit("==", 1)[1]): Runbook(alert.runbook, f"{base}/{alert.runbook}")
                              for alert in alerts(settings) if alert.expr.startswith(f"{RISK} == ")}

    def ask(self, expr: str) -> list[Sample]:
        if expr not in self._answers:
            self._answers[expr] = self.prometheus.query(expr, self.at)
        return self._answers[expr]

    def _key(self, labels: dict[str, str]) -> tuple[str | None, str]:
        return labels.get(self.s.cluster_label), labels.get("workload", "")

    # --- which workloads ---------------------------------------------------------------------------

    def targets(self, workloads: list[str] | None = None, worst: int | None = None) -> list[Target]:
        """The workloads named (every one with a verdict when none is), or the `worst` with the lowest goodput (a
        workload with no accounted time in the window, stalled, first). Raises AskError where there is nothing to
        diagnose."""
        verdicts: dict[tuple[str | None, str], Sample] = {}
        for sample in self.ask(VERDICT):
            key = self._key(sample.labels)
            known = verdicts.get(key)
            if known is None or self._order(sample) < self._order(known):  # duplicates (replicas): the first
                verdicts[key] = sample
        if not verdicts:
            raise AskError(self._nothing_to_diagnose())
        ratio = f"workload:goodput_ratio:rate{self.s.windows[0]}"
        goodput = {self._key(sample.labels): sample.value for sample in self.ask(ratio)}
        found = sorted((Target(key[0], key[1], sample.labels.get("layer", "?"), sample.labels.get("reason", "?"),
                               goodput.get(key)) for key, sample in verdicts.items()),
                       key=lambda t: (t.cluster or "", t.workload))
        if workloads:
            unknown = [w for w in dict.fromkeys(workloads) if w not in {t.workload for t in found}]
            if unknown:
                names = sorted({t.workload for t in found})
                shown = ", ".join(names[:SHOWN_NAMES]) + (f" and {len(names) - SHOWN_NAMES} more"
                                                          if len(names) > SHOWN_NAMES else "")
                raise AskError(f"no verdict for workload {', '.join(map(repr, unknown))} in this Prometheus: it "
                               f"reports no phases, or no workload has that name (workloads with a verdict: {shown})")
            found = [t for t in found if t.workload in workloads]
        if worst is not None:
            found = sorted(found, key=lambda t: (-1.0 if t.goodput is None else t.goodput, t.workload))[:worst]
        return found

    @staticmethod
    def _order(sample: Sample) -> int:
        reason = sample.labels.get("reason", "")
        try:
            return order(reason)
        except StopIteration:
            return 0

    def _nothing_to_diagnose(self) -> str:
        records = self.prometheus.recording_rules()
        phases = f"workload:goodput_phase_seconds:rate{self.s.windows[0]}"
        if records is not None and VERDICT in records:
            return (f"no workload reports phases in this Prometheus ({VERDICT} is loaded, but {phases} has no "
                    "series): nothing to diagnose yet")
        return (f"the goodput rules are not loaded in this Prometheus (no {VERDICT} series): load "
                "rules/goodput-recording.rules.yml (docs/diagnose.md)")

    def warnings(self) -> list[str]:
        """What makes the figures unreliable: rules generated with other windows than these settings name."""
        records = self.prometheus.recording_rules()
        expected = f"workload:goodput_ratio:rate{self.s.windows[0]}"
        if not records or VERDICT not in records or expected in records:
            return []
        loaded = sorted(r for r in records if r.startswith("workload:goodput_ratio:rate"))
        return [f"the goodput rules in this Prometheus were generated with other windows ({', '.join(loaded)} "
                f"recorded, not {expected}): figures will read no data; pass --rules-config with the settings "
                "they were generated from"]

    # --- the walk ----------------------------------------------------------------------------------

    def diagnose(self, targets: list[Target]) -> list[Diagnosis]:
        if not targets:
            return []
        c = self.s.cluster_label
        names = sorted({t.workload for t in targets})
        regex = string("|".join(re.escape(name) for name in names))
        failed = {(self._key(s.labels), s.labels.get("reason")) for s in self.ask(f"{CANDIDATE}{{workload=~{regex}}}")}
        held = self._held(f"workload=~{regex}")
        with_gpus = {self._key(s.labels): int(s.value) for s in self.ask(f"count by ({c}, workload) ({held})")}
        values = {term: self._worst(term, regex) for check in self.checks for term in check.terms}
        culprits = self._culprits(regex)
        risks = self._risks(held)
        forecasts: dict[tuple[str | None, str], dict[str, float]] = {}
        for name, record in FORECAST.items():
            for sample in self.ask(f"{record}{{workload=~{regex}}}"):
                forecasts.setdefault(self._key(sample.labels), {})[name] = sample.value
        out = []
        for target in targets:
            here = matchers(target, c)
            ratio = f"workload:goodput_ratio:rate{self.s.windows[0]}"
            diagnosis = Diagnosis(target, with_matchers(ratio, here) or ratio, c,
                                  culprits=culprits.get(target.key, []), forecast=forecasts.get(target.key, {}),
                                  risks=risks.get(target.key, []), gpus=with_gpus.get(target.key, 0),
                                  risk_query=self._risk_query(here))
            nodes = diagnosis.culprit_nodes
            own = string("^(?:" + re.escape(target.workload) + ")$")
            on_culprits = {term: self._worst(term, own, nodes) for check in self.checks for term in check.terms
                           if nodes and self._per_node(term)}
            for check in self.checks:
                readings = []
                for term in check.terms:
                    value = (on_culprits[term] if term in on_culprits else values[term]).get(target.key)
                    if value is None and term.absent_is_zero and (term.per != "gpu" or target.key in with_gpus):
                        value = 0.0
                    readings.append(TermReading(term, one_line(self._series(term, here)), value))
                if (target.key, check.reason) in failed:
                    status = "failed"
                elif any(r.value is not None for r in readings):
                    status = "passed"
                else:
                    status = "no_data"
                hints = [with_matchers(hint, here) or hint for hint in check.hints]
                diagnosis.checks.append(CheckReading(check, status, readings, [r.query for r in readings] + hints,
                                                     self.runbooks[check.reason]))
            out.append(diagnosis)
        return out

    def _culprits(self, regex: str) -> dict[tuple[str | None, str], list[Culprit]]:
        """The ranks the others wait for, by workload: missing from a collective (the rules' record), or the slowest
        rank by its own time per step where it is much slower than the median rank (GoodputStraggler's condition)."""
        n = self.s.node_label
        pods = {(self._key(p.labels), p.labels.get("rank", ""), p.labels.get(n, "")):
                f"{p.labels.get('namespace', '')}/{p.labels.get('pod', '')}"
                for p in self.ask(f"{RANK_POD}{{workload=~{regex}}}")}
        found: dict[tuple[str | None, str], list[Culprit]] = {}

        def add(labels: dict[str, str], why: str) -> None:
            key, rank, node = self._key(labels), labels.get("rank", ""), labels.get(n, "")
            found.setdefault(key, []).append(Culprit(rank, node, pods.get((key, rank, node)), why))

        for sample in sorted(self.ask(f"{COLLECTIVE_MISSING}{{workload=~{regex}}}"),
                             key=lambda s: (s.labels.get("pg", ""), _rank_order(s.labels.get("rank", "")))):
            add(sample.labels, f"missing from a collective of process group {sample.labels.get('pg', '?')}")
        w = self.s.windows[0]
        straggler = f"workload_rank:goodput_straggler_ratio:rate{w}"
        slowest = f"topk by ({self.s.cluster_label}, workload) (1, {straggler}{{workload=~{regex}}})"
        # what each culprit costs its job (the rules' what-if): its share of the job's GPU time, GPU-hours a day
        costs = {name: {(self._key(s.labels), s.labels.get("rank", "")): s.value
                        for s in self.ask(f"{record}{w}{{workload=~{regex}}}")}
                 for name, record in (("share", STRAGGLER_COST), ("lost", STRAGGLER_LOST))}
        for sample in sorted(self.ask(f"{slowest} > {self.s.straggler_ratio:g}"),
                             key=lambda s: _rank_order(s.labels.get("rank", ""))):
            why = f"straggler: its own time per step is {sample.value:.2f}x the median rank's"
            at = (self._key(sample.labels), sample.labels.get("rank", ""))
            if at in costs["share"]:
                why += f"; it costs the job {costs['share'][at]:.0%} of its GPU time"
                if at in costs["lost"]:
                    why += f": {24 * costs['lost'][at]:.1f} GPU-hours a day"
            add(sample.labels, why)
        return found

    def _risks(self, held: str) -> dict[tuple[str | None, str], list[GpuRisk]]:
        """The GPUs of each workload at risk level watch or worse, worst first, with the reasons at their level."""
        c, n = self.s.cluster_label, self.s.node_label

        def gpu(labels: dict[str, str]) -> tuple[str, str, str]:
            return labels.get(c, ""), labels.get(n, ""), labels.get("uuid", "")

        at_risk = f"{RISK} >= {WATCH}"
        levels = {gpu(s.labels): (s.labels.get("gpu", ""), int(s.value))
                  for s in self.ask(f"{at_risk} and on ({c}, {n}, uuid) ({held})")}
        reasons: dict[tuple[str, str, str], list[tuple[int, str]]] = {}
        for sample in self.ask(f"({risk_reasons(self.s)})\nand on ({c}, {n}, uuid) ({held})"):
            reasons.setdefault(gpu(sample.labels), []).append((int(sample.value), sample.labels.get("reason", "")))
        found: dict[tuple[str | None, str], list[GpuRisk]] = {}
        for sample in self.ask(held):
            key = gpu(sample.labels)
            if key not in levels:
                continue
            index, level = levels[key]
            why = tuple(sorted(reason for at, reason in reasons.get(key, []) if at == level))
            found.setdefault(self._key(sample.labels), []).append(
                GpuRisk(key[1], index, key[2], level, why, self.risk_runbooks[level]))
        for risks in found.values():
            risks.sort(key=lambda r: (-r.level, r.node, _rank_order(r.gpu), r.uuid))
        return found

    def _risk_query(self, here: str) -> str:
        c, n = self.s.cluster_label, self.s.node_label
        return f"{RISK} * on ({c}, {n}, uuid) group_left (workload) {self._held(here)}"

    @staticmethod
    def _per_node(term: Term) -> bool:
        """Whether the term's figure is read per GPU or per node, or is a record per workload and node: the figures
        a culprit's node is walked with."""
        return term.per in ("gpu", "node") or term.figure.startswith("workload_node:")

    def _held(self, selector: str) -> str:
        c, n = self.s.cluster_label, self.s.node_label
        return (f"max by ({c}, {n}, uuid, workload) "
                f"(max_over_time(goodput_gpu_workload_info{{{selector}}}[{self.s.bottleneck_gpu_recent_window}]))")

    def _worst(self, term: Term, regex: str, nodes: list[str] | None = None) -> dict[tuple[str | None, str], float]:
        """The term's figure, the worst series of each workload of the regex (on `nodes` only, where given)."""
        c, n = self.s.cluster_label, self.s.node_label
        figure, worst = term.shown or term.figure, term.worst
        on = f", {n}=~{string('|'.join(re.escape(node) for node in nodes))}" if nodes else ""
        if term.per == "gpu":
            expr = (f"{worst} by ({c}, workload) (\n  {self._held(f'workload=~{regex}{on}')}\n"
                    f"  * on ({c}, {n}, uuid) group_left ()\n  {worst} by ({c}, {n}, uuid) ({figure})\n)")
        elif term.per == "node":
            expr = (f"{worst} by ({c}, workload) (\n  {NODE_INFO}{{workload=~{regex}{on}}}\n"
                    f"  * on ({c}, {n}) group_left ()\n  {worst} by ({c}, {n}) ({figure})\n)")
        else:
            if on:
                figure = with_matchers(figure, on[2:]) or figure
            expr = (f"{worst} by ({c}, workload) (\n  {paren(figure)}\n  and on ({c}, workload)\n"
                    f"  {VERDICT}{{workload=~{regex}}}\n)")
        return {self._key(s.labels): s.value for s in self.ask(expr)}

    def _series(self, term: Term, here: str) -> str:
        """The term's figure, each series of one workload: what to paste to see which GPU, node or rank it is."""
        c, n = self.s.cluster_label, self.s.node_label
        figure = paren(term.shown or term.figure)
        if term.per == "gpu":
            return f"{figure} * on ({c}, {n}, uuid) group_left (workload) {self._held(here)}"
        if term.per == "node":
            return f"{figure} * on ({c}, {n}) group_left (workload) {NODE_INFO}{{{here}}}"
        return with_matchers(term.figure, here) or f"{figure} and on ({c}, workload) {VERDICT}{{{here}}}"


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 62, rank)
