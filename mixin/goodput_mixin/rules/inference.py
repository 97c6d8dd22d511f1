"""Inference rules: each serving engine's own series -> one normalized set, per server and per served model, and
the latency SLO figures and the serving GPUs from them.

Levels (labels kept):
- `server:` one scrape target of an engine (its target labels: instance, job, namespace, pod, ... ) plus
  `model` (the engine's model label, renamed) and `engine` (vllm, sglang, tgi, ray_vllm, triton; `goodput` for the
  client path);
- `workload:` a served model: `cluster`, `namespace`, `workload` (a label of the client path's series, or one the
  scrape adds), `model`, `engine`.

Engines renamed some series between versions (vLLM's gpu_cache_usage_perc -> kv_cache_usage_perc, ...): every
name an engine has used is read, series by series, the current one winning where a server exposes both.

Attainment of an objective is the share of a histogram's observations at or under its threshold, read from the
bucket whose bound is the threshold (the settings refuse a threshold that is no bound of an engine's default
buckets); a scrape without that bucket (an older, custom or trimmed layout) is read at the largest bound below the
threshold that it has, among those the engines have used and Prometheus' defaults: a lower bound, and the bound used
is recorded. An objective nothing judges (no bound at or below the threshold, or no histogram for it: TGI's time to
first token, Triton's time per output token) is unmeasured, never met: its finished requests are recorded as
unjudged, the "unmeasured" alert fires, and the model has no lower bound of the joint figure nor SLO goodput (the
upper bound and the error ratio, from the misses that are judged, still feed the burn-rate pages), unless a judged
objective was met by no request: then none met both, and the lower bound and SLO goodput are 0. Where an engine is
known not to judge an objective (the settings' `unjudged`), the alert stays silent; the figures do not change.
Two histograms do not say how many requests met both objectives: the joint attainment is recorded as its bounds,
max(0, a+b-1) and min(a, b), and exactly where the client path counted it. SLO goodput counts the requests known to
have met both (the client path's count, else the judged requests times the lower bound), never more than the
finished requests less the aborted ones; the burn-rate alerts page on errors known to have happened (1 - the exact
figure, else 1 - the upper bound), so neither flatters nor guesses. A request that ends before it is judged (aborted
before its first token) counts in neither: no engine observes a time to first token for it.

Requests are finished requests by a normalized reason (stop, length, abort, error) where the engine tells one, none
where it does not; a served model without a model label is named for its pod's owner (Deployment, StatefulSet), and
a target exposing another engine's native series (vLLM printing TGIS-named ones) is that engine's alone.
"""

from __future__ import annotations

import math
import re

from goodput_client.contract import E2E_BUCKETS as CLIENT_E2E_BUCKETS
from goodput_client.contract import ITL_BUCKETS, QUEUE_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS

from .engines import ENGINES, Engine, Native
from .objectives import OBJECTIVES, models, resolve
from .recording import Group, Rule, _groups
from .settings import RulesSettings, seconds

_R = "the client path: the serving process's own request events (goodput_client Telemetry.request)"
CLIENT = Engine(
    "goodput", "goodput-client", "this repository", "model", "python", {
        "time_to_first_token": (Native("goodput_inference_time_to_first_token_seconds", "histogram",
                                       ("workload", "model"), TTFT_BUCKETS, source=_R),),
        "time_per_output_token": (Native("goodput_inference_time_per_output_token_seconds", "histogram",
                                         ("workload", "model"), TPOT_BUCKETS, source=_R),),
        "inter_token_latency": (Native("goodput_inference_inter_token_latency_seconds", "histogram",
                                       ("workload", "model"), ITL_BUCKETS, source=_R),),
        "e2e_request_latency": (Native("goodput_inference_e2e_request_latency_seconds", "histogram",
                                       ("workload", "model"), CLIENT_E2E_BUCKETS, source=_R),),
        "queue_time": (Native("goodput_inference_queue_time_seconds", "histogram", ("workload", "model"),
                              QUEUE_BUCKETS, source=_R),),
        "prompt_tokens": (Native("goodput_inference_prompt_tokens_total", "counter", ("workload", "model"),
                                 source=_R),),
        "generation_tokens": (Native("goodput_inference_generation_tokens_total", "counter", ("workload", "model"),
                                     source=_R),),
        "requests_finished": (Native("goodput_inference_requests_total", "counter", ("workload", "model", "reason"),
                                     source=_R),),
    }, reason_label="reason")
