"""Rules at cluster scale: Prometheus's own evaluation time of our rule groups over a synthetic history
of 10,000 GPUs (1,250 nodes) and 100 workloads x 64 ranks, and the series count per GPU of one daemon.

The history is OpenMetrics written here, turned into TSDB blocks by `promtool tsdb create-blocks-from
openmetrics`, and served by Debian's Prometheus with the rule files of rules/ as shipped, at a 30 s
evaluation interval (kube-prometheus-stack's default; the slow groups at their own 1m). It spans 62
minutes, one sample a minute but for the last 10 minutes, which are at a 15 s scrape so that the 5m
windows read as many samples as they would; that keeps it to about 30 million samples on a 2-core
machine. It ends about when
Prometheus starts on it (a block reaching into the future would make Prometheus discard every rule
result as out of bounds), and the groups are measured in the next few minutes. Each group's
`evaluationTime` is read from /api/v1/rules: of the groups evaluated every 30 s, the first of 8
evaluations (cold blocks read from disk) apart, then the median and worst of the last 6; of the slow
groups, the first of 3 apart, then the last 2. Run alone with `python bench/rules_scale.py`.

Every GPU also reports DCGM's activity ratios (the dcgm source on), and the ranks' GPUs carry the
attribution info series (workload and pod), so the groups reading them cost what they would.

The long-window (1h) groups average what the short-window (5m) rules recorded, so the history also
holds an hour of those recorded series, as a Prometheus that has run the rules for an hour would: the
names are read from the long groups' expressions and the label sets follow the fleet; their values
are constants (the cost of a range read does not depend on them), written every 30 s as the rules would
record them, and a check at the end proves every series the short groups record had a full hour behind it.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import yaml
from serving import free_port, wait_ready

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / ".work" / "rules-scale"
NODES = 1250
GPUS_PER_NODE = 8
WORKLOADS = 100
RANKS = 64
STEP = 60  # seconds between samples, but for the last RECENT seconds:
RECENT, SCRAPE = 600, 15  # ... which are at a 15 s scrape, so the 5m windows read what they would
HISTORY = 62 * 60
AHEAD = 420  # the history ends this long after it is started: writing and converting it takes 2-3 minutes
EVALUATIONS = 8  # of each group evaluated at every evaluation (30 s); the first few read cold blocks
COLD = 2  # ... so the first is reported apart and the median and worst taken over the last 6
SLOW_EVALUATIONS = 3  # of each group with its own, longer interval (1m): the first apart, then the last 2
EVAL_INTERVAL = 30  # kube-prometheus-stack's default; Prometheus's own is 1m
NAMESPACES = 20  # the workloads' pods are spread over this many namespaces
DCGM_RATIOS = {"sm": 0.9, "dram": 0.4, "tensor": 0.6, "fp16": 0.1, "fp32": 0.2, "fp64": 0.0}  # x busy


@dataclass
class Result:
    series: int
    samples: int
    groups: dict[str, tuple[float, float, float, int]]  # name -> (first s, steady median s, steady worst s, rules)
    rules: dict[str, float]  # rule name -> steady median evaluation time, s
    members: dict[str, list[str]]  # group -> its rules' names
    slow: set[str]  # groups evaluated at their own, longer interval
    per_gpu_series: float  # series with a gpu label, per GPU, of one daemon at default settings
    per_gpu_total: float  # all series of that daemon, per GPU

    def slowest(self, group: str) -> tuple[str, float]:
        """The group's rule with the largest steady median evaluation time."""
        return max(((name, self.rules.get(name, 0.0)) for name in self.members[group]), key=lambda item: item[1])


def _allocated(node: int, gpu: int) -> bool:
    """Four GPUs in five are held by a job."""
    return bool((node + gpu) % 5)


def _long_inputs(files: dict[str, str]) -> list[str]:
    """The recorded series the long-window groups read over their window."""
    names: set[str] = set()
    for text in files.values():
        for group in yaml.safe_load(text)["groups"]:
            if "interval" in group:
                for rule in group["rules"]:
                    names |= set(re.findall(r"(?:avg_over_time|deriv)\(([a-z_]+:\w+:\w+)\[", rule["expr"]))
    return sorted(names)


