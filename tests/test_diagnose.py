"""`goodput-exporter diagnose` against real Prometheus servers (Debian's prometheus, on 127.0.0.1).

One runs the generated rules over a fixed picture of four workloads, its inputs recorded by a rule group of the test
(the per-workload phase rates and GPU series the verdict's and the risk's rules read): a healthy one, a comm-bound one
on a GPU whose row remap waits for a reset (risk level drain, which no check of the walk judges), a comm-bound one on
a lost GPU (the walk's order: cluster before network) and a data-starved one. Another has no rules, and serves
its API over TLS with basic auth. The demo stack's faults are in test_diagnose_live.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml
from conftest import ROOT, free_port
from goodput_mixin.diagnose.walk import paren, risk_reasons, with_matchers
from goodput_mixin.rules import risk
from goodput_mixin.rules.alerts import alerts
from goodput_mixin.rules.render import rule_files
from goodput_mixin.rules.settings import RulesSettings
from goodput_mixin.rules.verdict import WALK, checks

from exporter.cli import main
from exporter.health.risk import LEVELS, WATCH

SCHEMA = json.loads((ROOT / "docs" / "diagnose.schema.json").read_text())
CLUSTER = "test"
# not the defaults, so that the figures prove they were read with these: a 1m short window, comm_wait from 40%
SETTINGS = RulesSettings(windows=["1m", "1h"], slow_groups_interval="1s", bottleneck_comm_wait_ratio=0.4)
# workload -> (share of its time per phase, its GPU, that GPU up)
PICTURE = {
    "fed": ({"compute": 0.9, "data_wait": 0.05, "comm_wait": 0.05}, "GPU-a", 1),
    "chatty": ({"compute": 0.5, "data_wait": 0.05, "comm_wait": 0.45}, "GPU-b", 1),
    "broken": ({"compute": 0.3, "data_wait": 0.05, "comm_wait": 0.65}, "GPU-c", 0),
    "starved": ({"compute": 0.4, "data_wait": 0.55, "comm_wait": 0.05}, "GPU-d", 1),
}
EXPECTED = {"fed": ("healthy", "none"), "chatty": ("network", "comm_wait"), "broken": ("cluster", "gpu_lost"),
            "starved": ("host", "data_wait")}
REMAP_PENDING = {"chatty"}  # its GPU's row remap waits for a reset
# each GPU's risk level (gpu:goodput_gpu_risk_level:max): chatty's row remap pending and broken's lost GPU, drain
RISK = {"GPU-a": 0, "GPU-b": 2, "GPU-c": 2, "GPU-d": 0}
USER, PASSWORD = "diagnose", "diagnose-secret"
# bcrypt of PASSWORD at cost 4 (Prometheus' web config takes bcrypt hashes only; cost 4 keeps each request quick)
PASSWORD_HASH = "$2b$04$sgMNPNDf/n/2cPVuiyUeQemeHuoCyo1SIfw1RHZ4JPVmxv4a5CMfW"


def _picture_rules() -> dict[str, object]:
    """The inputs of the picture, recorded every second: each workload's phase rates, the GPU its process holds, and
    that GPU's up state and pending row remap, with the labels the exporter's series carry."""
    rules: list[dict[str, object]] = []
    w = SETTINGS.windows[0]
    for workload, (phases, uuid, up) in PICTURE.items():
        where = {"cluster": CLUSTER, "instance": "node-1:9445"}
        rules += [{"record": f"workload:goodput_phase_seconds:rate{w}", "expr": f"vector({share})",
                   "labels": {"cluster": CLUSTER, "workload": workload, "phase": phase}}
                  for phase, share in phases.items()]
        rules.append({"record": "goodput_gpu_workload_info", "expr": "vector(1)",
                      "labels": {**where, "uuid": uuid, "gpu": uuid[-1], "workload": workload, "rank": "0"}})
        gpu = {**where, "uuid": uuid, "gpu": uuid[-1]}
        rules.append({"record": "goodput_gpu_up", "expr": f"vector({up})", "labels": gpu})
        rules.append({"record": "goodput_gpu_row_remap_pending", "expr": f"vector({int(workload in REMAP_PENDING)})",
                      "labels": gpu})
    return {"groups": [{"name": "picture", "rules": rules}]}


@dataclass
class Server:
    url: str
    workdir: Path


Started = tuple[subprocess.Popen[bytes], str]


def _start(workdir: Path, config: dict[str, object], *flags: str, scheme: str = "http") -> Started:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("prometheus not found: `make test` installs Debian's prometheus package")
    port = free_port()
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (workdir / "prometheus.log").open("wb")
    proc = subprocess.Popen([prometheus, f"--config.file={workdir / 'prometheus.yml'}",
                             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             *flags], stdout=log, stderr=subprocess.STDOUT)
    return proc, f"{scheme}://127.0.0.1:{port}"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    try:
        response = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5)
    except httpx.HTTPError:
        return []
    if response.status_code != 200:
        return []
    return response.json()["data"]["result"]


def _settled(url: str) -> tuple[dict[str, tuple[str, str]], dict[str, int]]:
    """The verdicts, and each GPU's risk level."""
    verdicts = {s["metric"]["workload"]: (s["metric"]["layer"], s["metric"]["reason"])
                for s in _query(url, "workload:goodput_bottleneck:info")}
    return verdicts, {s["metric"]["uuid"]: int(float(s["value"][1]))
                      for s in _query(url, "gpu:goodput_gpu_risk_level:max")}