# the labels a normalized series keeps of an engine's own (the engines' model and finish-reason labels are renamed
# to these; the client path's are these already)
NORMALIZED_LABELS = ("workload", "model", "reason")
# the bucket bound each objective is judged against (the nearest at or below its threshold)
BOUND = "workload:goodput_inference_slo_judged_bound_seconds:min"

# Labels of an engine's parallel ranks that report the same requests (SGLang's schedulers: with pipeline parallelism,
# or --enable-metrics-for-all-schedulers, every stage or tensor-parallel rank reports the batch they share): a
# series is taken once over them (max) before the sum over the ranks that hold requests of their own (dp_rank).
REPLICA_LABELS = ("tp_rank", "pp_rank", "moe_ep_rank")
# The label prometheus_client's multiprocess mode gives a gauge of mode "all"/"liveall" (its default): the process
# that wrote the value. See _Norm.once() for how SGLang's scheduler series are taken once over it.
PROCESS_LABEL = "pid"

GAUGES = {"requests_running": ("sum", "requests_running"), "requests_waiting": ("sum", "requests_waiting"),
          "kv_cache_usage": ("max", "kv_cache_usage_ratio")}
COUNTERS = {"preemptions": "preemptions", "prompt_tokens": "prompt_tokens", "generation_tokens": "generation_tokens",
            "requests_finished": "requests", "queue_seconds": "queue_seconds", "compute_seconds": "compute_seconds"}
HISTOGRAMS = {"time_to_first_token": "time_to_first_token_seconds",
              "time_per_output_token": "time_per_output_token_seconds",
              "inter_token_latency": "inter_token_latency_seconds",
              "e2e_request_latency": "e2e_request_latency_seconds", "queue_time": "queue_time_seconds"}


def engines(s: RulesSettings) -> list[Engine]:
    return [ENGINES[name] for name in s.inference_engines] + [CLIENT]


def le_pattern(value: float) -> str:
    """Every way a client library writes the bound `value` as `le`: Python's repr (1.0, 0.1; vLLM, SGLang) and the
    shortest form Go and Rust write (1, 0.1; TGI). Prometheus 3 rewrites classic histograms' `le` to the former on
    ingestion (1.0); 2.x keeps what the target wrote."""
    spellings = {repr(value)}
    if repr(value).endswith(".0"):
        spellings.add(repr(value)[:-2])
    return "|".join(re.escape(s).replace("\\", "\\\\") for s in sorted(spellings))


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _eq(label: str, value: str) -> str:
    return f'{label}="{_quote(value)}"'


def _matchers(*parts: str) -> str:
    inner = ", ".join(p for p in parts if p)
    return f"{{{inner}}}" if inner else ""


# Bounds commonly configured (Prometheus' default buckets): a histogram with custom buckets is judged at these too.
COMMON_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A Kubernetes pod's name less its ReplicaSet hash and suffix (Deployment) or its ordinal (StatefulSet): the
# alphabet is k8s.io/apimachinery's rand.SafeEncodeString.
_SAFE = "[bcdfghjklmnpqrstvwxz2456789]"
POD_OWNER = f"/(.+?)(?:-{_SAFE}{{6,10}}-{_SAFE}{{5}}|-[0-9]+)?"


def candidates(native: Native, threshold: float) -> list[float]:
    """The bounds (in the native's unit) that may judge `threshold` seconds, largest first: the threshold itself and
    every catalogued (current, older) or commonly configured bound below it."""
    limit = threshold * native.le_per
    bounds = {limit, *native.buckets, *(b for older in native.older for b in older),
              *(b * native.le_per for b in COMMON_BOUNDS)}
    below = {b for b in bounds if b < limit and not math.isclose(b, limit, rel_tol=1e-9)}
    return [limit, *sorted(below, reverse=True)]


