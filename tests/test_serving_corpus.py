"""Real serving-engine scrapes (tests/serving_corpus/PROVENANCE.md) through the shipped rules: each sample becomes
promtool input and the rules must give exactly the normalized series read off it by hand (expected.json).

Each sample line becomes one series with the target's labels (cluster, job, instance, namespace, pod): a gauge holds
its value; a counter, histogram part or summary part grows by its value every minute, so a rate over the rules'
window is the value / 60 s. expected.json gives, per sample, every series of the records below with its labels
beyond the target's and its value in the sample's own terms (per minute for rates, in the normalized unit: seconds,
a ratio): the test divides the rates by 60. A record a sample does not list must have no series for it.

Then the promtool cases of issue 34: a histogram without the objective's bound (judged at the bound below, exposed,
goodput never above the finished requests), SGLang without a request counter, two TGI pods without a model label, a
pod exposing vLLM's and TGIS metrics, and vLLM under Ray Serve against the same scrape served directly.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, promtool
from goodput_mixin.rules.render import rule_files
from goodput_mixin.rules.settings import RulesSettings
from prometheus_client.parser import text_string_to_metric_families

CORPUS = ROOT / "tests" / "serving_corpus"
EXPECTED: dict[str, dict[str, Any]] = json.loads((CORPUS / "expected.json").read_text())
SHIPPED = [ROOT / "rules" / "goodput-recording.rules.yml", ROOT / "rules" / "goodput-alerts.rules.yml"]
# the records compared for every sample (every series of them), read at EVAL
RECORDS = (
    "server:goodput_inference_requests_running:sum", "server:goodput_inference_requests_waiting:sum",
    "server:goodput_inference_kv_cache_usage_ratio:max", "server:goodput_inference_requests:rate5m",
    "server:goodput_inference_prompt_tokens:rate5m", "server:goodput_inference_generation_tokens:rate5m",
    "server:goodput_inference_preemptions:rate5m", "server:goodput_inference_queue_seconds:rate5m",
    "server:goodput_inference_compute_seconds:rate5m", "workload:goodput_inference_slo_requests:rate5m",
    "workload:goodput_inference_slo_met_requests:rate5m", "workload:goodput_inference_slo_judged_bound_seconds:min",
    "workload:goodput_inference_slo_unjudged_requests:rate5m",
)
EVAL = "10m"
MINUTES = 30
ENGINE_JOB = {"vllm": "vllm", "sglang": "sglang", "tgi": "tgi", "triton": "triton", "ray_vllm": "ray-head"}


def _labels(labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for k, v in labels.items())
    return "{" + inner + "}"


_PARTS = ("_total", "_bucket", "_count", "_sum")


def input_series(text: str, target: dict[str, str]) -> list[dict[str, str]]:
    """One promtool series per sample line, its name as written: gauges hold, the rest grow by their value each
    minute (a line's type from the TYPE line of its family, else its suffix)."""
    types: dict[str, str] = {}
    out = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind.strip()
        if not line.strip() or line.startswith("#"):
            continue
        (family,) = text_string_to_metric_families(line + "\n")  # one line, no TYPE: the name stays as written
        (sample,) = family.samples
        kind = next((types[n] for n in (sample.name, *(sample.name.removesuffix(s) for s in _PARTS)) if n in types),
                    "untyped")
        value = format(float(sample.value), ".17g")
        counter = kind in ("counter", "histogram", "summary") or sample.name.endswith(_PARTS)
        out.append({"series": sample.name + _labels({**sample.labels, **target}),
                    "values": f"0+{value}x{MINUTES}" if counter else f"{value}x{MINUTES}"})
    return out


def target_of(sample: dict[str, Any]) -> dict[str, str]:
    return {"cluster": "corpus", "job": ENGINE_JOB[sample["engine"]], "instance": "10.0.0.1:8000",
            "namespace": "serving", "pod": sample["pod"]}


def rounded(record: str) -> str:
    """The record's value, per minute to 1e-9 where it is a rate, else to 1e-12 (promtool compares values exactly: a
    rate of 109 per minute is no exact float per second, and 3810 per minute back from a per-second rate is off in
    the 16th digit, which rounding to 1e-12 keeps)."""
    if ":rate" in record:
        return f"round({record} * 60 * 1e9) / 1e9"
    return f"round({record} * 1e12) / 1e12"


def expected_samples(record: str, sample: dict[str, Any], target: dict[str, str]) -> list[dict[str, Any]]:
    """The record's series for this sample (labels without the name, as `rounded` drops it), values per minute."""
    rows = sample["series"].get(record, [])
    keep = target if record.startswith("server:") else {"cluster": target["cluster"], "namespace": target["namespace"]}
    return [{"labels": _labels({**keep, **labels, "engine": sample["engine"]}), "value": value}
            for labels, value in rows]


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The shipped rule files' inference groups, as shipped (the other groups read nothing served here)."""
    out = []
    for path in SHIPPED:
        groups = [g for g in yaml.safe_load(path.read_text())["groups"]
                  if g["name"].startswith(("goodput.inference", "goodput.alerts.inference"))]
        assert groups, path
        copy = tmp_path_factory.mktemp("rules") / path.name
        copy.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False, width=1000))
        out.append(str(copy))
    return out