@pytest.fixture(scope="module")
def pictured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Prometheus with the rules generated from SETTINGS and the picture; yielded once every verdict and risk level is
    the expected one (the rule groups run concurrently: a verdict settles a few evaluations after the inputs)."""
    workdir = tmp_path_factory.mktemp("diagnose-prometheus")
    (workdir / "rules").mkdir()
    recording = rule_files(SETTINGS, source="test_diagnose")["goodput-recording.rules.yml"]
    (workdir / "rules" / "goodput-recording.rules.yml").write_text(recording)
    (workdir / "rules" / "picture.rules.yml").write_text(yaml.safe_dump(_picture_rules()))
    (workdir / "settings.yml").write_text(yaml.safe_dump(SETTINGS.model_dump(mode="json")))
    proc, url = _start(workdir, {"global": {"evaluation_interval": "1s"},
                                 "rule_files": [str(workdir / "rules" / "*.rules.yml")]})
    try:
        deadline = time.monotonic() + 60
        while _settled(url) != (EXPECTED, RISK):
            assert proc.poll() is None, (workdir / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, f"verdicts and risk levels {_settled(url)}, not {(EXPECTED, RISK)}"
            time.sleep(0.5)
        yield Server(url, workdir)
    finally:
        _stop(proc)


def diagnose(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`goodput-exporter diagnose ARGS` through the command line's dispatch: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(["diagnose", *args])
    out, err = capsys.readouterr()
    return code, out, err


def ask(server: Server, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    return diagnose(capsys, "--prometheus", server.url, "--rules-config", str(server.workdir / "settings.yml"), *args)


# --- the checks' declarations ---------------------------------------------------------------------------------


def test_every_check_is_declared_in_the_walk_order_with_a_runbook_that_exists() -> None:
    declared = checks(RulesSettings())
    assert [(c.layer, c.reason) for c in declared] == list(WALK)
    runbooks = {alert.name: alert.runbook for alert in alerts(RulesSettings())}
    for check in declared:
        assert (ROOT / "docs" / "runbooks" / runbooks[check.alert]).is_file(), check.reason
        assert check.terms and all(term.op in (">", ">=", "<", "==") for term in check.terms)
        # each term is in the rule's condition, as the rule compares it (xid's figure is its condition: any is one)
        assert all(term.condition in check.expr or term.figure == check.expr for term in check.terms), check.reason


def test_the_schema_names_every_check_and_the_docs_carry_it() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$defs"]["reason"]["enum"] == [reason for _, reason in WALK]
    assert SCHEMA["$defs"]["layer"]["enum"] == list(dict.fromkeys(layer for layer, _ in WALK))
    assert SCHEMA["$defs"]["workload"]["properties"]["checks"]["minItems"] == len(WALK)
    # every reason the risk rules record a level for, in their order (none: level ok)
    expr = risk_reasons(RulesSettings())
    assert expr.startswith("max by (cluster, instance, gpu, uuid, reason) (\n")  # the record's, the reason kept
    # the terms read now tagged in the query, the trends through their record (its reason label)
    tagged = re.findall(r'"reason", "(\w+)"', expr)
    assert "gpu:goodput_gpu_risk_trend_level:max" in expr
    assert tagged == [*risk.reasons(RulesSettings())[:len(tagged) - 1], "none"]
    assert SCHEMA["$defs"]["risk_reason"]["enum"] == risk.reasons(RulesSettings())
    assert SCHEMA["$defs"]["risk"]["properties"]["level"]["enum"] == list(LEVELS[WATCH:])
    docs = (ROOT / "docs" / "diagnose.md").read_text()
    assert (ROOT / "docs" / "diagnose.schema.json").read_text().strip() in docs


def test_matchers_go_into_a_selector_and_nowhere_else() -> None:
    assert with_matchers('m:x:rate5m{phase="a"}', 'workload="w"') == 'm:x:rate5m{phase="a", workload="w"}'
    assert with_matchers("goodput_gpu_up", 'workload="w"') == 'goodput_gpu_up{workload="w"}'
    assert with_matchers("time() - x", 'workload="w"') is None
    assert paren("sum without (x) (rate(y[5m]))") == "sum without (x) (rate(y[5m]))"
    assert paren("a / (b > 0)") == "(a / (b > 0))"
    assert paren("max without (pid) (a) + max without (pid) (b)") == "(max without (pid) (a) + max without (pid) (b))"


# --- a Prometheus with the rules --------------------------------------------------------------------------------


def test_a_healthy_workload_exits_0_and_shows_every_check_passed(pictured: Server,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = ask(pictured, capsys, "--workload", "fed")
    assert code == 0, err
    assert err == ""
    assert "fed  cluster=test  goodput 90%" in out
    assert "verdict: healthy" in out and "FAILED" not in out and "runbook" not in out
    assert "    passed   comm_wait                    comm_wait share 0.05 <= 0.4" in out
    assert "    passed   gpu_lost                     GPU up 1 != 0" in out
    assert "\n  GPU risk: no GPU of this workload at risk (of 1 GPU)\n" in out
    # the layers in the walk's order, each check under its layer (after the lines that say something: GPU risk)
    layers = [line.strip() for line in out.splitlines()
              if line.startswith("  ") and not line.startswith("    ") and ":" not in line]
    assert layers[:5] == ["cluster", "network", "host", "memory", "kernel"]


def test_a_comm_bound_workload_exits_1_with_the_figure_the_evidence_and_the_runbook(
        pictured: Server, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = ask(pictured, capsys, "--workload", "chatty")
    assert code == 1
    assert "    FAILED   comm_wait                    comm_wait share 0.45 > 0.4   <- the verdict" in out
    assert "  verdict: network (comm_wait)" in out
    assert f"  runbook: {SETTINGS.runbook_base_url}/goodput-drop.md" in out
    evidence = out.split("evidence (paste into Prometheus):\n", 1)[1].split("  runbook:", 1)[0].split()
    assert 'workload:goodput_badput_ratio:rate1m{phase="comm_wait",' in evidence
    # the evidence is PromQL that Prometheus runs: the figure, for this workload alone
    query = f'workload:goodput_badput_ratio:rate1m{{phase="comm_wait", cluster="{CLUSTER}", workload="chatty"}}'
    assert f"    {query}\n" in out
    response = httpx.get(f"{pictured.url}/api/v1/query", params={"query": query}, timeout=5).json()
    assert [float(s["value"][1]) for s in response["data"]["result"]] == [pytest.approx(0.45)]


def test_the_walk_stops_at_the_first_layer_and_lists_what_fails_below(pictured: Server,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """broken is comm-bound too, but its GPU is lost: cluster comes first; its comm_wait is failed, not the verdict."""
    code, out, _ = ask(pictured, capsys, "--workload", "broken")
    assert code == 1
    assert "    FAILED   gpu_lost                     GPU up 0 == 0   <- the verdict" in out
    assert "    FAILED   comm_wait                    comm_wait share 0.65 > 0.4\n" in out
    assert "  verdict: cluster (gpu_lost)" in out
    assert "gpu-xid-critical.md" in out


def test_a_gpu_at_risk_is_named_with_its_level_reasons_node_and_runbook(pictured: Server,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """chatty's GPU waits for a reset: drain, which no check of the walk judges (its verdict stays comm_wait); broken's
    GPU is lost: drain too, beside its gpu_lost verdict."""
    code, out, _ = ask(pictured, capsys, "--workload", "chatty", "broken")
    assert code == 1
    drain = f"{SETTINGS.runbook_base_url}/gpu-risk-drain.md"
    chatty, broken = out.split("\n\n")[1], out.split("\n\n")[0]
    assert f"\n  GPU risk: GPU b (GPU-b) on node node-1:9445: drain (row_remap_pending); runbook: {drain}\n" in chatty
    assert "  verdict: network (comm_wait)" in chatty
    assert f"\n  GPU risk: GPU c (GPU-c) on node node-1:9445: drain (gpu_lost); runbook: {drain}\n" in broken
    # the line comes before the walk's levels
    assert chatty.index("GPU risk:") < chatty.index("\n  cluster\n")


def test_json_follows_the_schema_and_says_what_the_text_says(pictured: Server,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = ask(pictured, capsys, "--json")
    assert code == 1
    document = json.loads(out)
    jsonschema.validate(document, SCHEMA)
    assert document["settings"].endswith("settings.yml") and document["warnings"] == []
    assert {w["workload"]: (w["layer"], w["reason"]) for w in document["workloads"]} == EXPECTED
    for workload in document["workloads"]:
        deciding = [c for c in workload["checks"] if c["verdict"]]
        if workload["layer"] == "healthy":
            assert deciding == [] and workload["runbook"] is None
            assert not [c for c in workload["checks"] if c["status"] == "failed"]
            continue
        (check,) = deciding
        assert (check["layer"], check["reason"], check["status"]) == (workload["layer"], workload["reason"], "failed")
        assert all(c["status"] != "failed" for c in workload["checks"] if c["order"] < check["order"])
        assert workload["runbook"] == check["runbook"]
    starved = next(w for w in document["workloads"] if w["workload"] == "starved")
    data_wait = next(c for c in starved["checks"] if c["reason"] == "data_wait")
    assert data_wait["terms"] == [{
        "name": "data_wait share",
        "query": f'workload:goodput_badput_ratio:rate1m{{phase="data_wait", cluster="{CLUSTER}", workload="starved"}}',
        "value": pytest.approx(0.55), "op": ">", "threshold": 0.15, "holds": True}]
    # a source the picture has no series of: its checks could not be judged, and say so
    fabric = next(c for c in starved["checks"] if c["reason"] == "fabric_errors")
    assert fabric["status"] == "no_data" and fabric["terms"][0]["value"] is None
    # the GPUs at risk: chatty's waits for a reset; fed's and starved's are fine
    risk = {w["workload"]: w["gpu_risk"] for w in document["workloads"]}
    assert risk["chatty"]["gpus"] == 1 and risk["chatty"]["at_risk"] == [{
        "node": "node-1:9445", "gpu": "b", "uuid": "GPU-b", "level": "drain", "value": 2,
        "reasons": ["row_remap_pending"],
        "runbook": {"file": "gpu-risk-drain.md", "url": f"{SETTINGS.runbook_base_url}/gpu-risk-drain.md"}}]
    assert [(r["uuid"], r["reasons"]) for r in risk["broken"]["at_risk"]] == [("GPU-c", ["gpu_lost"])]
    assert risk["fed"]["at_risk"] == risk["starved"]["at_risk"] == [] and risk["fed"]["gpus"] == 1
    # its query is PromQL that Prometheus runs: the level of each of the workload's GPUs
    levels = _query(pictured.url, risk["chatty"]["query"])
    assert [(s["metric"]["uuid"], s["metric"]["workload"], s["value"][1]) for s in levels] == [("GPU-b", "chatty", "2")]


def test_worst_picks_the_lowest_goodput(pictured: Server, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = ask(pictured, capsys, "--worst", "2", "--json")
    assert code == 1
    assert [w["workload"] for w in json.loads(out)["workloads"]] == ["broken", "starved"]  # 30%, then 40%


def test_many_workloads_end_with_a_summary(pictured: Server, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = ask(pictured, capsys, "--workload", "fed", "chatty")
    assert code == 1
    assert out.rstrip().endswith("2 workloads: 1 healthy, 1 network")


def test_the_url_comes_from_the_environment(pictured: Server, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOODPUT_PROMETHEUS_URL", pictured.url)
    code, out, _ = diagnose(capsys, "--rules-config", str(pictured.workdir / "settings.yml"), "--workload", "fed")
    assert code == 0 and "verdict: healthy" in out


def test_settings_other_than_the_rules_are_named_in_a_warning(pictured: Server,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Without --rules-config the figures are read with the defaults' 5m window, which these rules do not record."""
    code, out, err = diagnose(capsys, "--prometheus", pictured.url, "--workload", "chatty")
    assert code == 1 and "verdict: network (comm_wait)" in out  # the verdict is the rules', whatever the settings
    assert "warning: the goodput rules in this Prometheus were generated with other windows " \
           "(workload:goodput_ratio:rate1h, workload:goodput_ratio:rate1m recorded, not " \
           "workload:goodput_ratio:rate5m): figures will read no data; pass --rules-config" in err
    assert "comm_wait share: no data" in out


