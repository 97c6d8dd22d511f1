"""No dead panels: every dashboard query, run against a live Prometheus that scraped the demo stack (the daemon
on simulated GPUs with DCGM on, a simulated 4-rank job writing flight-recorder dumps, faults switched on and
off), returns data over the run.

The same run is also scraped the scale-out way (issue 21, docs/scale-out.md): Prometheus in agent mode and vmagent
remote-writing to VictoriaMetrics, vmalert evaluating the same rule files and sending to an Alertmanager of its own.
Every panel query must return data from VictoriaMetrics' Prometheus API too, and the faults must fire the same
alerts through vmalert and its Alertmanager as through Prometheus and its own.

The dashboards run here are rendered by the same generator as dashboards/, with the demo's rules settings
(DEMO_SETTINGS: windows 20s and 2m instead of 5m and 1h, a 20 s hang threshold), so each panel names the rules
the demo's Prometheus records: workload:goodput_ratio:rate5m becomes workload:goodput_ratio:rate20s,
...:rate1h becomes ...:rate2m, and so on; test_demo_render_has_the_same_panels checks nothing else differs.
Grafana's variables are substituted as Grafana would send them: every query variable as All (.*),
$__rate_interval as the short window (20s), $__interval as 5s."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from conftest import check_openmetrics
from goodput_client import Telemetry
from goodput_mixin.dashboards import build
from goodput_mixin.dashboards.kit import LEVELS
from goodput_mixin.dashboards.lint import query_values, substitute, targets, variable_selectors
from goodput_mixin.demo.simserve import MODEL
from goodput_mixin.demo.stack import CLUSTER, DEMO_SETTINGS, WORKLOAD, Ports, Stack

# Panels allowed to stay empty in the demo, each with the reason; the test fails if one of them shows data
# (then it belongs checked like the rest) or if any other panel is empty.
ALLOWED_EMPTY: dict[tuple[str, str], str] = {
    ("goodput-cluster", "Namespaces by idle GPUs"):
        "needs Kubernetes: namespaces come from the kubelet's pod-resources API, and the demo has no kubelet",
    ("goodput-collectives", "NCCL keeps a GPU off its closest NIC"):
        "shows only a job whose NCCL_IB_HCA or NCCL_SOCKET_IFNAME is set: the demo job runs as threads of the "
        "demo's own process, which sets neither (tests/test_fabric_source.py covers the metric with real processes)",
    ("goodput-workload", "Runs"):
        "shows only a job named across its runs (GOODPUT_JOB): the demo job is one run that its own name names "
        "(tests/test_instrument_forecast.py runs the panel's query on a real job resubmitted under GOODPUT_JOB)",
}

SETTLE_SECONDS = 20  # the short window filled, so the 20s rules have values
SKIP_SECONDS = 25  # rank 1 skips a collective this long: past the demo's 20 s hang threshold
SETTLE = 45  # seconds after the run for an alert either side held to reach the other (vmalert evaluates later)
# Seconds after the run within which the panels' series on VictoriaMetrics (vmalert's records) count. Each level
# of a chain of record groups shows a new series there about 10 s after the level below it (measured: own time at
# 30 s after the straggler started, its culprit's lost GPU-seconds, five groups on, at 81 s; Prometheus had both at
# 4 s; VictoriaMetrics 1.79, each group's first value of a series being read by the next some 10 s later).
VM_LAG = 75
# Grafana's built-in variables as it would send them for the demo's windows.
BUILTINS = {"__rate_interval": DEMO_SETTINGS.windows[0], "__interval": "5s"}


def demo_dashboards() -> list[dict[str, Any]]:
    return [build(level, DEMO_SETTINGS) for level in LEVELS]


def test_demo_render_has_the_same_panels() -> None:
    """The demo render differs from the committed dashboards only in window names and thresholds."""
    for level, demo in zip(LEVELS, demo_dashboards(), strict=True):
        shipped = build(level)
        assert [(p["type"], len(p.get("targets", []))) for p in shipped["panels"]] == \
            [(p["type"], len(p.get("targets", []))) for p in demo["panels"]]

        def generic(expr: str) -> str:  # rate5m / rate20s -> rateSHORT, rate1h / rate2m -> rateLONG, ...
            window = {"5m": "SHORT", "20s": "SHORT", "1h": "LONG", "2m": "LONG",
                      "30m": "SLOW_SHORT", "1m": "SLOW_SHORT", "6h": "SLOW_LONG", "6m": "SLOW_LONG"}  # burn windows
            return re.sub(r"(rate|increase|mean|avg|_vs_)(5m|20s|1h|2m|30m|1m|6h|6m)(?![0-9a-z])",
                          lambda m: m.group(1) + window[m.group(2)], expr)

        def thresholds(expr: str) -> str:
            return re.sub(r"> \d+(\.\d+)?\)", "> N)", expr)

        for (_, a), (_, b) in zip(targets(shipped), targets(demo), strict=True):
            assert thresholds(generic(a["expr"])) == thresholds(generic(b["expr"]))


@dataclass
class Run:
    live: Stack
    start: float
    end: float
    # alerts each Alertmanager held during the run and up to SETTLE after it: "alertmanager" (Prometheus's) and
    # "vm_alertmanager" (vmalert's), each alert by its labels but vmalert's own `alertgroup`, with when it was first
    # seen there
    alerts: dict[str, dict[frozenset[tuple[str, str]], float]] = field(default_factory=dict)
    watch_errors: list[str] = field(default_factory=list)  # Alertmanagers that did not answer a read


class AlertWatch:
    """Reads both Alertmanagers' active alerts every second while the run lasts."""

    def __init__(self, live: Stack) -> None:
        self.live = live
        self.seen: dict[str, dict[frozenset[tuple[str, str]], float]] = {"alertmanager": {}, "vm_alertmanager": {}}
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

        self.errors: list[str] = []

    def _watch(self) -> None:
        while not self.done.wait(1.0):
            for name, seen in self.seen.items():
                try:
                    alerts = self.live.alerts(name)
                except httpx.HTTPError as exc:
                    self.errors.append(f"{name}: {exc!r}")
                    continue
                with self.lock:
                    for alert in alerts:
                        labels = alert["labels"]
                        assert isinstance(labels, dict)
                        seen.setdefault(frozenset((k, v) for k, v in labels.items() if k != "alertgroup"), time.time())

    def settle(self, end: float, timeout: float) -> None:
        """Wait (up to `timeout`) until every alert either Alertmanager held by `end` the other has held too: vmalert
        reads what the agents wrote and evaluates on its own clock, so an alert whose `for` ends in the run's last
        seconds reaches one side a few evaluations before the other (GoodputStraggler, GoodputMFUDrop on a loaded CI
        runner). The faults last past `end`, so alerts keep arriving: those first seen after it are not compared."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if not any(unmatched(self.seen, end)):
                    return
            time.sleep(1.0)

    def stop(self) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
        self.done.set()
        self.thread.join(10)
        return self.seen


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The demo stack with 8 GPUs (4 held by the job's ranks, 2 by the vLLM serving engine, 1 by a Triton one beside
    it, 1 free) through a scripted
    run of faults: a straggler, a power-throttled GPU, an XID and an uncorrected ECC error, a row remap waiting for
    a reset, a PCIe link trained below its maximum, NVLink errors, a lost GPU, a restart, and a rank that skips a
    collective long enough to count as a hang. The remote-write side runs beside Prometheus throughout."""
    live = Stack(tmp_path_factory.mktemp("dashboards-live"), Ports.free(), gpus=8, ranks=4, remote_write=True,
                 serving_engines=("vllm", "triton")).start()
    watch = AlertWatch(live)
    try:
        assert live.job is not None
        start = time.time()
        live.job.set_straggler(2)
        live.gpus.throttle(0, "power", 600)
        live.gpus.inject_ecc(1, uncorrected=True)
        live.gpus.inject_xid(1, 79)
        live.gpus.remap_row(3, uncorrected=True)
        live.gpus.degrade_pcie(4)
        live.gpus.nvlink_errors(2, link=0, seconds=600)
        live.gpus.lose(5)
        restarted = Telemetry(WORKLOAD, 0, socket_path=str(live.workdir / "ingest.sock"))
        restarted.lifecycle("restart")
        restarted.close()
        time.sleep(SETTLE_SECONDS)
        live.job.set_skipping(1)
        time.sleep(SKIP_SECONDS)
        live.job.set_skipping(None)
        time.sleep(5)
        end = time.time()
        watch.settle(end, SETTLE)
        # the daemon's body after every fault: it parses as OpenMetrics, no series twice
        check_openmetrics(httpx.get(f"{live.urls['exporter']}/metrics", timeout=10,
                                    headers={"Accept": "application/openmetrics-text"}).text)
        yield Run(live, start, end, watch.stop(), watch.errors)
    finally:
        watch.stop()
        live.stop()