def run_promtool(rules: list[str], tmp_path: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "corpus.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": rules, "evaluation_interval": "1m", "tests": tests},
                                   sort_keys=False, width=1000))
    return subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)


def test_the_corpus_has_what_the_issue_asks_for() -> None:
    files = {p.name for p in CORPUS.glob("*.prom")}
    assert files == set(EXPECTED)
    provenance = (CORPUS / "PROVENANCE.md").read_text()
    for name in files:
        assert name in provenance, f"{name} has no provenance"
    engines = {s["engine"] for s in EXPECTED.values()}
    assert {"vllm", "sglang", "tgi", "triton"} <= engines


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_real_scrape_gives_exactly_its_normalized_series(rules: list[str], tmp_path: Path, name: str) -> None:
    sample = EXPECTED[name]
    assert set(sample["series"]) <= set(RECORDS), sorted(set(sample["series"]) - set(RECORDS))
    target = target_of(sample)
    case = {"interval": "1m", "input_series": input_series((CORPUS / name).read_text(), target),
            "promql_expr_test": [{"expr": rounded(record), "eval_time": EVAL,
                                  "exp_samples": expected_samples(record, sample, target)} for record in RECORDS]}
    result = run_promtool(rules, tmp_path, [case])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


# --- the promtool cases of the issue ------------------------------------------------------------------------------

def _series(name: str, labels: dict[str, str], per_minute: float, gauge: bool = False) -> dict[str, str]:
    values = f"{per_minute:g}x{MINUTES}" if gauge else f"0+{per_minute:g}x{MINUTES}"
    return {"series": name + _labels(labels), "values": values}


def _exp(record: str, labels: dict[str, str], value: float) -> dict[str, Any]:
    return {"labels": record + _labels(labels), "value": value}


def _check(rules: list[str], tmp_path: Path, case: dict[str, Any]) -> None:
    result = run_promtool(rules, tmp_path, [{"interval": "1m", **case}])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