def test_an_unknown_workload_exits_2_naming_those_there_are(pictured: Server,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = ask(pictured, capsys, "--workload", "nope")
    assert (code, out) == (2, "")
    assert err == ("goodput-exporter diagnose: no verdict for workload 'nope' in this Prometheus: it reports no "
                   "phases, or no workload has that name (workloads with a verdict: broken, chatty, fed, starved)\n")


# --- could not ask ---------------------------------------------------------------------------------------------


def test_a_dead_port_exits_2_in_one_line_without_a_traceback() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_")}
    result = subprocess.run([sys.executable, "-m", "exporter", "diagnose", "--prometheus",
                             f"http://127.0.0.1:{free_port()}"], capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.endswith(": connection refused\n") and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("goodput-exporter diagnose: cannot reach Prometheus at http://127.0.0.1:")


def test_a_silent_server_and_a_wrong_path_exit_2(pictured: Server, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as silent:  # listens, never answers: the kernel accepts the connection, nobody reads
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        code, _, err = diagnose(capsys, "--prometheus", url, "--timeout", "0.5")
        assert time.monotonic() - started < 5
    assert (code, err) == (2, f"goodput-exporter diagnose: Prometheus at {url} did not answer within 0.5s "
                              "(--timeout)\n")
    code, _, err = diagnose(capsys, "--prometheus", f"{pictured.url}/api/v1")  # the API's path, not the root
    assert (code, err) == (2, f"goodput-exporter diagnose: {pictured.url}/api/v1 answered HTTP 404 with something "
                              "other than Prometheus' API (is it a Prometheus? the URL is its root, without /api/v1)\n")


def test_bad_settings_and_credential_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.yml").write_text("bottleneck_comm_wait_ratio: 2\n")
    code, _, err = diagnose(capsys, "--rules-config", str(tmp_path / "bad.yml"))
    assert code == 2 and "bottleneck_comm_wait_ratio" in err
    code, _, err = diagnose(capsys, "--token-file", str(tmp_path / "missing"))
    assert code == 2 and err == f"goodput-exporter diagnose: cannot read the token file {tmp_path / 'missing'}: " \
                                "No such file or directory\n"
    (tmp_path / "basic").write_text("no colon here\n")
    code, _, err = diagnose(capsys, "--basic-auth-file", str(tmp_path / "basic"))
    assert code == 2 and "must hold one line user:password" in err


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """Prometheus without the rules, its API behind TLS (a certificate for 127.0.0.1) and basic auth. Yields its URL
    and the directory of its certificate."""
    workdir = tmp_path_factory.mktemp("diagnose-guarded")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(workdir / "key.pem"),
                    "-out", str(workdir / "cert.pem")], check=True, capture_output=True)
    (workdir / "web.yml").write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": str(workdir / "cert.pem"), "key_file": str(workdir / "key.pem")},
        "basic_auth_users": {USER: PASSWORD_HASH}}))
    proc, url = _start(workdir, {"global": {"evaluation_interval": "1s"}}, f"--web.config.file={workdir / 'web.yml'}",
                       scheme="https")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                trust = ssl.create_default_context(cafile=workdir / "cert.pem")
                if httpx.get(f"{url}/-/ready", verify=trust, auth=(USER, PASSWORD)).is_success:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (workdir / "prometheus.log").read_text()
            time.sleep(0.2)
        yield url, workdir
    finally:
        _stop(proc)


