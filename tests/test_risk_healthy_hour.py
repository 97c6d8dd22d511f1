"""The demo's healthy hour (issue 42, acceptance 2): no GPU at risk level watch or worse.

The demo's GPUs as the demo builds them (SimulatedGpus(8): its training pattern, seed and throttling) read by the real
nvml source every 15 s for 70 minutes on a manual clock, rendered by the real renderer, and given to promtool with the
shipped risk groups (the trends', then the level's), as Prometheus would store a scrape of node0 from the daemon's
start: the hour the trends are judged over, and past it. Every GPU has a level, and none was above ok at any
evaluation. (A burst of 150 PCIe replays on one GPU in that hour makes it fail: checked by hand.) The same rules put
the demo's injected faults at their levels (tests/test_alerts_e2e.py::test_gpu_faults_page_and_resolve) and each
trend past its bound at watch (rules/tests/risk.test.yml)."""

from __future__ import annotations

from pathlib import Path

from conftest import ManualClock
from risk_promtool import LEVEL, Scraped, record, run

from exporter.core.exposition import TEXT, Renderer
from exporter.sources.nvml.simulated import SimulatedGpus
from exporter.sources.nvml.source import NvmlSource

GPUS = 8  # the demo's per node (goodput_mixin.demo.stack.Stack)
SCRAPE = 15  # s
MINUTES = 70
INPUTS = ("goodput_gpu_up", "goodput_gpu_lost_total", "goodput_gpu_sampled_seconds_total",
          "goodput_gpu_row_remap_pending", "goodput_gpu_row_remap_failure", "goodput_gpu_retired_pages_total",
          "goodput_gpu_retired_pages_pending", "goodput_gpu_ecc_errors_total",
          "goodput_gpu_clock_throttle_seconds_total", "goodput_gpu_pcie_replays_total",
          "goodput_gpu_nvlink_errors_total")  # what the risk terms read


def _scrapes() -> Scraped:
    """Every series of the node's nvml source at each scrape, None where a scrape did not have it."""
    clock = ManualClock(0.0)
    source = NvmlSource(SimulatedGpus(GPUS, clock=clock), clock=clock)
    renderer = Renderer()
    count = MINUTES * 60 // SCRAPE + 1
    found: Scraped = {}
    for i in range(count):
        record(found, i, count, renderer.render(source.collect(), TEXT).decode())
        clock.advance(SCRAPE)
    return found


def test_the_demos_gpus_stay_at_ok_through_their_first_hour(tmp_path: Path) -> None:
    scraped = _scrapes()
    # every GPU has every series the risk terms read (not a check of absent inputs), each at every scrape
    for name in INPUTS:
        gpus = {dict(labels)["uuid"] for (n, labels), values in scraped.items() if n == name and None not in values}
        assert len(gpus) == GPUS, (name, gpus)
    result = run(tmp_path, scraped, SCRAPE, 30, [
        # every GPU has a level at the end, and its hour and ten minutes held none above ok
        {"expr": f"count({LEVEL})", "eval_time": f"{MINUTES}m", "exp_samples": [{"labels": "{}", "value": GPUS}]},
        {"expr": f"count(count_over_time({LEVEL}[{MINUTES}m]))", "eval_time": f"{MINUTES}m",
         "exp_samples": [{"labels": "{}", "value": GPUS}]},
        {"expr": f"max_over_time({LEVEL}[{MINUTES}m]) > 0", "eval_time": f"{MINUTES}m", "exp_samples": []},
    ])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