class _Norm:
    """Expressions over one engine's series with its labels normalized."""

    def __init__(self, s: RulesSettings, engine: Engine) -> None:
        self.s = s
        self.engine = engine
        # the label naming the served model: the engine's own, else one the scrape adds (`model`)
        self.model_label = engine.model_label or "model"

    def _renamed(self, native: Native) -> list[tuple[str, str]]:
        """(the engine's label, its normalized name) for the labels of `native` that are renamed: the model's
        (`model`) and the finish reason's (`reason`)."""
        pairs = ((self.engine.model_label, "model"), (self.engine.reason_label, "reason"))
        return [(own, name) for own, name in pairs if own and own != name and own in native.labels]

    def rename(self, expr: str, native: Native) -> str:
        """`model` from the engine's model label (an engine without one: the scrape's `model`, else the pod's owner,
        so that two deployments never merge); the reason a request finished as `reason`, normalized; once over the
        ranks that report the same requests; nothing from a target that another engine's series show to be that
        engine's (vLLM's TGIS-compatible metrics)."""
        expr = self.once(expr, native)
        for own, name in self._renamed(native):
            expr = f'label_replace({expr}, "{name}", "$1", "{own}", "(.+)")'
        if self.engine.reason_label in native.labels:
            for regex, reason in self.engine.reasons:
                expr = f'label_replace({expr}, "reason", "{reason}", "reason", "{regex}")'
        if native.reason:
            expr = f'label_replace({expr}, "reason", "{native.reason}", "reason", "")'
        if self.engine.model_label is None:
            expr = (f'label_replace(label_join({expr}, "model_pod", "/", "model", "pod"), "model", "$1", "model_pod", '
                    f'"{_quote(POD_OWNER)}")')
        if self.engine.generic_models:
            expr = (f'label_replace(label_join({expr}, "workload_pod", "/", "workload", "pod"), "workload", "$1", '
                    f'"workload_pod", "{_quote(POD_OWNER)}")')
        if self.engine.yields_to:
            c = self.s.cluster_label
            # the same target (instance: one pod may run a real TGI beside a vLLM on another port or container)
            expr = f"({expr}) unless on ({c}, job, instance, namespace, pod, container) {self.engine.yields_to}"
        return expr

    @staticmethod
    def once(expr: str, native: Native) -> str:
        """`expr` taken once per group of ranks that hold the same requests: max over the replica ranks.

        What SGLang's scheduler labels mean (python/sglang/srt/metrics/collector.py up to 0.5.9, then
        observability/metrics_collector.py; the scheduler's labels in managers/scheduler.py): every scheduler is one
        process, one per (dp_rank, tp_rank, pp_rank) (moe_ep_rank follows from tp_rank). dp_rank is set where the
        scheduler is given a data-parallel rank (the real scrape: DP attention, 8 ranks, dp_rank = tp_rank), and each
        DP rank holds requests of its own. Within a DP rank
        every tensor-parallel and pipeline rank runs the same batch; only the one at attention-TP rank 0 reports,
        unless --enable-metrics-for-all-schedulers, when each reports that same batch (and each pipeline stage
        always has a scheduler of its own). So a DP rank's requests are the max over tp_rank, pp_rank and
        moe_ep_rank, and the server's the sum of that over dp_rank (dp_rank is summed away in server()).

        `pid` is not SGLang's: prometheus_client's multiprocess mode (SGLang sets PROMETHEUS_MULTIPROC_DIR) adds it to
        every gauge whose multiprocess_mode is "all" (the default) or "liveall", one series per process that wrote it
        (the real 8-rank scrape in tests/serving_corpus shows it on num_retracted_reqs and num_paused_reqs). The
        gauges read here are declared "mostrecent" in the releases checked, which drops pid, but a build that keeps
        the default would give them one. Where the series has rank labels (0.5.0 on) a pid names nothing the ranks
        do not already name (one live process per rank), so it is dropped before the max: kept, it would keep every
        reporting rank's copy of one batch apart, and the sums after it would count that batch once per rank. Where
        it has none (0.4.x scheduler labels are model_name and engine_type only), pid is the only thing that tells
        the reporting processes apart; the default (one reporting scheduler per DP rank) makes them DP ranks, so pid
        stays and is summed like dp_rank. The counters and histograms read (requests, tokens, retractions, queue
        time) never carry pid: prometheus_client sums them over processes, so nothing is done about it there."""
        replicas = [label for label in REPLICA_LABELS if label in native.labels]
        if not replicas:
            return expr
        if native.kind == "gauge" and "tp_rank" in native.labels:
            expr = f'label_replace({expr}, "{PROCESS_LABEL}", "", "tp_rank", ".+")'
        return f"max without ({', '.join(replicas)}) ({expr})"

    def drop(self, native: Native) -> list[str]:
        """The engine's labels a normalized series sums or maxes away: all but the normalized ones (workload,
        model, reason) and the replica ranks, which rename() already took once; a renamed label goes too."""
        dropped = [label for label in native.labels if label not in NORMALIZED_LABELS and label not in REPLICA_LABELS]
        if native.kind == "gauge" and any(label in REPLICA_LABELS for label in native.labels):
            dropped.append(PROCESS_LABEL)  # a scheduler process without rank labels: see once()
        return (dropped + (["model_pod"] if self.engine.model_label is None else [])
                + (["workload_pod"] if self.engine.generic_models else []))

    def rule(self, record: str, expr: str, **labels: str) -> Rule:
        """A rule of this engine: its name in the `engine` label (a static label of the rule, so that the rules
        recording one name for several engines differ, as promtool asks)."""
        return {"record": record, "expr": expr, "labels": {"engine": self.engine.name, **labels}}

    @staticmethod
    def select(native: Native, suffix: str = "", *matchers: str) -> str:
        own = f"{native.name}{suffix}{_matchers(native.match, *matchers)}"
        if not native.over:
            return own
        label = native.match.split("=", 1)[0]
        return f"({own} / ignoring ({label}) ({native.name}{suffix}{_matchers(native.over, *matchers)} > 0))"

    def rate(self, native: Native, suffix: str = "", *matchers: str) -> str:
        """The per-second rate of one counter (or histogram part), in the normalized unit; a counter with `less`:
        less that one's rate where it has the same labels."""
        w = self.s.windows[0]
        expr = f"rate({self.select(native, suffix, *matchers)}[{w}])"
        if native.less:
            less = f"rate({native.less}{_matchers(native.match, *matchers)}[{w}])"
            expr = f"({expr} - {less}) or {expr}"
        return f"({expr}) / {native.per:g}" if native.per != 1 else expr

    @staticmethod
    def _unless(expr: str, native: Native) -> str:
        """`expr` where the target has no series of `native.unless` with the same labels (but its matcher's)."""
        if not native.unless:
            return expr
        label = native.unless.split("{", 1)[1].split("=", 1)[0]
        return f"({expr} unless ignoring ({label}) {native.unless})"

    def server(self, signal: str, fn: str, counter: bool) -> str | None:
        """Per server: `fn without (the engine's own labels)` over each name the engine has used for `signal`."""
        names = self.engine.signals.get(signal, ())
        if not names:
            return None
        parts = [self.rename(self._unless(self.rate(n) if counter else self.select(n), n), n) for n in names]
        body = "\n  or\n  ".join(parts)
        dropped = sorted({label for n in names for label in self.drop(n)})
        # `without ()` when the engine has no labels of its own (TGI): every target label is kept
        return f"{fn} without ({', '.join(dropped)}) (\n  {body}\n)"

    def _by(self, keep: str = "") -> str:
        return ", ".join(filter(None, [workload_keys(self.s, engine=False), keep]))

    def workload(self, signal: str, suffix: str, matchers: str = "", keep: str = "") -> str:
        """Per served model: the rate over the short window of one histogram's `suffix` series, every name the engine
        has used (series by series, the current one first), by the workload level's labels (and `keep`)."""
        parts = [self.rename(self.rate(native, suffix, matchers), native) for native in self.engine.signals[signal]
                 if suffix != "_bucket" or native.le_per == 1]
        return f"sum by ({self._by(keep)}) (\n  " + "\n  or\n  ".join(parts) + "\n)"

    def met(self, signal: str, matchers: str, threshold: float) -> str:
        """Per served model: the requests at or under `threshold`, read at the largest bound at or below it that each
        series has (the threshold's own bucket where it exists; an older or custom layout: the nearest below, so the
        count is a lower bound). A series with no such bound gives nothing: the objective is unmeasured there."""
        parts = []
        for native in self.engine.signals[signal]:
            le = 'le=~"' + "|".join(le_pattern(b) for b in candidates(native, threshold)) + '"'
            rate = self.rate(native, "_bucket", matchers, le)
            parts.append(self.rename(f"max without (le) (\n    {rate}\n  )", native))
        return f"sum by ({self._by()}) (\n  " + "\n  or\n  ".join(parts) + "\n)"

    def bound(self, signal: str, matchers: str, threshold: float) -> str:
        """Per served model: the bound (seconds) its met count was read at, the lowest of its series'."""
        parts = []
        for native in self.engine.signals[signal]:
            each = " or ".join(self.select(native, "_bucket", matchers, 'le=~"' + le_pattern(b) + '"')
                               + f" * 0 + {b / native.le_per:.12g}" for b in candidates(native, threshold))
            parts.append(self.rename(f"max without (le) ({each})", native))
        return f"min by ({self._by()}) (\n  " + "\n  or\n  ".join(parts) + "\n)"