VLLM_POD = {"cluster": "c1", "job": "vllm", "instance": "10.0.1.1:8000", "namespace": "serve", "pod": "llama-0"}
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def test_a_histogram_without_the_objectives_bound_never_overstates(rules: list[str], tmp_path: Path) -> None:
    """vLLM with an older TTFT layout trimmed to (0.5, 2.5) and TPOT buckets (0.05, 0.2): the 1.0 s and 0.1 s
    objectives are judged at 0.5 and 0.05 (lower bounds, exposed), and SLO goodput stays at or under the finished
    requests (10/min, 2 of them aborted: 8 count); before the fix it read 60/min."""
    own = {**VLLM_POD, "model_name": LLAMA, "engine": "0"}
    ttft, tpot = "vllm:time_to_first_token_seconds", "vllm:request_time_per_output_token_seconds"
    series = [
        _series(f"{ttft}_bucket", {**own, "le": "0.5"}, 6), _series(f"{ttft}_bucket", {**own, "le": "2.5"}, 60),
        _series(f"{ttft}_bucket", {**own, "le": "+Inf"}, 60), _series(f"{ttft}_count", own, 60),
        _series(f"{tpot}_bucket", {**own, "le": "0.05"}, 30), _series(f"{tpot}_bucket", {**own, "le": "0.2"}, 60),
        _series(f"{tpot}_bucket", {**own, "le": "+Inf"}, 60), _series(f"{tpot}_count", own, 60),
        _series("vllm:request_success_total", {**own, "finished_reason": "stop"}, 8),
        _series("vllm:request_success_total", {**own, "finished_reason": "abort"}, 2),
    ]
    model = {"cluster": "c1", "namespace": "serve", "model": LLAMA, "engine": "vllm"}
    bound = "workload:goodput_inference_slo_judged_bound_seconds:min"
    goodput = "workload:goodput_inference_slo_goodput:rate5m"
    _check(rules, tmp_path, {"input_series": series, "promql_expr_test": [
        {"expr": bound, "eval_time": EVAL, "exp_samples": [
            _exp(bound, {**model, "objective": "ttft"}, 0.5), _exp(bound, {**model, "objective": "tpot"}, 0.05)]},
        {"expr": "workload:goodput_inference_slo_met_requests:rate5m", "eval_time": EVAL, "exp_samples": [
            _exp("workload:goodput_inference_slo_met_requests:rate5m", {**model, "objective": "ttft"}, 0.1),
            _exp("workload:goodput_inference_slo_met_requests:rate5m", {**model, "objective": "tpot"}, 0.5)]},
        # judged 60/min, lower bound of both max(0, 0.1 + 0.5 - 1) = 0 -> 0; the upper bound min(0.1, 0.5)
        {"expr": goodput, "eval_time": EVAL, "exp_samples": [_exp(goodput, model, 0.0)]},
        {"expr": f"{goodput} <= on (cluster, namespace, model, engine) sum without (reason) "
                 '(workload:goodput_inference_requests:rate5m{reason!="abort"})',
         "eval_time": EVAL, "exp_samples": [_exp("", model, 0.0)]},
    ]})


def test_goodput_is_at_most_the_finished_requests(rules: list[str], tmp_path: Path) -> None:
    """Every request judged meets both objectives (60/min judged, a scrape whose TTFT counts every request that got a
    first token), but only 10/min finished (not aborted): SLO goodput is 10/min, not 60."""
    own = {**VLLM_POD, "model_name": LLAMA, "engine": "0"}
    ttft, tpot = "vllm:time_to_first_token_seconds", "vllm:request_time_per_output_token_seconds"
    series = [_series(f"{name}_bucket", {**own, "le": le}, 60) for name, le in ((ttft, "1.0"), (ttft, "+Inf"),
                                                                                    (tpot, "0.1"), (tpot, "+Inf"))]
    series += [_series(f"{ttft}_count", own, 60), _series(f"{tpot}_count", own, 60),
               _series("vllm:request_success_total", {**own, "finished_reason": "stop"}, 10),
               _series("vllm:request_success_total", {**own, "finished_reason": "abort"}, 50)]
    model = {"cluster": "c1", "namespace": "serve", "model": LLAMA, "engine": "vllm"}
    goodput = "workload:goodput_inference_slo_goodput:rate5m"
    _check(rules, tmp_path, {"input_series": series, "promql_expr_test": [
        {"expr": rounded(goodput), "eval_time": EVAL, "exp_samples": [_exp("", model, 10)]}]})  # per minute


