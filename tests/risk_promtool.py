"""The shipped GPU risk groups run by promtool over what a node's nvml source rendered, scrape by scrape: shared by the
risk tests that feed it a simulated node (test_risk_healthy_hour, test_risk_real_outputs)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from conftest import ROOT, promtool, samples
from goodput_mixin.rules.risk import risk_groups
from goodput_mixin.rules.settings import RulesSettings

RISK_GROUPS = tuple(str(g["name"]) for g in risk_groups(RulesSettings()))  # the trends', then the level's
TARGET = {"cluster": "c1", "instance": "node0:9445", "job": "goodput-exporter"}  # the scrape's labels
LEVEL = "gpu:goodput_gpu_risk_level:max"

Scraped = dict[tuple[str, frozenset[tuple[str, str]]], list[float | None]]  # each series' value at each scrape


def record(found: Scraped, index: int, count: int, text: str) -> None:
    """The samples of one scrape's exposition text, at its index of `count` scrapes (None where a scrape lacks one)."""
    for key, value in samples(text).items():
        found.setdefault(key, [None] * count)[index] = value


def _selector(name: str, labels: frozenset[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted({**TARGET, **dict(labels)}.items()))
    return f"{name}{{{inner}}}"


def run(tmp_path: Path, scraped: Scraped, scrape: int, evaluation: int, expr_tests: list[dict[str, object]],
        timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """promtool's result for `expr_tests` over the scrapes (every `scrape` s) with the shipped risk groups, in their
    order, evaluated every `evaluation` s."""
    recording = yaml.safe_load((ROOT / "rules" / "goodput-recording.rules.yml").read_text())
    groups = [g for g in recording["groups"] if g["name"] in RISK_GROUPS]
    assert [g["name"] for g in groups] == list(RISK_GROUPS)
    (tmp_path / "risk.rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    test = {
        "rule_files": ["risk.rules.yml"],
        "evaluation_interval": f"{evaluation}s",
        "group_eval_order": list(RISK_GROUPS),
        "tests": [{
            "interval": f"{scrape}s",
            "input_series": [
                {"series": _selector(name, labels), "values": " ".join("_" if v is None else repr(v) for v in values)}
                for (name, labels), values in sorted(scraped.items(), key=lambda kv: (kv[0][0], sorted(kv[0][1])))],
            "promql_expr_test": expr_tests,
        }],
    }
    (tmp_path / "risk.test.yml").write_text(yaml.safe_dump(test, width=1 << 20))
    return subprocess.run([promtool(), "test", "rules", "risk.test.yml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout)