def workload_keys(s: RulesSettings, engine: bool = True) -> str:
    keys = [s.cluster_label, "namespace", "workload", "model"] + (["engine"] if engine else [])
    return ", ".join(keys)


# --- per server ---------------------------------------------------------------------------------------------------

def _server(s: RulesSettings, engine: Engine) -> tuple[list[Rule], list[Rule]]:
    """The engine's gauges, and its counters' rates, per server."""
    w, norm = s.windows[0], _Norm(s, engine)
    gauges: list[Rule] = []
    for signal, (fn, name) in GAUGES.items():
        expr = norm.server(signal, fn, counter=False)
        if expr:
            gauges.append(norm.rule(f"server:goodput_inference_{name}:{fn}", expr))
    rates: list[Rule] = []
    for signal, name in COUNTERS.items():
        expr = norm.server(signal, "sum", counter=True)
        if expr:
            rates.append(norm.rule(f"server:goodput_inference_{name}:rate{w}", expr))
    return gauges, rates


def _sorted(rules: list[Rule]) -> list[Rule]:
    """Rules recording the same name next to each other (one per engine), in the order first met."""
    order = {name: i for i, name in reversed(list(enumerate(r["record"] for r in rules)))}
    return sorted(rules, key=lambda r: order[r["record"]])