def test_sglang_without_a_request_counter_has_a_request_rate(rules: list[str], tmp_path: Path) -> None:
    """SGLang before 0.4.2: no num_requests_total; the e2e histogram's count gives the rate. Its TPOT is never judged
    (no per-request histogram): the "unmeasured" alert fires for it."""
    own = {**VLLM_POD, "job": "sglang", "pod": "sg-0", "model_name": "qwen"}
    series = [_series("sglang:e2e_request_latency_seconds_count", own, 30),
              _series("sglang:time_to_first_token_seconds_bucket", {**own, "le": "1.0"}, 30),
              _series("sglang:time_to_first_token_seconds_count", own, 30)]
    server = {k: v for k, v in own.items() if k != "model_name"} | {"model": "qwen", "engine": "sglang"}
    model = {"cluster": "c1", "namespace": "serve", "model": "qwen", "engine": "sglang"}
    _check(rules, tmp_path, {"input_series": series, "promql_expr_test": [
        {"expr": "server:goodput_inference_requests:rate5m", "eval_time": EVAL,
         "exp_samples": [_exp("server:goodput_inference_requests:rate5m", server, 0.5)]},
        {"expr": "workload:goodput_inference_slo_unjudged_requests:rate5m", "eval_time": EVAL,
         "exp_samples": [_exp("workload:goodput_inference_slo_unjudged_requests:rate5m",
                              {**model, "objective": "tpot"}, 0.5)]}],
        "alert_rule_test": [{"eval_time": "20m", "alertname": "GoodputInferenceSLOUnmeasured", "exp_alerts": [
            {"exp_labels": {"severity": "warning", **model, "objective": "tpot"},
             "exp_annotations": _annotations("GoodputInferenceSLOUnmeasured", {**model, "objective": "tpot"})}]}]})


def _annotations(alert: str, labels: dict[str, str]) -> dict[str, str]:
    """The shipped alert's annotations with its label templates filled in."""
    groups = yaml.safe_load(SHIPPED[1].read_text())["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r.get("alert") == alert]
    out = {}
    for key, text in rule["annotations"].items():
        text = re.sub(r"\{\{ with \$labels\.(\w+) \}\}(.*?)\{\{ \. \}\}\{\{ end \}\}",
                      lambda m: m.group(2) + labels[m.group(1)] if labels.get(m.group(1)) else "", text)
        out[key] = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)
    return out


def test_two_tgi_deployments_without_a_model_label_stay_two(rules: list[str], tmp_path: Path) -> None:
    """Two TGI Deployments in one namespace, no model label from the scrape: each is its own served model (named
    for its Deployment), and two replicas of one Deployment are one."""
    pods = {"chat-6d8f9c7b5-x2k9p": 10, "chat-6d8f9c7b5-q7w4z": 20, "code-7c9d5b8f6-m4n8t": 30}
    series = [_series("tgi_request_success", {"cluster": "c1", "job": "tgi", "instance": f"10.0.2.{i}:80",
                                              "namespace": "serve", "pod": pod}, n)
              for i, (pod, n) in enumerate(pods.items())]
    record = "workload:goodput_inference_requests:rate5m"
    _check(rules, tmp_path, {"input_series": series, "promql_expr_test": [
        {"expr": record, "eval_time": EVAL, "exp_samples": [
            _exp(record, {"cluster": "c1", "namespace": "serve", "model": "chat", "engine": "tgi"}, 0.5),
            _exp(record, {"cluster": "c1", "namespace": "serve", "model": "code", "engine": "tgi"}, 0.5)]}]})


def test_two_triton_deployments_serving_ensemble_stay_two(rules: list[str], tmp_path: Path) -> None:
    """Triton's TensorRT-LLM model repository names its models the same in every deployment (ensemble, tensorrt_llm):
    two Deployments in one namespace, no workload label from the scrape, are two served models (the workload named
    for each pod's Deployment), and two replicas of one Deployment are one."""
    pods = {"llama-trt-6d8f9c7b5-x2k9p": 10, "llama-trt-6d8f9c7b5-q7w4z": 20, "mistral-trt-7c9d5b8f6-m4n8t": 30}
    series = [_series("nv_inference_request_success", {"cluster": "c1", "job": "triton", "instance": f"10.0.3.{i}:8002",
                                                       "namespace": "serve", "pod": pod, "model": "ensemble",
                                                       "version": "1"}, n)
              for i, (pod, n) in enumerate(pods.items())]
    record = "workload:goodput_inference_requests:rate5m"
    model = {"cluster": "c1", "namespace": "serve", "model": "ensemble", "engine": "triton"}
    _check(rules, tmp_path, {"input_series": series, "promql_expr_test": [
        {"expr": record, "eval_time": EVAL, "exp_samples": [
            _exp(record, {**model, "workload": "llama-trt"}, 0.5),
            _exp(record, {**model, "workload": "mistral-trt"}, 0.5)]}]})


