"""`goodput-exporter diagnose` against the live demo stack (issue 20, acceptance 2): with each fault of `make demo`
active it names the fault's layer, and `healthy` once it clears. One stack for every fault, injected and cleared one
after another as `make demo DEMO_FAULTS=...` does (the console's own inject and clear).

The stack's rules are the demo's, with windows shorter still (10s and 1m, the verdict's groups every 2s, a GPU's
XID counted 10s) so that each fault shows and clears within seconds, and host pressure (PSI), which is this
machine's, shared with whatever else runs, has its thresholds set out of reach.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest
import yaml
from conftest import ROOT
from goodput_mixin.demo.console import FAULT_GPU, _clear, _inject
from goodput_mixin.demo.stack import DEMO_SETTINGS, WORKLOAD, Ports, Stack
from goodput_mixin.rules.settings import RulesSettings

from exporter.cli import main

SCHEMA = json.loads((ROOT / "docs" / "diagnose.schema.json").read_text())
SETTINGS = RulesSettings.model_validate({
    **DEMO_SETTINGS.model_dump(), "windows": ["10s", "1m"], "slow_groups_interval": "2s",
    "bottleneck_gpu_recent_window": "10s", "bottleneck_cpu_pressure_ratio": 1.0, "bottleneck_io_pressure_ratio": 1.0})
# each fault of the demo, and the verdict it should bring: (fault, layer, reason)
FAULTS = [
    ("straggler", "network", "comm_wait"),  # one rank computes 3x slower: the others wait for it in the all-reduce
    ("stall", "host", "data_wait"),  # every rank waits 10x longer for data
    ("skip", "network", "rank_missing"),  # rank 1 does not enqueue the next all-reduce
    ("xid", "cluster", "xid"),  # GPU 0, held by rank 0, falls off the bus: XID 79
    ("congestion", "network", "fabric_congestion"),  # ECN marks on NIC 3 while the collectives slow down
    ("symbol_errors", "network", "fabric_errors"),  # NIC 2 counts symbol errors
]
SHOWS = 45.0  # seconds a fault may take to show; its clearing as long
CLEARS = 45.0


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Path]]:
    """The demo stack (4 GPUs, one per rank) with SETTINGS, and the settings file diagnose reads them from."""
    workdir = tmp_path_factory.mktemp("diagnose-live")
    settings = workdir / "rules-settings.yml"
    settings.write_text(yaml.safe_dump(SETTINGS.model_dump(mode="json")))
    stack = Stack(workdir, Ports.free(), gpus=4, ranks=4, settings=SETTINGS).start()
    try:
        yield stack, settings
    finally:
        stack.stop()


def diagnose(live: tuple[Stack, Path], capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    stack, settings = live
    capsys.readouterr()
    code = main(["diagnose", "--prometheus", stack.urls["prometheus"], "--rules-config", str(settings),
                 "--workload", WORKLOAD, *args])
    out, err = capsys.readouterr()
    assert code in (0, 1) or "nothing to diagnose yet" in err, err  # the job's first phases are on their way
    return code, out


def verdict(live: tuple[Stack, Path], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object] | None]:
    """diagnose --json: its exit code and the job's entry (validated against the schema); None before the first."""
    code, out = diagnose(live, capsys, "--json")
    if code == 2:
        return code, None
    document = json.loads(out)
    jsonschema.validate(document, SCHEMA)
    (workload,) = document["workloads"]
    return code, workload


def wait_for(live: tuple[Stack, Path], capsys: pytest.CaptureFixture[str], layer: str,
             timeout: float, reason: str | None = None) -> tuple[int, dict[str, object], float]:
    """Ask every second until the verdict's layer is `layer` (and its reason `reason`, when given: a fault's
    symptom, comm_wait say, may show a scrape or two before its cause): (exit code, the job's entry, seconds)."""
    started = time.monotonic()
    seen: list[str] = []
    while True:
        code, workload = verdict(live, capsys)
        now = "not yet" if workload is None else f"{workload['layer']}/{workload['reason']}"
        if not seen or seen[-1] != now:
            seen.append(now)
        if workload is not None and workload["layer"] == layer and reason in (None, workload["reason"]):
            return code, workload, time.monotonic() - started
        assert time.monotonic() - started < timeout, f"no {layer}/{reason} verdict within {timeout:g}s; saw {seen}"
        time.sleep(1.0)