# --- per served model ---------------------------------------------------------------------------------------------

def _workload(s: RulesSettings) -> list[Rule]:
    w, keys = s.windows[0], workload_keys(s)
    rules: list[Rule] = []
    for fn, name in GAUGES.values():
        rules.append({"record": f"workload:goodput_inference_{name}:{fn}",
                      "expr": f"{fn} by ({keys}) (server:goodput_inference_{name}:{fn})"})
    for name in COUNTERS.values():
        by = f"{keys}, reason" if name == "requests" else keys
        rules.append({"record": f"workload:goodput_inference_{name}:rate{w}",
                      "expr": f"sum by ({by}) (server:goodput_inference_{name}:rate{w})"})
    return rules


def _latency(s: RulesSettings, signal: str) -> list[Rule]:
    """The bucket rates of one latency histogram per served model, for quantiles against the objectives."""
    w = s.windows[0]
    norms = [_Norm(s, engine) for engine in engines(s)
             if any(native.le_per == 1 for native in engine.signals.get(signal, ()))]
    return [norm.rule(f"workload:goodput_inference_{HISTOGRAMS[signal]}_bucket:rate{w}",
                      norm.workload(signal, "_bucket", keep="le")) for norm in norms]


def _objective_rules(s: RulesSettings, engine: Engine) -> list[Rule]:
    """Per objective, the requests judged and those that met it, each model at its own threshold."""
    w, norm = s.windows[0], _Norm(s, engine)
    rules: list[Rule] = []

    overridden = models(s, engine.name)
    for model in [None, *overridden]:
        if model is None:  # every model but those with objectives of their own
            match = f'!~"{_quote("|".join(re.escape(m) for m in overridden))}"' if overridden else ""
            own: dict[str, str] = {}
        else:
            match, own = f'="{_quote(model)}"', {"model": model}
        sel = f"{norm.model_label}{match}" if match else ""
        objectives = resolve(s, engine.name, model)

        def counted(name: str, sel: str = sel) -> str:
            selector = _matchers(sel, _eq("objective", name))
            return (f"sum by ({workload_keys(s, engine=False)}) (\n"
                    f"  rate(goodput_inference_slo_met_requests_total{selector}[{w}])\n)")

        judged: dict[str, str] = {}
        met: dict[str, str] = {}
        bounds: dict[str, str] = {}
        for name, (field, signal) in OBJECTIVES.items():
            if signal in engine.signals:
                judged[name] = norm.workload(signal, "_count", sel)
                # the client judged each request against its own objectives, and counted those that met both
                met[name] = counted(name) if engine is CLIENT else norm.met(signal, sel, getattr(objectives, field))
                if engine is not CLIENT:
                    bounds[name] = norm.bound(signal, sel, getattr(objectives, field))
        if engine is CLIENT:
            judged["both"], met["both"] = norm.workload("time_to_first_token", "_count", sel), counted("both")
        for name in judged:
            labels = {"objective": name, **own}
            rules += [norm.rule(f"workload:goodput_inference_slo_requests:rate{w}", judged[name], **labels),
                      norm.rule(f"workload:goodput_inference_slo_met_requests:rate{w}", met[name], **labels)]
            if name in bounds:
                rules.append(norm.rule(BOUND, bounds[name], **labels))
        # the error budget (1 - target) of each served model, beside its figures
        budget = _matchers(_eq("engine", engine.name), f"model{match}" if match else "")
        rules.append(norm.rule("workload:goodput_inference_slo_error_budget:ratio",
                               f"group by ({workload_keys(s)}) (\n"
                               f"  workload:goodput_inference_slo_requests:rate{w}{budget}\n) * "
                               f"{1 - objectives.target:.10g}", **own))
    return rules