def test_triton_waiting_requests_are_the_batchers_else_tritons_pending(rules: list[str], tmp_path: Path) -> None:
    """A Triton pod whose in-flight batcher counts its waiting requests (2) reads those, not also Triton's pending gauge
    (1) for the same model (docs/inference-engines.md: the batcher's, else the pending gauge); an older backend
    without that gauge reads the pending one."""
    new = {"cluster": "c1", "job": "triton", "instance": "10.0.3.1:8002", "namespace": "serve",
           "pod": "trt-0", "model": "tensorrt_llm", "version": "1"}
    old = {**new, "instance": "10.0.3.2:8002", "pod": "trt-1"}
    series = [_series("nv_trt_llm_request_metrics", {**new, "request_type": "waiting"}, 2, gauge=True),
              _series("nv_inference_pending_request_count", new, 1, gauge=True),
              _series("nv_inference_pending_request_count", old, 3, gauge=True)]
    record = "server:goodput_inference_requests_waiting:sum"

    def server(target: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in target.items() if k != "version"} | {"workload": "trt", "engine": "triton"}
    _check(rules, tmp_path, {"input_series": series, "promql_expr_test": [
        {"expr": record, "eval_time": EVAL, "exp_samples": [_exp(record, server(new), 2),
                                                            _exp(record, server(old), 3)]}]})


def test_a_pod_with_vllm_and_tgis_metrics_counts_once(rules: list[str], tmp_path: Path) -> None:
    """A vLLM build with TGIS-compatible metrics (IBM/vllm PR #18) exposes tgi_* beside vllm:* on one target: it is
    one vLLM server, not also a TGI one."""
    own = {**VLLM_POD, "model_name": LLAMA}
    series = [_series("vllm:num_requests_running", own, 3, gauge=True),
              _series("vllm:request_success_total", {**own, "finished_reason": "stop"}, 30),
              _series("tgi_request_success", VLLM_POD, 30), _series("tgi_batch_current_size", VLLM_POD, 3, gauge=True),
              _series("tgi_queue_size", VLLM_POD, 1, gauge=True)]
    server = {**VLLM_POD, "model": LLAMA, "engine": "vllm"}
    _check(rules, tmp_path, {"input_series": series, "promql_expr_test": [
        {"expr": "server:goodput_inference_requests:rate5m", "eval_time": EVAL,
         "exp_samples": [_exp("server:goodput_inference_requests:rate5m", {**server, "reason": "stop"}, 0.5)]},
        {"expr": "server:goodput_inference_requests_running:sum", "eval_time": EVAL,
         "exp_samples": [_exp("server:goodput_inference_requests_running:sum", server, 3)]},
        {"expr": "server:goodput_inference_requests_waiting:sum", "eval_time": EVAL, "exp_samples": []}]})


def test_a_real_tgi_beside_a_vllm_in_one_pod_is_counted(rules: list[str], tmp_path: Path) -> None:
    """A pod running vLLM on port 8000 and a real TGI on port 80 (two targets of one job, no container label): the TGI
    target is its own server, as only a target exposing vLLM's series is that vLLM's."""
    own = {**VLLM_POD, "model_name": LLAMA}
    tgi = {**VLLM_POD, "instance": "10.0.1.1:80", "model": "bigscience/bloom"}
    series = [_series("vllm:num_requests_running", own, 3, gauge=True),
              _series("vllm:request_success_total", {**own, "finished_reason": "stop"}, 30),
              _series("tgi_request_success", tgi, 60), _series("tgi_batch_current_size", tgi, 2, gauge=True)]
    record = "server:goodput_inference_requests:rate5m"
    _check(rules, tmp_path, {"input_series": series, "promql_expr_test": [
        {"expr": record, "eval_time": EVAL, "exp_samples": [
            _exp(record, {**VLLM_POD, "model": LLAMA, "engine": "vllm", "reason": "stop"}, 0.5),
            _exp(record, {**tgi, "engine": "tgi"}, 1.0)]}]})