def test_the_healthy_job_reads_healthy(live: tuple[Stack, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, workload, _ = wait_for(live, capsys, "healthy", 60.0)
    assert code == 0 and workload["reason"] == "none" and workload["runbook"] is None
    assert not [check["reason"] for check in workload["checks"] if check["status"] == "failed"]
    assert workload["gpu_risk"]["gpus"] == 4 and workload["gpu_risk"]["at_risk"] == []
    code, out = diagnose(live, capsys)
    assert code == 0 and "  verdict: healthy\n" in out
    assert "\n  GPU risk: no GPU of this workload at risk (of 4 GPUs)\n" in out


@pytest.mark.parametrize(("fault", "layer", "reason"), FAULTS, ids=[fault for fault, _, _ in FAULTS])
def test_a_fault_names_its_layer_while_active_and_healthy_after_it_clears(
        live: tuple[Stack, Path], capsys: pytest.CaptureFixture[str], fault: str, layer: str, reason: str) -> None:
    stack, _ = live
    wait_for(live, capsys, "healthy", CLEARS)  # the fault before this one has cleared
    said = _inject(stack, fault)
    try:
        code, workload, shown = wait_for(live, capsys, layer, SHOWS, reason)
        assert code == 1 and workload["reason"] == reason, said
        (deciding,) = [check for check in workload["checks"] if check["verdict"]]
        assert deciding["reason"] == reason and deciding["status"] == "failed"
        assert workload["runbook"] == deciding["runbook"]
        if fault == "straggler":
            # the figure is above its threshold, and the evidence says which rank the others wait for
            (term,) = deciding["terms"]
            assert term["holds"] and term["value"] > SETTINGS.bottleneck_comm_wait_ratio
            ratios = next(q for q in deciding["evidence"] if q.startswith("workload_rank:goodput_straggler_ratio"))
            result = httpx.get(f"{stack.urls['prometheus']}/api/v1/query", params={"query": ratios},
                               timeout=5).json()["data"]["result"]
            slowest = max(result, key=lambda s: float(s["value"][1]))
            assert slowest["metric"]["rank"] == str(stack.ranks - 1)
    finally:
        _clear(stack, fault)
    code, _, cleared = wait_for(live, capsys, "healthy", CLEARS)
    assert code == 0
    print(f"{fault}: {layer}/{reason} after {shown:.1f}s, healthy {cleared:.1f}s after it cleared")


def test_a_gpu_whose_row_remap_waits_for_a_reset_is_at_risk_while_the_verdict_stays_healthy(
        live: tuple[Stack, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """No check of the walk judges a pending row remap; the GPU's risk level does: drain, with its runbook. (GPU 1:
    the xid fault above holds GPU 0 at drain for the risk rules' hour.)"""
    stack, _ = live
    wait_for(live, capsys, "healthy", CLEARS)
    gpu = str(FAULT_GPU["row_remap_pending"])
    said = _inject(stack, "row_remap_pending")
    try:
        started, seen = time.monotonic(), None
        while True:
            _, workload = verdict(live, capsys)
            if workload is not None:
                seen = next((r for r in workload["gpu_risk"]["at_risk"] if r["gpu"] == gpu), None)
                if seen is not None and "row_remap_pending" in seen["reasons"]:
                    break
            assert time.monotonic() - started < SHOWS, f"GPU {gpu} not at drain (row_remap_pending): {seen}; {said}"
            time.sleep(1.0)
        assert seen["level"] == "drain" and seen["value"] == 2
        assert seen["runbook"]["file"] == "gpu-risk-drain.md"
        code, out = diagnose(live, capsys)
        assert code == 0 and "  verdict: healthy\n" in out, out
        line = next(line for line in out.splitlines() if line.startswith(f"  GPU risk: GPU {gpu} ("))
        assert ": drain (" in line and "row_remap_pending" in line and line.endswith("/gpu-risk-drain.md"), line
    finally:
        _clear(stack, "row_remap_pending")
