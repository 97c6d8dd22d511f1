"""The public /metrics surface does not drift: for one simulated seed, the series names and their label names
that the real command line serves are the committed golden list (tests/golden/metrics_surface.txt).

The golden list was written by the daemon before the runtime was reorganised into core/ and sources/<name>/
(issue 15), so a layout change that renames, drops or relabels a series fails here. A deliberate change to the
surface regenerates it: `GOODPUT_UPDATE_GOLDEN=1 pytest tests/test_surface.py`, and the diff goes in the commit.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
from conftest import ROOT, free_port, samples, socket_path, wait_for
from flight_helpers import copy_scenario

GOLDEN = ROOT / "tests" / "golden" / "metrics_surface.txt"
# Series that must be on /metrics before the surface is read: one of each source's kinds.
AWAITED = ("goodput_gpu_up", "goodput_gpu_sm_active_ratio", "goodput_steps_total", "goodput_collective_last_seq",
           "goodput_host_unreadable_gpu_processes", "goodput_attribution_processes",
           "goodput_exporter_source_last_success_timestamp_seconds")
# prometheus-client's process collector: platform-dependent, and not ours
NOT_OURS = re.compile(r"^(process|python)_")


def surface(text: str) -> set[str]:
    """`name{label,label}` for every sample of the exposition, label names sorted."""
    out = set()
    for name, labels in samples(text):
        if not NOT_OURS.match(name):
            out.add(f"{name}{{{','.join(sorted(k for k, _ in labels))}}}")
    return out


def read_surface(tmp_path: Path, spawn) -> set[str]:  # type: ignore[no-untyped-def]
    flight = tmp_path / "flight"
    copy_scenario("healthy2", flight, workload="golden")
    events = socket_path()
    config = tmp_path / "golden.yaml"
    config.write_text(
        "simulate: {gpus: 2, seed: 1}\n"
        "nvml: {interval: 200ms}\n"
        "dcgm: {enabled: true, interval: 200ms}\n"
        "host: {interval: 200ms}\n"
        "process: {interval: 200ms}\n"
        f"ingest: {{interval: 200ms, socket_path: {events}}}\n"
        f"flight: {{interval: 200ms, dir: {flight}, stale_after: 0}}\n")  # the stored dumps are long past
    port = free_port()
    spawn("serve", "--config", str(config), "--web.listen-address", f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"

    def posted() -> bool:
        batch = {"events": [
            {"type": "step", "workload": "golden", "rank": 0, "duration_seconds": 0.5, "tokens": 8, "samples": 2},
            {"type": "phase", "workload": "golden", "rank": 0, "phase": "compute", "seconds": 0.4},
            {"type": "lifecycle", "workload": "golden", "rank": 0, "event": "start"}]}
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=events), base_url="http://goodput") as client:
                return client.post("/v1/events", json=batch).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(posted, timeout=30)
    previous: set[str] = set()

    def settled() -> bool:
        nonlocal previous
        try:
            text = httpx.get(f"{base}/metrics", timeout=2).text
        except httpx.TransportError:
            return False
        names = {name for name, _ in samples(text)}
        current = surface(text)
        done = all(n in names for n in AWAITED) and current == previous
        previous = current
        return done

    wait_for(settled, timeout=30, interval=0.5)
    return previous


def test_metrics_surface_matches_the_golden_list(tmp_path: Path, spawn_cli) -> None:  # type: ignore[no-untyped-def]
    observed = read_surface(tmp_path, spawn_cli)
    if os.environ.get("GOODPUT_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text("".join(f"{line}\n" for line in sorted(observed)))
    golden = set(GOLDEN.read_text().split())
    assert observed - golden == set(), "new series or labels on /metrics"
    assert golden - observed == set(), "series or labels gone from /metrics"


def test_the_surface_check_sees_a_renamed_label() -> None:
    text = '# TYPE goodput_gpu_up gauge\ngoodput_gpu_up{gpu="0",uuid="GPU-1"} 1\n'
    assert surface(text) == {"goodput_gpu_up{gpu,uuid}"}
    assert surface(text.replace("uuid=", "gpu_uuid=")) != surface(text)