def _has_data(prometheus: str, expr: str, start: float, end: float) -> bool:
    response = httpx.get(f"{prometheus}/api/v1/query_range",
                         params={"query": expr, "start": start, "end": end, "step": 2}, timeout=30)
    body = response.json()
    assert body.get("status") == "success", f"{expr}: {body}"
    return any(series["values"] for series in body["data"]["result"])


@pytest.mark.parametrize("store", ["prometheus", "victoria"])
def test_no_dead_panels(ran: Run, store: str) -> None:
    """On Prometheus, and on VictoriaMetrics fed by the agents, with the series vmalert recorded."""
    url = ran.live.urls[store]
    queries = [(f"{model['uid']} / {panel['title']} [{target['refId']}]",
                substitute(target["expr"], {**query_values(model), **BUILTINS}))
               for model in demo_dashboards() for panel, target in targets(model)]

    def allowed(key: str) -> bool:
        return any(key.startswith(f"{u} / {t} [") for u, t in ALLOWED_EMPTY)

    dead = [key for key, expr in queries if not _has_data(url, expr, ran.start, ran.end)]
    # vmalert evaluates on its own clock from what the agents wrote, and a record at the end of a chain of groups
    # (the forecast's third level, a straggler's cost per culprit) reaches VictoriaMetrics a level at a time: the
    # queries still empty are asked again, over the run and after it, until VM_LAG after the run (the demo and its
    # faults run on)
    deadline = ran.end + (VM_LAG if store == "victoria" else 0.0)
    expressions = dict(queries)
    while any(not allowed(key) for key in dead) and time.time() < deadline:
        time.sleep(5)
        dead = [key for key in dead if not _has_data(url, expressions[key], ran.start, time.time())]
    alive = [key for key, _ in queries if key not in dead]
    unexpected_dead = [key for key in dead if not allowed(key)]
    assert not unexpected_dead, f"dead panels ({len(unexpected_dead)} of {len(queries)} queries):\n" + \
        "\n".join(unexpected_dead)
    alive_allowed = [key for key in alive if allowed(key)]
    assert not alive_allowed, f"allowed to be empty but showed data: {alive_allowed}"
    assert len(alive) > 60