def _vllm_scrape() -> str:
    """vLLM 0.11-shaped series (names, labels, default buckets from engines.py) for one model on one engine."""
    from goodput_mixin.rules.engines import VLLM

    lines = []
    for natives in VLLM.signals.values():
        native = natives[0]
        labels = {"model_name": LLAMA, "engine": "0"}
        if native.kind == "histogram":
            for i, b in enumerate((*native.buckets, math.inf)):
                le = "+Inf" if math.isinf(b) else repr(b)
                lines.append(f"{native.name}_bucket{_labels({**labels, 'le': le})} {min(i + 1, 12)}")
            lines.append(f"{native.name}_count{_labels(labels)} 12")
        elif "finished_reason" in native.labels:
            lines += [f"{native.name}{_labels({**labels, 'finished_reason': r})} {n}" for r, n in
                      (("stop", 9), ("length", 2), ("abort", 1))]
        else:
            lines.append(f"{native.name}{_labels(labels)} {5 if native.kind == 'gauge' else 7}")
    return "\n".join(lines) + "\n"


def test_vllm_under_ray_serve_gives_every_series_a_direct_scrape_gives(rules: list[str], tmp_path: Path) -> None:
    """The same vLLM series under Ray's prefix and labels (WorkerId, SessionName, NodeAddress), scraped from the Ray
    node's pod, give the same normalized series as a direct scrape of that pod, engine aside."""
    direct = _vllm_scrape()
    ray = "".join(
        "ray_" + line.replace("{", '{WorkerId="01c5e8",SessionName="session_2025",NodeAddress="10.0.1.1",', 1) + "\n"
        for line in direct.splitlines())
    target = {**VLLM_POD, "job": "vllm"}
    ray_target = {**VLLM_POD, "job": "ray-head", "pod": "llama-0"}
    # every record a direct vLLM scrape of this shape gives (Triton's queue and compute times and the unjudged
    # requests aside: vLLM has no such counters and judges both objectives)
    records = [r for r in RECORDS if not any(x in r for x in ("queue_seconds", "compute_seconds", "unjudged"))]
    records += ["workload:goodput_inference_time_to_first_token_seconds_bucket:rate5m",
                "workload:goodput_inference_slo_goodput:rate5m"]
    exprs = []
    for record in records:
        # per series of the direct scrape, the Ray one with the same labels (job and engine aside)
        same = (f'label_replace({record}{{engine="ray_vllm"}}, "job", "vllm", "job", "ray-head") '
                f'== ignoring (engine) {record}{{engine="vllm"}}')
        exprs.append({"expr": f'count({record}{{engine="vllm"}}) - count({same})', "eval_time": EVAL,
                      "exp_samples": [{"labels": "{}", "value": 0}]})
        exprs.append({"expr": f'count({record}{{engine="ray_vllm"}}) - count({record}{{engine="vllm"}})',
                      "eval_time": EVAL, "exp_samples": [{"labels": "{}", "value": 0}]})
    _check(rules, tmp_path, {"input_series": input_series(direct, target) + input_series(ray, ray_target),
                      "promql_expr_test": exprs})


# --- SGLang under prometheus_client's multiprocess mode (issue 43, item 4) ----------------------------------------

MULTIPROCESS = "sglang_v0.5-early_2025-09-30_aibrix-issue1614.prom"


def _scheduler_rows() -> list[dict[str, str]]:
    """The scheduler label sets of the real 8-rank scrape (one per DP rank, each with its process's `pid`), read off
    its num_retracted_reqs and num_paused_reqs rows: those two families carry every rank between them."""
    rows: dict[str, dict[str, str]] = {}
    for family in text_string_to_metric_families((CORPUS / MULTIPROCESS).read_text()):
        for sample in family.samples:
            if "pid" in sample.labels:
                rows[sample.labels["dp_rank"]] = dict(sample.labels)
    return [rows[rank] for rank in sorted(rows, key=int)]