def _objective_groups(s: RulesSettings) -> list[Group]:
    """Per engine: its judged and met requests per objective, and its error budgets, in one group, so that both counts
    of every objective come from the same evaluation and the joint attainment's bounds are exact; the bucket bound
    each objective is judged against (no rule reads it; the serving dashboard shows it) in a group of its own."""
    groups: list[Group] = []
    for engine in engines(s):
        rules = _objective_rules(s, engine)
        bounds = [rule for rule in rules if rule["record"] == BOUND]
        groups.append({"name": f"goodput.inference_slo_objectives.{engine.name}",
                       "rules": _sorted([rule for rule in rules if rule["record"] != BOUND])})
        if bounds:
            groups.append({"name": f"goodput.inference_slo_bounds.{engine.name}", "rules": bounds})
    return groups


def _attainment(s: RulesSettings, window: str) -> list[Rule]:
    """Attainment per objective, the joint attainment's bounds (and exact figure), the error ratio, in `window`."""
    w = s.windows[0]
    rules: list[Rule] = []
    if window != w:
        rules += [{"record": f"workload:goodput_inference_slo_{kind}:rate{window}",
                   "expr": f"avg_over_time(workload:goodput_inference_slo_{kind}:rate{w}[{window}])"}
                  for kind in ("requests", "met_requests")]
    att = f"workload:goodput_inference_slo_attainment_ratio:rate{window}"
    joint = f"workload:goodput_inference_slo_joint_attainment_ratio:rate{window}"
    judged, met = (f'workload:goodput_inference_slo_{kind}:rate{window}{{objective=~"ttft|tpot"}}'
                   for kind in ("requests", "met_requests"))
    # The bounds work from counts, as the objectives judge different requests (a time per output token needs two
    # tokens; SGLang judges it for finished requests only): of the N requests judged on either, the m_ttft and m_tpot
    # that missed each. The requests that missed either number at least max(m) and at most the sum, so the share
    # that met both lies in [1 - sum(m)/N, 1 - max(m)/N], which is [a+b-1, min(a, b)] where both judge the same
    # requests; where an engine judges one objective only (TGI has no time to first token), both bounds are its
    # attainment.
    missed = f"({judged}\n   - {met})"
    n = f"(max without (objective) ({judged}) > 0)"
    keys = workload_keys(s)
    # a served model with an objective nothing can judge (no bucket at or below its threshold; or no histogram for it
    # at all) has no lower bound, which SLO goodput multiplies by: it would count that objective as met. Its upper
    # bound stays: it counts only the misses known to have happened, so the error ratio and the burn-rate pages
    # still see a model that misses the objective it can judge.
    unknown = (f"(\n  ({judged} unless {met})\n  or\n  workload:goodput_inference_slo_unjudged_requests:rate{w}\n)")

    # ... except where a judged objective was met by no request: then none met both, whatever the other objective
    # (judged or not), and the lower bound is 0, exact (SLO goodput with it)
    none_met = (f'max without (objective) (\n  workload:goodput_inference_slo_met_requests:rate{window}'
                f'{{objective=~"ttft|tpot"}} == 0\n  and\n  {judged} > 0\n)')

    def bound_(expr: str, name: str) -> Rule:
        if name == "lower":
            expr = f"{none_met}\nor\n(\n{expr}\n) unless on ({keys}) {unknown}"  # `or` binds last
        return {"record": joint, "expr": expr, "labels": {"bound": name}}

    rules += [
        {"record": att, "expr": f"workload:goodput_inference_slo_met_requests:rate{window}\n"
                                f"  / (workload:goodput_inference_slo_requests:rate{window} > 0)"},
        bound_(f"clamp_min(\n  1 - sum without (objective) {missed}\n  / {n},\n  0\n)", "lower"),
        bound_(f"1 - max without (objective) {missed}\n  / {n}", "upper"),
        bound_(f'sum without (objective) ({att}{{objective="both"}})', "exact"),
        {"record": f"workload:goodput_inference_slo_error_ratio:rate{window}",
         "expr": f'1 - (\n  sum without (bound) ({joint}{{bound="exact"}})\n'
                 f'  or\n  sum without (bound) ({joint}{{bound="upper"}})\n)'},
    ]
    if window == w:
        # the requests that finished (aborted ones out, unless counted) of a model with no judged series of an
        # objective: its engine cannot judge it (TGI's time to first token, Triton's time per output token, SGLang
        # before 0.5.22's), so it is unmeasured, never met
        finished = (f"sum without (reason) (workload:goodput_inference_requests:rate{w}"
                    + ("" if s.inference_slo_count_aborted else '{reason!="abort"}') + ")")
        rules += [{"record": f"workload:goodput_inference_slo_unjudged_requests:rate{w}",
                   "expr": f"{finished} > 0\nunless on ({keys})\n"
                           f'workload:goodput_inference_slo_requests:rate{w}{{objective="{name}"}}',
                   "labels": {"objective": name}} for name in OBJECTIVES]
        # requests/s that met both objectives: the client path's exact count; else the judged requests (those with
        # a first token, or a time per output token where TTFT is not measured) times the joint share's lower
        # bound; never more than the requests that finished (aborted ones out, unless counted). A request that
        # finished without being judged (aborted before its first token) is never counted.
        judged = f'workload:goodput_inference_slo_requests:rate{w}{{objective=~"ttft|tpot"}}'
        both = f'workload:goodput_inference_slo_met_requests:rate{w}{{objective="both"}}'
        goodput = (f"(\n  sum without (objective) ({both})\n"
                   f"  or\n  max without (objective) ({judged})\n"
                   f'  * sum without (bound) ({joint}{{bound="lower"}})\n)')
        rules.append({
            "record": f"workload:goodput_inference_slo_goodput:rate{w}",
            "expr": f"{goodput} <= {finished}\nor\n{finished} and {goodput}"})
    return rules