def _names(alerts: dict[frozenset[tuple[str, str]], float]) -> set[str]:
    return {dict(a)["alertname"] for a in alerts}


def unmatched(seen: dict[str, dict[frozenset[tuple[str, str]], float]],
              end: float) -> tuple[list[list[tuple[str, str]]], list[list[tuple[str, str]]]]:
    """The alerts one Alertmanager held by `end` that the other never held: (Prometheus's, vmalert's)."""
    prometheus, victoria = seen["alertmanager"], seen["vm_alertmanager"]
    return (sorted(sorted(a) for a, at in prometheus.items() if at <= end and a not in victoria),
            sorted(sorted(a) for a, at in victoria.items() if at <= end and a not in prometheus))


def test_the_same_alerts_fire_through_vmalert(ran: Run) -> None:
    """The alerts Prometheus's Alertmanager received over the run, vmalert's received too (by SETTLE seconds after
    it), with the same labels."""
    prometheus = ran.alerts["alertmanager"]
    assert not ran.watch_errors, ran.watch_errors
    assert len(_names(prometheus)) >= 8, sorted(_names(prometheus))
    only_prometheus, only_victoria = unmatched(ran.alerts, ran.end)
    assert not only_prometheus and not only_victoria, (
        f"on Prometheus only: {only_prometheus}\non vmalert only: {only_victoria}")