def _recorded_labels(name: str) -> list[str]:
    """Label sets of a short-window recorded series over the synthetic fleet (no cluster label)."""
    level, metric = name.split(":")[:2]
    job = 'job="goodput-exporter"'
    if level == "gpu":
        sets = []
        for node in range(NODES):
            for gpu in range(GPUS_PER_NODE):
                allocated = _allocated(node, gpu)
                if ("while_allocated" in metric and not allocated) or ("unallocated" in metric and allocated):
                    continue
                sets.append(f'instance="node{node}:9445",{job},gpu="{gpu}",uuid="GPU-{node:04d}-{gpu}"')
        return sets
    if level == "node":
        return [f'instance="node{node}:9445"' for node in range(NODES)]
    if level == "cluster":
        return [""]
    if level == "namespace":
        return [f'namespace="team{n}"' for n in range(NAMESPACES)]
    if level == "workload" and metric == "goodput_phase_seconds":
        return [f'workload="job{w}",phase="{p}"' for w in range(WORKLOADS)
                for p in ("compute", "data_wait", "comm_wait", "checkpoint", "startup", "other")]
    if level == "workload":
        return [f'workload="job{w}"' for w in range(WORKLOADS)]
    if level == "workload_rank":
        return [f'workload="job{w}",rank="{r}"' for w in range(WORKLOADS) for r in range(RANKS)]
    raise ValueError(f"{name}: the bench does not know this level's labels; teach _recorded_labels")


def _write_history(path: Path, now: int, long_inputs: list[str]) -> tuple[int, int]:
    """OpenMetrics text of the whole fleet; returns (series, samples)."""
    start = now - HISTORY
    end = now + AHEAD
    times = list(range(start - start % STEP, end - RECENT, STEP)) + list(range(end - RECENT, end, SCRAPE))
    # the recorded series at the interval their rules are evaluated at, as the long windows read them
    recorded = list(range(start - start % EVAL_INTERVAL, end, EVAL_INTERVAL))
    series = samples = 0
    with path.open("w") as out:
        def counter(name: str, labels: str, per_second: float) -> None:
            nonlocal series, samples
            series, samples = series + 1, samples + len(times)
            out.writelines(f"{name}{{{labels}}} {round((t - times[0]) * per_second, 3)} {t}\n" for t in times)

        def gauge(name: str, labels: str, value: float, at: list[int] = times) -> None:
            nonlocal series, samples
            series, samples = series + 1, samples + len(at)
            head = f"{name}{{{labels}}} {value} " if labels else f"{name} {value} "
            out.writelines(f"{head}{t}\n" for t in at)

        for family, kind in (("goodput_gpu_idle_seconds", "counter"), ("goodput_gpu_sampled_seconds", "counter"),
                             ("goodput_gpu_allocated", "gauge"), ("goodput_gpu_memory_used_bytes", "gauge"),
                             ("goodput_gpu_memory_total_bytes", "gauge"), ("goodput_gpu_ecc_errors", "counter"),
                             ("goodput_gpu_clock_throttle_seconds", "counter"), ("goodput_gpu_xid_errors", "counter"),
                             ("up", "gauge"), ("goodput_exporter_source_up", "gauge"),
                             ("goodput_phase_seconds", "counter"), ("goodput_steps", "counter"),
                             ("goodput_tokens", "counter"), ("goodput_step_duration_seconds_sum", "gauge"),
                             ("goodput_step_duration_seconds_count", "gauge"),
                             ("goodput_collective_last_seq", "gauge"),
                             ("goodput_collective_oldest_inflight_seconds", "gauge"),
                             ("goodput_flight_recorder_dump_timestamp_seconds", "gauge"),
                             *((f"goodput_gpu_{name}_active_ratio", "gauge") for name in DCGM_RATIOS),
                             ("goodput_gpu_workload_info", "gauge"), ("goodput_gpu_pod_info", "gauge")):
            out.write(f"# TYPE {family} {kind}\n")
            for node in range(NODES):
                inst = f'instance="node{node}:9445",job="goodput-exporter"'
                if family == "up":
                    gauge("up", inst, 1)
                elif family == "goodput_exporter_source_up":
                    for source in ("nvml", "host", "ingest", "flight"):
                        gauge(family, f'{inst},source="{source}"', 1)
                elif family.startswith("goodput_gpu_"):
                    for gpu in range(GPUS_PER_NODE):
                        labels = f'{inst},gpu="{gpu}",uuid="GPU-{node:04d}-{gpu}"'
                        busy = 0.5 + 0.4 * ((node * 8 + gpu) % 10) / 10
                        if family == "goodput_gpu_idle_seconds":
                            counter(f"{family}_total", labels, 1 - busy)
                        elif family == "goodput_gpu_sampled_seconds":
                            counter(f"{family}_total", labels, 1)
                        elif family == "goodput_gpu_allocated":
                            gauge(family, labels, int(_allocated(node, gpu)))
                        elif family == "goodput_gpu_memory_used_bytes":
                            gauge(family, labels, 40 * 2**30)
                        elif family == "goodput_gpu_memory_total_bytes":
                            gauge(family, labels, 80 * 2**30)
                        elif family == "goodput_gpu_ecc_errors":
                            for kind in ("corrected", "uncorrected"):
                                counter(f"{family}_total", f'{labels},error_type="{kind}"', 0)
                        elif family == "goodput_gpu_clock_throttle_seconds":
                            for reason in ("power", "thermal", "sync_boost", "board_limit", "low_utilization",
                                           "reliability"):
                                counter(f"{family}_total", f'{labels},reason="{reason}"', 0.01)
                        elif family == "goodput_gpu_xid_errors" and gpu == 0 and node % 100 == 0:
                            counter(f"{family}_total", f'{labels},xid="79"', 0)
                        elif family.endswith("_active_ratio"):  # the dcgm source, on every GPU
                            gauge(family, labels, round(busy * DCGM_RATIOS[family[len("goodput_gpu_"):-13]], 3))
                        elif family.endswith("_info") and node * GPUS_PER_NODE + gpu < WORKLOADS * RANKS:
                            workload, rank = divmod(node * GPUS_PER_NODE + gpu, RANKS)  # the ranks' GPUs
                            if family == "goodput_gpu_workload_info":
                                gauge(family, f'{labels},workload="job{workload}",rank="{rank}"', 1)
                            else:
                                gauge(family, f'{labels},mig_uuid="",pod="job{workload}-{rank}",'
                                      f'namespace="team{workload % NAMESPACES}",container="train"', 1)
            if not family.startswith(("goodput_phase", "goodput_steps", "goodput_tokens", "goodput_step_",
                                      "goodput_collective", "goodput_flight")):
                continue
            for workload in range(WORKLOADS):
                for rank in range(RANKS):
                    node = (workload * RANKS + rank) // GPUS_PER_NODE % NODES
                    labels = f'instance="node{node}:9445",job="goodput-exporter",workload="job{workload}",rank="{rank}"'
                    if family == "goodput_phase_seconds":
                        for phase, share in (("compute", 0.7), ("data_wait", 0.1), ("comm_wait", 0.15),
                                             ("checkpoint", 0.05), ("startup", 0), ("other", 0)):
                            counter(f"{family}_total", f'{labels},phase="{phase}"', share)
                    elif family == "goodput_steps":
                        counter(f"{family}_total", labels, 2)
                    elif family == "goodput_tokens":
                        counter(f"{family}_total", labels, 8192)
                    elif family == "goodput_step_duration_seconds_sum":
                        counter(family, labels, 1)
                    elif family == "goodput_step_duration_seconds_count":
                        counter(family, labels, 2)
                    elif family == "goodput_collective_last_seq":
                        for state in ("enqueued", "completed"):
                            gauge(family, f'{labels},pg="0",state="{state}"', 1000)
                    elif family == "goodput_collective_oldest_inflight_seconds":
                        gauge(family, f'{labels},pg="0"', 0.01)
                    else:
                        gauge(family, labels, now)
        for name in long_inputs:
            out.write(f"# TYPE {name} gauge\n")
            for labels in _recorded_labels(name):
                gauge(name, labels, 0.25, recorded)
        out.write("# EOF\n")
    return series, samples