def burn_windows(s: RulesSettings) -> list[str]:
    """Every window an SLO alert reads, shortest first."""
    windows = {*s.inference_slo_fast_windows, *s.inference_slo_slow_windows, s.windows[0]}
    return sorted(windows, key=seconds)


# --- the GPUs under each served model -----------------------------------------------------------------------------

def _gpus(s: RulesSettings) -> list[Rule]:
    c, n, w = s.cluster_label, s.node_label, s.windows[0]
    keys = workload_keys(s)
    info = "workload:goodput_inference_gpu:info"
    pods = "goodput_gpu_pod_info"
    gpu = f"on ({c}, {n}, uuid) group_left ()"

    def servers(selector: str) -> str:
        # every server from its first scrape: the gauges exist before any request finished (SGLang's and TGI's
        # request counters appear with the first); the client path has the request counters only
        return " or ".join(f"{name}{{{selector}}}" for name in (
            "server:goodput_inference_requests_running:sum", "server:goodput_inference_requests_waiting:sum",
            f"server:goodput_inference_requests:rate{w}"))

    def per_gpu(fn: str, expr: str) -> str:
        return f"{fn} by ({keys}) (\n  {info}\n  * {gpu}\n  ({expr})\n)"

    def join(gpus: str, on: str, selector: str, carried: str) -> str:
        # one served model per `on` group (topk: a pod, container or workload serving two has its GPUs counted
        # for one of them, rather than the rule failing on a many-to-many match)
        return (f"group by ({keys}, {n}, uuid) (\n  max by ({c}, {n}, uuid, {on}) ({gpus})\n"
                f"  * on ({c}, {on}) group_left ({carried})\n"
                f"  topk by ({c}, {on}) (1, group by ({c}, {on}, {carried}) ({servers(selector)}))\n)")

    return [
        # Kubernetes: the pods the kubelet assigned GPUs to, matched with the engines' pods (namespace and pod from
        # service discovery, and the container where the scrape keeps it, as the Prometheus Operator does: then two
        # containers of a pod serving two models each have their own GPUs). Elsewhere, and for the client path: the
        # workload the process source found holding each GPU, matched with the servers' workload label.
        {"record": info,
         "expr": "\nor\n".join((
             join(pods, "namespace, pod, container", 'pod!="", container!=""', "workload, model, engine"),
             join(pods, "namespace, pod", 'pod!="", container=""', "workload, model, engine"),
             join("goodput_gpu_workload_info", "workload", 'workload!=""', "namespace, model, engine")))},
        {"record": "workload:goodput_inference_gpus:count", "expr": f"count by ({keys}) ({info})"},
        {"record": f"workload:goodput_inference_gpu_idle_ratio:rate{w}",
         "expr": per_gpu("avg", f"gpu:goodput_gpu_idle_ratio:rate{w}")},
        {"record": "workload:goodput_inference_gpu_power_watts:sum",
         "expr": per_gpu("sum", f"max by ({c}, {n}, uuid) (goodput_gpu_power_watts)")},
        {"record": "workload:goodput_inference_gpu_memory_used_ratio:max",
         "expr": per_gpu("max", f"max by ({c}, {n}, uuid) (goodput_gpu_memory_used_bytes)\n"
                                f"  / max by ({c}, {n}, uuid) (goodput_gpu_memory_total_bytes > 0)")},
    ]