# The buckets of workload:goodput_breakdown_ratio (issue 19): together they are the workload's wall time.
BUCKETS = {"productive", "wasted_progress", "data_wait", "comm_wait", "checkpoint_save", "checkpoint_restore",
           "compile", "startup", "eval", "other", "untracked", "downtime"}


def test_where_the_time_went_adds_to_100_percent(ran: Run) -> None:
    """The workload dashboard's "Where the time went" shows the demo workload's wall time in every bucket, and its
    stacked series add to 100% (± 1 point) at each point of the end of the run."""
    live, end = ran.live, ran.end
    model = next(m for m in demo_dashboards() if m["uid"] == LEVELS[5].uid)
    (_, target), = [(p, t) for p, t in targets(model) if p["title"] == "Where the time went"]
    values = {**query_values(model), **BUILTINS}
    response = httpx.get(f"{live.urls['prometheus']}/api/v1/query_range", timeout=30, params={
        "query": substitute(target["expr"], values), "start": max(ran.start, end - 30), "end": end, "step": 2})
    body = response.json()
    assert body.get("status") == "success", body
    series = [s for s in body["data"]["result"] if s["metric"].get("workload") == WORKLOAD]
    assert {s["metric"].get("bucket") for s in series} == BUCKETS
    totals: dict[float, float] = {}
    for one in series:
        for at, value in one["values"]:
            totals[at] = totals.get(at, 0.0) + float(value)
    assert totals
    off = {at: total for at, total in totals.items() if abs(total - 1) > 0.01}
    assert not off, f"buckets add to {sorted(off.items())} instead of 1 ± 0.01"


def test_variables_offer_the_demo_values(ran: Run) -> None:
    live, start, end = ran.live, ran.start, ran.end
    offered: dict[str, set[str]] = {}
    for model in demo_dashboards():
        values = query_values(model)
        for variable in model["templating"]["list"]:
            if variable["type"] != "query":
                continue
            selector = dict(variable_selectors(model))[variable["name"]]
            label = variable["query"].rsplit(",", 1)[1].strip(" )")
            response = httpx.get(f"{live.urls['prometheus']}/api/v1/label/{label}/values",
                                 params={"match[]": substitute(selector, values), "start": start, "end": end})
            offered.setdefault(variable["name"], set()).update(response.json()["data"])
    # the serving level's: the demo's engines run outside Kubernetes (no namespace)
    assert offered == {"cluster": {CLUSTER}, "node": {f"127.0.0.1:{live.ports.exporter}"}, "workload": {WORKLOAD},
                       "namespace": set(), "model": {MODEL}, "engine": {"vllm", "triton"}}


# The serving dashboard's panels a Triton engine fills (issue 34); the others need what Triton does not export:
# tokens, preemptions, a per-request time per output token (so no joint attainment, SLO goodput nor burn rate),
# inter-token and end-to-end latency histograms; its first-response histogram is in milliseconds, so it is judged but
# not among the seconds-based bucket rates.
TRITON_PANELS = {"Throughput", "SLO attainment per objective", "Requests no histogram judges",
                 "Bucket each objective is judged at", "Requests running and waiting", "KV cache usage",
                 "Queue and compute time per request", "Finished requests by reason", "Serving GPUs",
                 "Power of the serving GPUs", "Idle share of the serving GPUs"}


def test_the_serving_dashboard_has_data_for_triton(ran: Run) -> None:
    """With the engine variable set to triton, every panel Triton can fill shows data for the demo's Triton engine."""
    model = next(m for m in demo_dashboards() if m["uid"] == LEVELS[6].uid)
    values = {**query_values(model), "engine": "triton", **BUILTINS}
    found: dict[str, bool] = {}
    for panel, target in targets(model):
        has = _has_data(ran.live.urls["prometheus"], substitute(target["expr"], values), ran.start, ran.end)
        found[panel["title"]] = found.get(panel["title"], False) or has
    assert set(found) >= TRITON_PANELS, sorted(TRITON_PANELS - set(found))
    empty = sorted(title for title in TRITON_PANELS if not found[title])
    assert not empty, f"serving panels without data for Triton: {empty}"