def test_tls_and_auth_failures_exit_2_and_the_right_credentials_get_an_answer(
        guarded: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, certs = guarded
    (tmp_path / "right").write_text(f"{USER}:{PASSWORD}\n")
    (tmp_path / "wrong").write_text(f"{USER}:not-it\n")
    (tmp_path / "token").write_text("some-token\n")
    code, _, err = diagnose(capsys, "--prometheus", url, "--basic-auth-file", str(tmp_path / "right"))
    assert code == 2 and err.startswith(f"goodput-exporter diagnose: cannot reach Prometheus at {url}: its TLS "
                                        "certificate cannot be verified (") and err.endswith(
        "): pass --ca-file, or --insecure\n"), err
    ca = ("--ca-file", str(certs / "cert.pem"))
    for credentials in (("--basic-auth-file", str(tmp_path / "wrong")), ("--token-file", str(tmp_path / "token")), ()):
        code, _, err = diagnose(capsys, "--prometheus", url, *ca, *credentials)
        assert code == 2
        assert err == (f"goodput-exporter diagnose: Prometheus at {url} refused the request: HTTP 401 Unauthorized "
                       "(credentials: --token-file or --basic-auth-file)\n"), credentials
    for trust in (ca, ("--insecure",)):
        code, _, err = diagnose(capsys, "--prometheus", url, *trust, "--basic-auth-file", str(tmp_path / "right"))
        assert code == 2
        assert err == ("goodput-exporter diagnose: the goodput rules are not loaded in this Prometheus (no "
                       "workload:goodput_bottleneck:info series): load rules/goodput-recording.rules.yml "
                       "(docs/diagnose.md)\n"), trust


def test_the_forecast_line_says_when_the_workload_finishes_and_nothing_without_a_target() -> None:
    from goodput_mixin.diagnose.report import forecast_line

    assert forecast_line({}) is None  # no target: no forecast, not a zero one
    assert forecast_line({"step": 900, "target_step": 3600, "progress_ratio": 0.25}) == (
        "  forecast: step 900 of 3600 (25%); no finish forecast (no step within the stale window, or no step time yet)")
    line = forecast_line({"step": 900, "target_step": 3600, "progress_ratio": 0.25, "seconds_p50": 5400.2,
                          "seconds_p90": 6300, "gpu_hours_p50": 3.0, "gpu_hours_p90": 3.5, "interruptions": 0.4,
                          "badput_gpu_hours": 1.0, "finish_p50": 7200.2, "deadline": 3600})
    assert line == ("  forecast: step 900 of 3600 (25%); finishes in 1h 30m (P50), 1h 45m (P90), 3 GPU-hours to go "
                    "(P90 3.5), 0.4 interruptions expected; badput costs 1 GPU-hours more than its best goodput would; "
                    "late by 1h 0m (P50)")


def test_the_risk_lines_say_when_no_gpu_is_known_and_when_a_level_outlived_its_reason() -> None:
    from goodput_mixin.diagnose.report import risk_lines
    from goodput_mixin.diagnose.walk import Diagnosis, GpuRisk, Runbook, Target

    diagnosis = Diagnosis(Target(None, "w", "healthy", "none", 1.0), "q", "cluster")
    assert risk_lines(diagnosis) == [
        "  GPU risk: no GPU of this workload known (no goodput_gpu_workload_info series of it)"]
    diagnosis.gpus = 8
    assert risk_lines(diagnosis) == ["  GPU risk: no GPU of this workload at risk (of 8 GPUs)"]
    runbook = Runbook("gpu-risk-replace.md", "https://runbooks/gpu-risk-replace.md")
    diagnosis.risks = [GpuRisk("n1", "3", "GPU-x", 3, ("row_remap_failure", "xid_repeated"), runbook),
                       GpuRisk("n2", "0", "GPU-y", 1, (), runbook)]
    assert risk_lines(diagnosis) == [
        "  GPU risk: GPU 3 (GPU-x) on node n1: replace (row_remap_failure, xid_repeated); runbook: "
        "https://runbooks/gpu-risk-replace.md",
        "  GPU risk: GPU 0 (GPU-y) on node n2: watch (no reason holds now: the rules recorded it an evaluation ago); "
        "runbook: https://runbooks/gpu-risk-replace.md"]