def test_sglang_scheduler_gauges_of_the_multiprocess_scrape_count_each_batch_once(rules: list[str],
                                                                                   tmp_path: Path) -> None:
    """The real scrape's scheduler label sets (8 DP ranks, DP attention: dp_rank = tp_rank, each its own process
    `pid`) on the running and waiting gauges, which its excerpt does not show: DP rank r runs r + 1 requests and queues
    2. First as the scrape is (one reporting scheduler per DP rank): the server runs 1 + ... + 8 = 36 and queues 16,
    one series without pid. Then the same processes with --enable-metrics-for-all-schedulers and two tensor-parallel
    ranks per DP rank (dp_rank = tp_rank // 2, 4 DP ranks: each pair reports the batch it shares, 2r + 1 and 2r + 2
    are the pair's tp ranks): every DP rank counted once, not once per rank and process."""
    rows = _scheduler_rows()
    assert len(rows) == 8 and len({row["pid"] for row in rows}) == 8, rows
    target = {"cluster": "c1", "job": "sglang", "instance": "10.0.4.1:30000", "namespace": "serve",
              "pod": "deepseek-r1-decode-0"}
    server = {**target, "model": "deepseek-r1", "engine": "sglang"}
    running, waiting = "server:goodput_inference_requests_running:sum", "server:goodput_inference_requests_waiting:sum"

    def case(labels: list[dict[str, str]], running_of: list[int], total_running: int, total_waiting: int) -> None:
        series = [s for row, n in zip(labels, running_of, strict=True)
                  for s in (_series("sglang:num_running_reqs", {**row, **target}, n, gauge=True),
                            _series("sglang:num_queue_reqs", {**row, **target}, 2, gauge=True))]
        _check(rules, tmp_path, {"input_series": series, "promql_expr_test": [
            {"expr": running, "eval_time": EVAL, "exp_samples": [_exp(running, server, total_running)]},
            {"expr": waiting, "eval_time": EVAL, "exp_samples": [_exp(waiting, server, total_waiting)]},
            {"expr": "workload:goodput_inference_requests_running:sum", "eval_time": EVAL, "exp_samples": [
                _exp("workload:goodput_inference_requests_running:sum",
                     {"cluster": "c1", "namespace": "serve", "model": "deepseek-r1", "engine": "sglang"},
                     total_running)]}]})

    case(rows, [int(row["dp_rank"]) + 1 for row in rows], 36, 16)
    paired = [{**row, "dp_rank": str(int(row["tp_rank"]) // 2)} for row in rows]
    case(paired, [int(row["dp_rank"]) + 1 for row in paired], 1 + 2 + 3 + 4, 4 * 2)


# --- objectives an engine cannot judge (issue 43, item 3) ---------------------------------------------------------

UNJUDGED_SETTINGS = ("inference_slo_overrides:\n  - {engine: tgi, unjudged: [ttft]}\n"
                     "  - {engine: triton, unjudged: [tpot]}\n")


def _rendered(tmp_path: Path, settings: str) -> list[str]:
    """The inference groups of the rules rendered with `settings` (as the `rules` fixture takes the shipped ones)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    files = rule_files(RulesSettings.model_validate(yaml.safe_load(settings)))
    out = []
    for name in ("goodput-recording.rules.yml", "goodput-alerts.rules.yml"):
        groups = [g for g in yaml.safe_load(files[name])["groups"]
                  if g["name"].startswith(("goodput.inference", "goodput.alerts.inference"))]
        (tmp_path / name).write_text(yaml.safe_dump({"groups": groups}, sort_keys=False, width=1000))
        out.append(str(tmp_path / name))
    return out


@pytest.mark.parametrize("declared", [False, True], ids=["shipped", "unjudged-declared"])
def test_an_objective_the_engine_cannot_judge_pages_only_where_a_judgement_was_expected(
        rules: list[str], tmp_path: Path, declared: bool) -> None:
    """TGI (no time-to-first-token histogram) and Triton (no per-request time per output token), two pods each,
    60 requests a minute. mistral-0 and trt-0 meet their judged objective 45 times a minute; slow-0 and stuck-0 never
    (their threshold buckets stay 0). Shipped, GoodputInferenceSLOUnmeasured fires for all four, on the objective
    nothing judges; with `unjudged` declared for those engines it fires for none. Either way SLO goodput is absent
    where the unjudged objective could have been met (mistral, trt) and 0 where the judged one was met by no request
    (slow, stuck): none of those requests met both."""
    if declared:
        rules = _rendered(tmp_path / "rendered", UNJUDGED_SETTINGS)
    tpot = "tgi_request_mean_time_per_token_duration"
    first = "nv_inference_first_response_histogram_ms"
    series = []
    for pod, met in (("mistral-0", 45), ("slow-0", 0)):
        tgi = {"cluster": "c1", "job": "tgi", "instance": f"10.0.6.{met}:80", "namespace": "serve", "pod": pod}
        series += [_series("tgi_request_success", tgi, 60), _series(f"{tpot}_count", tgi, 60),
                   _series(f"{tpot}_bucket", {**tgi, "le": "0.09852612533569335"}, met),
                   _series(f"{tpot}_bucket", {**tgi, "le": "+Inf"}, 60)]
    for pod, met in (("trt-0", 45), ("stuck-0", 0)):
        trt = {"cluster": "c1", "job": "triton", "instance": f"10.0.7.{met}:8002", "namespace": "serve", "pod": pod,
               "model": "ensemble", "version": "1"}
        series += [_series("nv_inference_request_success", trt, 60), _series(f"{first}_count", trt, 60),
                   _series(f"{first}_bucket", {**trt, "le": "1000"}, met),
                   _series(f"{first}_bucket", {**trt, "le": "+Inf"}, 60)]
    base = {"cluster": "c1", "namespace": "serve"}
    models = {"mistral": {**base, "model": "mistral", "engine": "tgi"},
              "slow": {**base, "model": "slow", "engine": "tgi"},
              "trt": {**base, "workload": "trt", "model": "ensemble", "engine": "triton"},
              "stuck": {**base, "workload": "stuck", "model": "ensemble", "engine": "triton"}}
    unjudged = {"mistral": "ttft", "slow": "ttft", "trt": "tpot", "stuck": "tpot"}
    goodput = "workload:goodput_inference_slo_goodput:rate5m"
    lower = "workload:goodput_inference_slo_joint_attainment_ratio:rate5m"
    alerts = [] if declared else [
        {"exp_labels": {"severity": "warning", **labels, "objective": unjudged[name]},
         "exp_annotations": _annotations("GoodputInferenceSLOUnmeasured", {**labels, "objective": unjudged[name]})}
        for name, labels in models.items()]
    _check(rules, tmp_path, {"input_series": series, "promql_expr_test": [
        {"expr": goodput, "eval_time": EVAL,
         "exp_samples": [_exp(goodput, models["slow"], 0), _exp(goodput, models["stuck"], 0)]},
        {"expr": f'{lower}{{bound="lower"}}', "eval_time": EVAL,
         "exp_samples": [_exp(lower, {**models["slow"], "bound": "lower"}, 0),
                         _exp(lower, {**models["stuck"], "bound": "lower"}, 0)]},
        # the records that say so are the same either way: the setting only keeps the alert quiet
        {"expr": "workload:goodput_inference_slo_unjudged_requests:rate5m", "eval_time": EVAL, "exp_samples": [
            _exp("workload:goodput_inference_slo_unjudged_requests:rate5m", {**labels, "objective": unjudged[name]},
                 1) for name, labels in models.items()]}],
        "alert_rule_test": [{"eval_time": "20m", "alertname": "GoodputInferenceSLOUnmeasured", "exp_alerts": alerts}]})
