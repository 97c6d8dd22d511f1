"""The real command line, as a child process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
from conftest import ROOT, free_port, promtool, series, socket_path, value, wait_for


def get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=2)
    except httpx.TransportError:
        return None


def test_without_gpu_serves_host_metrics_and_says_nvml_is_absent(spawn_cli) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    proc = spawn_cli("--web.listen-address", f"127.0.0.1:{port}", "--nvml.interval", "200ms",
                     "--host.interval", "200ms", "--ingest.socket-path", socket_path())
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: (r := get(f"{base}/readyz")) is not None and r.status_code == 200, timeout=30)
    wait_for(lambda: value(get(f"{base}/metrics").text, "goodput_exporter_source_collections_total",
                           source="nvml") >= 5)
    text = get(f"{base}/metrics").text
    assert value(text, "goodput_exporter_source_up", source="nvml") == 0
    assert value(text, "goodput_exporter_source_up", source="host") == 1
    assert value(text, "goodput_exporter_source_errors_total", source="nvml", reason="nvml_not_found") >= 5
    assert value(text, "goodput_exporter_build_info", gpu_backend="nvml") == 1
    assert series(text, "goodput_gpu_up") == []
    assert value(text, "goodput_host_unreadable_gpu_processes") == 0
    proc.terminate()
    output, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert output.count("NVML not found") == 1, output  # said once, clearly, not on every poll
    assert "Traceback" not in output


def test_simulate_8_serves_clean_metrics(spawn_cli) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    spawn_cli("--simulate", "8", "--web.listen-address", f"127.0.0.1:{port}", "--ingest.socket-path", socket_path())
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: (r := get(f"{base}/readyz")) is not None and r.status_code == 200, timeout=30)
    text = get(f"{base}/metrics").text
    assert len(series(text, "goodput_gpu_up")) == 8
    result = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_scheduled_faults_from_config(tmp_path: Path, spawn_cli) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "faults.yaml"
    config.write_text(
        "simulate:\n  gpus: 4\n  faults:\n"
        "    - {at: 0.5s, gpu: 1, kind: xid, xid: 48, count: 2}\n"
        "    - {at: 0.5s, gpu: 3, kind: lost}\n"
        "nvml:\n  interval: 200ms\n")
    port = free_port()
    spawn_cli("--config", str(config), "--web.listen-address", f"127.0.0.1:{port}",
              "--ingest.socket-path", socket_path())
    base = f"http://127.0.0.1:{port}"

    def faulted() -> bool:
        response = get(f"{base}/metrics")
        return response is not None and value(response.text, "goodput_gpu_up", gpu="3") == 0 and \
            value(response.text, "goodput_gpu_xid_errors_total", gpu="1", xid="48") == 2

    wait_for(faulted, timeout=30)


def test_version_and_help() -> None:
    out = subprocess.run([sys.executable, "-m", "exporter", "version"], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out.strip() == "0.1.0"
    out = subprocess.run([sys.executable, "-m", "exporter", "serve", "--help"], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout
    for flag in ("--web.listen-address", "--nvml.interval", "--host.enabled", "--simulate", "--config"):
        assert flag in out
    # a help text with a bare % (ingest.shift_min_ratio's "6% slower") is shown as written, not %-formatted
    assert "6% slower" in " ".join(out.split()) and "option_strings" not in out


def test_the_build_tools_commands_come_from_the_mixin_through_entry_points(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "exporter", "--help"], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout
    for command in ("serve", "demo", "rules", "metrics-doc", "config-doc", "diagnose", "captures", "version"):
        assert f"\n  {command} " in out or out.startswith(f"usage: goodput-exporter [{command}"), (command, out)
    # a distribution whose command cannot be imported: named, exit 2, and the other commands still work
    dist = tmp_path / "broken_tools-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-tools\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[goodput_exporter.commands]\nbroken = no_such_module:main\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "exporter", "broken"], capture_output=True, text=True, env=env,
                            cwd=ROOT)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "command 'broken' (no_such_module:main, from broken-tools) cannot be loaded" in result.stderr
    listed = subprocess.run([sys.executable, "-m", "exporter", "--help"], capture_output=True, text=True, env=env,
                            cwd=ROOT, check=True).stdout
    assert "broken" in listed and "cannot be loaded" in listed and "  rules " in listed
    unknown = subprocess.run([sys.executable, "-m", "exporter", "nope"], capture_output=True, text=True, cwd=ROOT)
    assert unknown.returncode == 2 and "unknown command 'nope'" in unknown.stderr
