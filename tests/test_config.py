"""Configuration layers and errors, in-process and through the real CLI."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from conftest import free_port

from exporter.cli import main, parse_serve_args
from exporter.config import ConfigError, load
from exporter.core.settings import parse_duration


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_defaults() -> None:
    config = load(None, None, environ={})
    assert config.web.listen_address == "0.0.0.0:9445"
    assert config.nvml.enabled and config.nvml.interval == 5.0 and config.nvml.timeout == 5.0
    assert config.nvml.slow_interval == 30.0
    assert config.host.interval == 5.0
    assert config.simulate.gpus == 0  # simulation is never on unless asked for


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    path = write(tmp_path, "nvml:\n  interval: 2s\n  timeout: 3s\nhost:\n  interval: 10s\nsimulate: 4\n")
    env = {"GOODPUT_NVML_INTERVAL": "500ms", "GOODPUT_HOST_ENABLED": "false"}
    config = parse_serve_args(["--config", path, "--nvml.interval", "250ms", "--simulate", "8"], env)
    assert config.nvml.interval == 0.25  # flag beats env beats file
    assert config.nvml.timeout == 3.0  # file
    assert config.host.enabled is False  # env
    assert config.host.interval == 10.0
    assert config.simulate.gpus == 8
    config = parse_serve_args(["--web.listen-address", "127.0.0.1:9999", "--simulate.seed", "5"],
                              {"GOODPUT_CONFIG": path})
    assert config.web.listen_address == "127.0.0.1:9999"
    assert config.simulate.gpus == 4 and config.simulate.seed == 5  # shorthand in file, merged with flag


@pytest.mark.parametrize(("text", "flags", "env", "expected"), [
    ("nvml:\n  intervall: 1s\n", [], {}, "nvml.intervall: unknown key"),
    ("nvlm:\n  interval: 1s\n", [], {}, "nvlm: unknown key"),
    ("nvml:\n  interval: soon\n", [], {}, "nvml.interval: invalid duration 'soon'"),
    ("nvml:\n  adaptive: true\n  interval: 10s\n", [], {}, "max_interval 40s is longer than the 20s of utilization"),
    ("nvml:\n  interval: -1s\n", [], {}, "nvml.interval: invalid duration"),
    ("host:\n  interval: 0\n", [], {}, "host.interval: duration must be positive"),
    ("host:\n  interval: inf\n", [], {}, "host.interval: duration 'inf' is longer than the maximum"),
    ("", ["--nvml.timeout", "48h"], {}, "nvml.timeout: duration '48h' is longer than the maximum of 24h"),
    ("nvml:\n  enabled: maybe\n", [], {}, "nvml.enabled"),
    ("simulate:\n  gpus: many\n", [], {}, "simulate.gpus"),
    ("", ["--web.listen-address", "localhost"], {}, "web.listen_address: invalid listen address"),
    ("", ["--web.listen-address", "0.0.0.0:99999"], {}, "web.listen_address: port 99999 out of range"),
    ("", [], {"GOODPUT_NVML_INTERVL": "1s"}, "unknown environment variable GOODPUT_NVML_INTERVL"),
    ("", [], {"GOODPUT_HOST_TIMEOUT": "fast"}, "host.timeout: invalid duration 'fast'"),
    ("- a\n- b\n", [], {}, "top level must be a mapping"),
    ("nvml: [\n", [], {}, "not valid YAML"),
    ("simulate:\n  faults:\n    - {at: 1s, kind: melt}\n", [], {}, "simulate.faults.0.kind"),
    ("simulate:\n  gpus: 2\n  faults:\n    - {at: 1s, gpu: 2, kind: lost}\n", [], {},
     "simulate: faults.0.gpu: GPU 2 is not simulated"),
])
def test_errors_name_the_key(tmp_path: Path, text: str, flags: list[str], env: dict[str, str],
                             expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_serve_args(["--config", write(tmp_path, text), *flags], env)
    assert expected in str(info.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(tmp_path / "nope.yaml", None, environ={})


def test_durations() -> None:
    assert parse_duration("500ms") == 0.5
    assert parse_duration("2m") == 120
    assert parse_duration("1.5s") == 1.5
    assert parse_duration(3) == 3.0
    with pytest.raises(ValueError):
        parse_duration(True)


def test_invalid_config_exits_2_before_binding(tmp_path: Path, spawn_cli) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    path = write(tmp_path, "nvml:\n  interval: soon\n")
    proc = spawn_cli("serve", "--config", path, "--web.listen-address", f"127.0.0.1:{port}")
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "nvml.interval" in output and "soon" in output
    with socket.socket() as sock:  # nothing is listening: the port was never bound
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_unknown_flag_exits_2(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as info:
        main(["--nvml.intervall", "1s"])
    assert info.value.code == 2
    assert "--nvml.intervall" in capsys.readouterr().err


def test_port_in_use_is_a_clear_error(spawn_cli) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = spawn_cli("--web.listen-address", f"127.0.0.1:{port}", "--nvml.enabled", "false",
                         "--ingest.enabled", "false")
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in output


def test_kubernetes_service_links_are_not_mistaken_for_config() -> None:
    env = {
        "GOODPUT_EXPORTER_SERVICE_HOST": "10.0.0.7",
        "GOODPUT_EXPORTER_SERVICE_PORT": "9445",
        "GOODPUT_EXPORTER_SERVICE_PORT_METRICS": "9445",
        "GOODPUT_EXPORTER_PORT": "tcp://10.0.0.7:9445",
        "GOODPUT_EXPORTER_PORT_9445_TCP": "tcp://10.0.0.7:9445",
        "GOODPUT_EXPORTER_PORT_9445_TCP_PROTO": "tcp",
        "GOODPUT_EXPORTER_PORT_9445_TCP_ADDR": "10.0.0.7",
        "GOODPUT_NVML_INTERVAL": "2s",
        # the other tools' variables: the training client's captures switch, diagnose's Prometheus
        "GOODPUT_CAPTURES": "0",
        "GOODPUT_PROMETHEUS_URL": "http://prometheus:9090",
    }
    assert load(None, None, environ=env).nvml.interval == 2.0