def inference_groups(s: RulesSettings) -> list[Group]:
    short = s.windows[0]
    gpus = _gpus(s)
    groups: list[Group] = [
        # per engine, its gauges and its rates apart: each reads every server of its engine (vLLM's seven rules in
        # one group took up to 1.17 s on vmalert at 1,200 pods)
        *({"name": f"goodput.inference_server{part}.{engine.name}", "rules": rules}
          for engine in engines(s) for part, rules in zip(("", "_rates"), _server(s, engine), strict=True) if rules),
        {"name": "goodput.inference_workload", "rules": _workload(s)},
        # one group per histogram and engine: each reads every bucket of its servers (2,000 servers' TTFT buckets
        # in one group took close to a second, bench/results.md)
        *({"name": f"goodput.inference_{signal}.{rule['labels']['engine']}", "rules": [rule]}
          for signal in HISTOGRAMS for rule in _latency(s, signal)),
        # the requests judged and met per engine, then what they attain (one evaluation behind): every engine's in
        # one group took 0.93 s median on Prometheus and 1.1 s worst on vmalert at 2,000 pods; vLLM's alone with
        # its judged bounds 0.77 s median and 1.13 s worst on Prometheus
        *_objective_groups(s),
        {"name": "goodput.inference_slo_attainment", "rules": _attainment(s, short)},
        # the GPUs under each model, then each of their figures (one evaluation behind), which reads every GPU
        {"name": "goodput.inference_gpu", "rules": gpus[:2]},
        *({"name": f"goodput.inference_gpu_{rule['record'].split(':')[1].removeprefix('goodput_inference_gpu_')}",
           "rules": [rule]} for rule in gpus[2:]),
    ]
    groups += _groups(tuple(f"goodput.inference_slo.{window}" for window in burn_windows(s)[1:]),
                      [_attainment(s, window) for window in burn_windows(s)[1:]], s.slow_groups_interval)
    return groups
