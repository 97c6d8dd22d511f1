"""`goodput-exporter health --mode npd`: node-problem-detector's custom plugin protocol (exit status 0 OK, 1 NonOK,
2 Unknown; one line on stdout within max_output_length), and the plugin monitor config shipped in deploy/, checked
against the format node-problem-detector documents for custom plugin monitors (config/custom-plugin-monitor.json
in its repository: plugin "custom", pluginConfig, source, conditions, rules of type temporary or permanent)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import ROOT
from test_health_slurm import _free_port, until

from exporter.assemble import build_daemon
from exporter.config import load
from exporter.core.http import ServerThread, bind, create_app
from exporter.sources.nvml.simulated import SimulatedGpus

DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"}  # Go's time.ParseDuration
NPD_CUSTOM_PLUGIN = {
    "type": "object",
    "required": ["plugin", "pluginConfig", "source", "conditions", "rules"],
    "additionalProperties": False,
    "properties": {
        "plugin": {"const": "custom"},
        "source": {"type": "string", "minLength": 1},
        "metricsReporting": {"type": "boolean"},
        "pluginConfig": {"type": "object", "additionalProperties": False, "properties": {
            "invoke_interval": DURATION, "timeout": DURATION,
            "max_output_length": {"type": "integer", "minimum": 1},
            "concurrency": {"type": "integer", "minimum": 1},
            "enable_message_change_based_condition_update": {"type": "boolean"},
            "skip_initial_status": {"type": "boolean"}}},
        "conditions": {"type": "array", "items": {
            "type": "object", "required": ["type", "reason", "message"], "additionalProperties": False,
            "properties": {"type": {"type": "string"}, "reason": {"type": "string"}, "message": {"type": "string"}}}},
        "rules": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["type", "reason", "path"], "additionalProperties": False,
            "properties": {"type": {"enum": ["temporary", "permanent"]}, "condition": {"type": "string"},
                           "reason": {"type": "string"}, "path": {"type": "string"},
                           "args": {"type": "array", "items": {"type": "string"}}, "timeout": DURATION}}}},
}
CONFIG = ROOT / "deploy" / "node-problem-detector" / "goodput-health-monitor.json"
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _go_seconds(text: str) -> float:
    return sum(float(number) * _GO_UNITS[unit] for number, unit in re.findall(r"([0-9.]+)(ns|us|ms|s|m|h)", text))


def check_plugin_monitor(config: dict[str, Any]) -> None:
    """What node-problem-detector requires of a custom plugin monitor (its format, and its Validate(): a permanent
    rule's condition is declared, no rule's timeout exceeds the global one), and what ours must say: the rules run
    `health --mode npd` and the output fits the 80 characters the command writes at most. Shared with the chart's
    test, which checks the ConfigMap's copy."""
    jsonschema.validate(config, NPD_CUSTOM_PLUGIN)
    conditions = {c["type"] for c in config["conditions"]}
    for rule in config["rules"]:  # a permanent rule sets a condition the monitor declares
        assert rule["type"] != "permanent" or rule.get("condition") in conditions
        assert rule["args"][:3] == ["health", "--mode", "npd"]
        assert rule["path"].startswith("/"), "NPD stats the path before it starts the monitor"
        assert _go_seconds(rule.get("timeout", "0s")) <= _go_seconds(config["pluginConfig"]["timeout"])
    assert config["pluginConfig"]["max_output_length"] == 80


def test_the_plugin_config_follows_node_problem_detectors_format() -> None:
    check_plugin_monitor(json.loads(CONFIG.read_text()))
    with pytest.raises(AssertionError):  # the check can fail: a rule for a condition nobody declared
        bad = json.loads(CONFIG.read_text())
        bad["rules"][0]["condition"] = "Undeclared"
        check_plugin_monitor(bad)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimulatedGpus, str, Path]]:
    work = tmp_path_factory.mktemp("npd")
    gpus = SimulatedGpus(2)
    port = _free_port()
    config = load(None, {
        "web": {"listen_address": f"127.0.0.1:{port}"}, "nvml": {"interval": "0.2s", "slow_interval": "0.2s"},
        "ingest": {"socket_path": str(work / "events.sock")}, "health": {"state_file": str(work / "state.json")},
        "kubelet": {"enabled": False}, "fabric": {"enabled": False}, "dcgm": {"enabled": False},
        "flight": {"enabled": False}, "host": {"enabled": False}, "process": {"enabled": False}}, environ={})
    sock = bind(config.web.listen_address)
    daemon = build_daemon(config, backend=gpus)
    daemon.start()
    server = ServerThread(create_app(daemon), [sock], "npd-test-http")
    server.start()
    try:
        yield gpus, f"http://127.0.0.1:{port}", work
    finally:
        server.stop()
        daemon.stop()


def _check(url: str, work: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "exporter", "health", "--mode", "npd", "--daemon-url", url,
                           "--state-file", str(work / "state.json")], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)


def test_the_command_answers_in_the_custom_plugin_protocol(node: tuple[SimulatedGpus, str, Path]) -> None:
    gpus, url, work = node
    until("the daemon", lambda: "goodput_gpu_row_remap_pending" in __import__("httpx").get(f"{url}/metrics").text)
    ok = _check(url, work)
    assert ok.returncode == 0 and ok.stdout.startswith("goodput: ok"), ok
    gpus.fail_row_remap(1)  # replace: NonOK at once
    until("the remap failure on /metrics", lambda: "goodput_gpu_row_remap_failure{gpu=\"1\"" in "".join(
        line for line in __import__("httpx").get(f"{url}/metrics").text.splitlines() if line.endswith(" 1.0")
        or line.endswith(" 1")))
    bad = _check(url, work)
    assert bad.returncode == 1, bad
    lines = bad.stdout.splitlines()
    assert len(lines) == 1 and len(lines[0]) <= 80 and lines[0].startswith("goodput: GPU 1 row_remap_failure"), lines
    down = subprocess.run([sys.executable, "-m", "exporter", "health", "--mode", "npd", "--daemon-url",
                           f"http://127.0.0.1:{_free_port()}", "--state-file", str(work / "other.json")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert down.returncode == 2 and len(down.stdout.splitlines()) == 1 and len(down.stdout.strip()) <= 80, down