def _get(port: int, path: str) -> dict:  # type: ignore[type-arg]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    return json.loads(conn.getresponse().read())


def _query(port: int, expr: str) -> list[dict]:  # type: ignore[type-arg]
    return _get(port, "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))["data"]["result"]


def _per_gpu_series() -> tuple[float, float]:
    """Series of one daemon with 8 simulated GPUs at default settings."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--simulate", "8",
                             "--web.listen-address", f"127.0.0.1:{port}", "--ingest.enabled", "false"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, "/readyz")
        time.sleep(2)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/metrics")
        lines = [line for line in conn.getresponse().read().decode().splitlines() if line and line[0] != "#"]
    finally:
        proc.terminate()
        proc.wait(10)
    return sum('gpu="' in line for line in lines) / 8, len(lines) / 8


def run() -> Result:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    files = {path.name: path.read_text() for path in sorted((ROOT / "rules").glob("*.rules.yml"))}
    slow = {group["name"] for text in files.values() for group in yaml.safe_load(text)["groups"] if "interval" in group}
    long_inputs = _long_inputs(files)
    now = int(time.time())
    series, samples = _write_history(WORK / "history.om", now, long_inputs)
    print(f"rules scale: {series:,} series, {samples:,} samples written", flush=True)
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(WORK / "history.om"),
                    str(WORK / "data")], check=True, stdout=subprocess.DEVNULL)
    (WORK / "history.om").unlink()
    end = now + AHEAD
    if time.time() > end + 30:  # a 5m window holds 5 samples: it must not start emptying while measured
        raise RuntimeError(f"writing the history took {time.time() - now:.0f} s, past its end: raise AHEAD")
    if time.time() < end + 2:  # rule results must land after the last block
        time.sleep(end + 2 - time.time())
    port = free_port()
    rules = sorted(str(ROOT / "rules" / name) for name in files)
    (WORK / "prometheus.yml").write_text(
        f"global: {{evaluation_interval: {EVAL_INTERVAL}s}}\nrule_files: {json.dumps(rules)}\n")
    proc = subprocess.Popen(["prometheus", f"--config.file={WORK / 'prometheus.yml'}",
                             f"--storage.tsdb.path={WORK / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--storage.tsdb.retention.time=30d"],
                            stdout=(WORK / "prometheus.log").open("wb"), stderr=subprocess.STDOUT)
    durations: dict[str, list[float]] = {}
    rule_times: dict[str, list[float]] = {}
    members: dict[str, list[str]] = {}
    try:
        deadline = time.monotonic() + 600
        seen: dict[str, str] = {}
        def measured() -> bool:
            return bool(durations) and all(len(v) >= (SLOW_EVALUATIONS if name in slow else EVALUATIONS)
                                           for name, v in durations.items())

        while time.monotonic() < deadline and not measured():
            time.sleep(2)
            try:
                groups = _get(port, "/api/v1/rules")["data"]["groups"]
            except (OSError, KeyError, ValueError):
                continue
            for group in groups:
                name, last = group["name"], group.get("lastEvaluation", "")
                if last and not last.startswith("0001") and seen.get(name) != last:
                    seen[name] = last
                    durations.setdefault(name, []).append(group["evaluationTime"])
                    members[name] = [rule["name"] for rule in group["rules"]]
                    if len(durations[name]) > (1 if name in slow else COLD):
                        for rule in group["rules"]:
                            rule_times.setdefault(rule["name"], []).append(rule["evaluationTime"])
        for rule, expected in (("gpu:goodput_gpu_idle_ratio:rate1h", NODES * GPUS_PER_NODE),
                               ("node:goodput_gpu_idle_ratio:rate5m", NODES),
                               ("workload_rank:goodput_straggler_ratio:rate5m", WORKLOADS * RANKS),
                               ("gpu:goodput_gpu_activity_class:avg5m", NODES * GPUS_PER_NODE),
                               ("workload:goodput_gpu_idle_ratio:rate5m", WORKLOADS),
                               ("namespace:goodput_ratio:rate5m", NAMESPACES)):
            check = _query(port, f"count({rule})")
            assert check and float(check[0]["value"][1]) == expected, (rule, check)
        for name in long_inputs:  # every series a short group records had a full hour behind it
            total = _query(port, f"count({name})")
            full = _query(port, f"count(count_over_time({name}[1h]) >= {3600 // EVAL_INTERVAL - 5})")
            assert total and full and total[0]["value"][1] == full[0]["value"][1], (name, total, full)
        if "out of bounds" in (WORK / "prometheus.log").read_text():
            raise RuntimeError("Prometheus discarded rule results as out of bounds")
    finally:
        proc.terminate()
        proc.wait(30)
    per_gpu, per_gpu_total = _per_gpu_series()
    steady = {name: v[1:] if name in slow else v[COLD:] for name, v in durations.items()}
    return Result(series, samples, {name: (v[0], statistics.median(steady[name]), max(steady[name]), len(members[name]))
                                    for name, v in sorted(durations.items())},
                  {name: statistics.median(v) for name, v in rule_times.items()}, members, slow, per_gpu,
                  per_gpu_total)


if __name__ == "__main__":
    r = run()
    for name, (first, median, worst, count) in r.groups.items():
        print(f"{name}: {count} rules, first {first * 1000:.0f} ms, then median {median * 1000:.0f} ms, "
              f"worst {worst * 1000:.0f} ms")
    for name, median in sorted(r.rules.items(), key=lambda item: -item[1])[:15]:
        print(f"  {median * 1000:7.0f} ms  {name}")
    print(f"series per GPU: {r.per_gpu_series:.1f} with a gpu label, {r.per_gpu_total:.1f} in all")
