"""`goodput-exporter health`: the node's GPU failure risk, as a health check the schedulers already run.

Modes (--mode):
- slurm (Slurm's HealthCheckProgram): drains the node with `scontrol update nodename=N state=DRAIN
  reason="goodput: <reason>"` when a GPU is at drain or replace, and resumes it once every GPU is back below drain.
  Only a drain whose reason starts with "goodput:" is ever resumed: a drain a person set stays. A `drain` waits for
  the next completed checkpoint save of the jobs on the node (bounded by a deadline); `replace` and a lost GPU drain
  at once. Safety: --dry-run (says and counts what it would do, changes nothing), a breaker (no drain when more than
  --max-drained-share of the cluster's nodes would be drained by goodput), and no second drain within
  --repeat-window of the last without a person (who resets the state file, or drains by hand).
- npd (Kubernetes node-problem-detector custom plugin) and nhc (an LBNL NHC check): exit status 0 OK, 1 NonOK,
  2 Unknown, one line of at most --message-limit characters on stdout. NonOK once the node would be drained (after
  the checkpoint wait, as in slurm mode); the cordon and drain are left to whatever watches the NodeCondition.

Every decision is counted in the state file (--state-file), which the daemon's `health` source publishes as
goodput_health_actions_total{action,reason,dry_run}, and logged as one JSON line with its evidence (stderr, and
--log-file). Settings come from flags, or a YAML file (--config, or GOODPUT_HEALTH_CONFIG: HealthCheckProgram takes
no arguments) whose keys are the flags' names with underscores.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import yaml

from ..core.settings import DEFAULT_PORT, parse_duration
from . import risk, state
from .risk import DRAIN, LEVELS, REPLACE, Finding

log = logging.getLogger("exporter.health")

OK_STATUS, NONOK_STATUS, UNKNOWN_STATUS = 0, 1, 2  # node-problem-detector's custom plugin protocol
REASON_PREFIX = "goodput:"
CONFIG_ENV = "GOODPUT_HEALTH_CONFIG"


@dataclass
class HealthConfig:
    mode: str = "slurm"
    daemon_url: str = f"http://127.0.0.1:{DEFAULT_PORT}"
    node: str = ""  # the scheduler's name of this node; empty: the short host name
    state_file: str = "/var/lib/goodput-exporter/health-state.json"
    log_file: str = ""
    dry_run: bool = False
    max_drained_share: float = 0.5
    repeat_window: float = 86400.0
    checkpoint_wait: float = 0.0  # 0: from the job's checkpoint interval (x checkpoint_wait_factor)
    checkpoint_wait_factor: float = 1.5
    checkpoint_wait_default: float = 1800.0  # a job that reported one save only
    checkpoint_wait_max: float = 3600.0
    xid_hold: float = 3600.0  # an XID keeps its GPU at its level this long after it was seen
    message_limit: int = 80  # node-problem-detector's default max_output_length
    timeout: float = 5.0
    scontrol: str = "scontrol"
    sinfo: str = "sinfo"


DURATIONS = {"repeat_window", "checkpoint_wait", "checkpoint_wait_default", "checkpoint_wait_max", "xid_hold",
             "timeout"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="goodput-exporter health", description=__doc__.split("\n\n")[0],
                                     argument_default=argparse.SUPPRESS,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--config", metavar="FILE", help=f"YAML file of these settings (also ${CONFIG_ENV})")
    for f in fields(HealthConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            parser.add_argument(flag, dest=f.name, action="store_true", help=f"(default {f.default})")
        else:
            parser.add_argument(flag, dest=f.name, metavar="VALUE", help=f"(default {f.default})")
    return parser


def load_config(argv: list[str], environ: dict[str, str] | None = None) -> HealthConfig:
    environ = os.environ if environ is None else environ
    args = vars(_parser().parse_args(argv))
    path = args.pop("config", None) or environ.get(CONFIG_ENV)
    values: dict[str, Any] = {}
    if path:
        with open(path) as handle:
            values.update(yaml.safe_load(handle) or {})
    values.update(args)
    config = HealthConfig()
    known = {f.name: f for f in fields(HealthConfig)}
    for key, value in values.items():
        key = key.replace("-", "_")
        if key not in known:
            raise ValueError(f"unknown health setting {key!r} (known: {', '.join(known)})")
        default = getattr(config, key)
        if key in DURATIONS:
            value = 0.0 if value in (0, "0") else parse_duration(value)
        elif isinstance(default, bool):
            value = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
        elif isinstance(default, int):
            value = int(value)
        elif isinstance(default, float):
            value = float(value)
        setattr(config, key, value)
    if config.mode not in ("slurm", "npd", "nhc"):
        raise ValueError(f"mode {config.mode!r}: one of slurm, npd, nhc")
    config.node = config.node or socket.gethostname().split(".")[0]
    return config


# --- what the daemon says -------------------------------------------------------------------------------------------

@dataclass
class Reading:
    samples: list[tuple[str, dict[str, str], float]]
    now: float

    def of(self, name: str) -> list[tuple[dict[str, str], float]]:
        return [(labels, value) for n, labels, value in self.samples if n == name]


def read_daemon(config: HealthConfig) -> Reading:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(config.daemon_url.rstrip("/") + "/metrics", timeout=config.timeout)
    response.raise_for_status()
    samples = [(s.name, dict(s.labels), s.value)
               for family in text_string_to_metric_families(response.text) for s in family.samples]
    return Reading(samples, time.time())


def assess(reading: Reading, memory: dict[str, Any], config: HealthConfig) -> list[Finding]:
    """Every reason a GPU is at watch or worse now. `memory` (the state file) keeps the counters seen at the last
    run, to tell what rose since, and the XIDs still held at their level."""
    now = reading.now
    gpus = {labels["uuid"]: labels.get("gpu", "?") for labels, _ in reading.of("goodput_gpu_info")}
    findings: list[Finding] = []

    def find(uuid: str, level: int, reason: str, evidence: str) -> None:
        findings.append(Finding(gpus.get(uuid, "?"), uuid, level, reason, evidence))

    def gauge(name: str, level: int, reason: str) -> None:
        """A state the GPU is in while the gauge is above 0 (the flags are 0 or 1; the recovery action a code)."""
        for labels, value in reading.of(name):
            if value > 0 and "uuid" in labels:
                find(labels["uuid"], level, reason, f"{name}={value:.0f}")

    gauge("goodput_gpu_row_remap_failure", REPLACE, "row_remap_failure")
    gauge("goodput_gpu_row_remap_pending", DRAIN, "row_remap_pending")
    gauge("goodput_gpu_retired_pages_pending", DRAIN, "retired_pages_pending")
    gauge("goodput_gpu_recovery_action", DRAIN, "recovery_action")
    for labels, value in reading.of("goodput_gpu_up"):
        if value == 0:
            find(labels["uuid"], DRAIN, "gpu_lost", "goodput_gpu_up=0")
    retired: dict[str, float] = {}
    for labels, value in reading.of("goodput_gpu_retired_pages_total"):
        retired[labels["uuid"]] = retired.get(labels["uuid"], 0) + value
    for uuid, total in retired.items():
        if total >= risk.RETIRED_PAGES_REPLACE:
            find(uuid, REPLACE, "retired_pages_exhausted", f"goodput_gpu_retired_pages_total={total:.0f}")

    seen = memory.setdefault("seen", {})
    recent = [r for r in memory.get("recent", []) if r["until"] > now]
    last_xid = {labels["uuid"]: value for labels, value in reading.of("goodput_gpu_last_xid_timestamp_seconds")}
    for labels, value in reading.of("goodput_gpu_xid_errors_total"):
        uuid, xid = labels["uuid"], labels["xid"]
        before = seen.setdefault(uuid, {}).setdefault("xid", {}).get(xid)
        rose = value > before if before is not None else last_xid.get(uuid, 0) > now - config.xid_hold
        seen[uuid]["xid"][xid] = value
        if not rose:
            continue
        code = int(xid) if xid.isdigit() else -1
        level = risk.xid_level(code)
        reason = f"xid_{xid}" if code in risk.XIDS else "xids_repeated"
        if code in risk.REPEAT_REPLACE_XIDS:
            times = seen[uuid].setdefault("xid_times", {}).setdefault(xid, [])
            times[:] = [t for t in times if t > now - config.repeat_window] + [now]
            if len(times) >= 2 or (before is None and value >= 2):
                level, reason = REPLACE, "xid_repeated"
        recent.append({"uuid": uuid, "gpu": labels.get("gpu", "?"), "level": level, "reason": reason,
                       "until": now + config.xid_hold, "evidence": f"goodput_gpu_xid_errors_total{{xid=\"{xid}\"}}"
                                                                   f" rose to {value:.0f}"})
    for labels, value in reading.of("goodput_gpu_ecc_errors_total"):
        # volatile: since the driver loaded, 0 again once the GPU is reset (what NVIDIA asks for after one)
        if labels.get("error_type") == "uncorrected" and value > 0 and "uuid" in labels:
            find(labels["uuid"], DRAIN, "ecc_uncorrected",
                 f"{value:.0f} uncorrected ECC errors since the driver loaded (no reset since)")
    memory["recent"] = recent
    for r in recent:
        findings.append(Finding(gpus.get(r["uuid"], r["gpu"]), r["uuid"], r["level"], r["reason"], r["evidence"]))
    return sorted(findings, key=lambda f: (-f.level, f.gpu, f.reason))


def checkpoints(reading: Reading) -> tuple[dict[str, float], float | None]:
    """(workload/rank -> its last completed save, the longest checkpoint interval among them)."""
    saves = {f"{labels['workload']}/{labels['rank']}": value
             for labels, value in reading.of("goodput_checkpoint_last_save_timestamp_seconds")}
    intervals = [value for _, value in reading.of("goodput_checkpoint_interval_seconds")]
    return saves, max(intervals) if intervals else None


# --- Slurm ------------------------------------------------------------------------------------------------------------

def _run(args: list[str], timeout: float) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def node_state(config: HealthConfig, node: str) -> tuple[set[str], str]:
    """(the node's state flags, upper case: IDLE, MIXED, DRAIN, ...; its reason, or '')."""
    out = _run([config.scontrol, "show", "node", node, "--oneliner"], config.timeout)
    flags: set[str] = set()
    reason = ""
    for part in out.split(" "):
        if part.startswith("State="):
            flags = set(part[len("State="):].upper().split("+"))
    if " Reason=" in out:
        reason = out.split(" Reason=", 1)[1]
        reason = reason.split(" [", 1)[0].strip()  # "Reason=text [user@time]"
    return flags, reason


def drained_share(config: HealthConfig) -> tuple[int, int]:
    """(nodes drained with a goodput reason, all nodes) in the cluster."""
    out = _run([config.sinfo, "--noheader", "--Node", "--format=%N|%E|%T"], config.timeout)
    nodes: dict[str, bool] = {}
    for line in out.splitlines():
        name, reason, node_state_ = ([*line.split("|"), "", ""])[:3]
        ours = reason.startswith(REASON_PREFIX) and ("drain" in node_state_.lower())
        nodes[name] = nodes.get(name, False) or ours
    return sum(nodes.values()), len(nodes)


# --- deciding -------------------------------------------------------------------------------------------------------

@dataclass
class Decision:
    action: str  # none, wait, drain, resume, refuse, unknown
    reason: str  # the cause (row_remap_pending, ...), or why refused (breaker, repeat_window)
    message: str
    level: int = 0
    evidence: list[str] | None = None


def _summary(findings: list[Finding]) -> str:
    worst = findings[0]
    others = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
    return f"{LEVELS[worst.level]}: {worst.describe()}{others}"


def decide(config: HealthConfig, findings: list[Finding], reading: Reading, memory: dict[str, Any],
           ours: bool, theirs: bool) -> Decision:
    """What to do about this node. `ours`: it is drained with a goodput reason; `theirs`: drained for another
    reason (a person's)."""
    now = reading.now
    evidence = [f"{f.describe()} [{f.level_name}]: {f.evidence}" for f in findings]
    worst = findings[0].level if findings else 0
    if worst < DRAIN:
        memory["pending"] = None
        note = f"; watch: {findings[0].describe()}" if findings else ""
        if ours:
            return Decision("resume", "cleared", f"goodput: every GPU below drain, resuming{note}", worst, evidence)
        return Decision("none", "ok", f"goodput: ok{note}", worst, evidence)
    cause = findings[0]
    if ours or theirs:
        memory["pending"] = None
        who = "goodput" if ours else "someone else"
        return Decision("none", cause.reason, f"goodput: drained by {who}; {_summary(findings)}", worst, evidence)
    immediate = worst >= REPLACE or cause.reason == "gpu_lost"
    saves, interval = checkpoints(reading)
    pending = memory.get("pending")
    after = ""
    if not immediate and saves:
        if pending is None:
            wait = config.checkpoint_wait or (
                min(config.checkpoint_wait_max, interval * config.checkpoint_wait_factor) if interval
                else config.checkpoint_wait_default)
            memory["pending"] = {"since": now, "deadline": now + wait, "reason": cause.reason, "saves": saves}
            return Decision("wait", cause.reason, f"goodput: {_summary(findings)}; drain after the next checkpoint "
                            f"(within {wait:.0f}s)", worst, evidence)
        saved = [k for k, t in saves.items() if t > pending["saves"].get(k, pending["since"])]
        if saved:
            after = f", after checkpoint of {saved[0]}"
        elif now >= pending["deadline"]:
            after = ", no checkpoint by deadline"
        else:
            return Decision("none", cause.reason, f"goodput: {_summary(findings)}; waiting for the next checkpoint "
                            f"({pending['deadline'] - now:.0f}s left)", worst, evidence)
    return Decision("drain", cause.reason, f"{REASON_PREFIX} {cause.describe()}{after}", worst, evidence)


def guard(config: HealthConfig, decision: Decision, memory: dict[str, Any], now: float) -> Decision:
    """The safeties in front of a drain: the repeat window, then the breaker."""
    if decision.action != "drain":
        return decision
    last = memory.get("last_drain")
    if last is not None and config.repeat_window and now - last < config.repeat_window:
        return Decision("refuse", "repeat_window", f"goodput: not draining again ({decision.message}): drained by "
                        f"goodput {now - last:.0f}s ago, within repeat_window {config.repeat_window:.0f}s; a person "
                        "must drain it (or remove the state file)", decision.level, decision.evidence)
    if config.mode == "slurm":
        drained, total = drained_share(config)
        if total and (drained + 1) / total > config.max_drained_share:
            return Decision("refuse", "breaker", f"goodput: breaker open, not draining ({decision.message}): "
                            f"{drained} of {total} nodes already drained by goodput, a drain would pass "
                            f"max_drained_share {config.max_drained_share:g}", decision.level, decision.evidence)
    return decision


def _record(config: HealthConfig, memory: dict[str, Any], decision: Decision, node: str) -> None:
    if decision.action in ("none",):
        return
    key = state.count_key(decision.action, decision.reason, config.dry_run)
    counts = memory.setdefault("counts", {})
    counts[key] = counts.get(key, 0) + 1
    entry = {"ts": time.time(), "node": node, "mode": config.mode, "dry_run": config.dry_run,
             **{k: v for k, v in asdict(decision).items() if k != "level"}, "level": LEVELS[decision.level]}
    line = json.dumps(entry)
    log.warning("%s", line)
    if config.log_file:
        with open(config.log_file, "a") as handle:
            handle.write(line + "\n")


def run(config: HealthConfig, reload: Callable[[], HealthConfig] | None = None) -> tuple[int, str]:
    """One health check: (exit status, message). `reload`: read the settings again once the state file's lock is held
    (slurmd may start a check while another still runs: the waiting one acts on the settings of when it acts)."""
    with state.locked(config.state_file):
        if reload is not None:
            config = reload()
        memory = state.read(config.state_file)
        try:
            reading = read_daemon(config)
        except Exception as exc:  # the daemon down: say so, never act on a guess
            decision = Decision("unknown", "daemon_unreachable", f"goodput: cannot read the daemon at "
                                f"{config.daemon_url}: {exc.__class__.__name__}")
            _record(config, memory, decision, config.node)
            memory["last_run"] = time.time()
            state.write(config.state_file, memory)
            return UNKNOWN_STATUS, decision.message
        findings = assess(reading, memory, config)
        ours = theirs = False
        if config.mode == "slurm":
            flags, reason = node_state(config, config.node)
            drained = bool(flags & {"DRAIN", "DRAINED", "DRAINING"})
            ours, theirs = drained and reason.startswith(REASON_PREFIX), drained and not reason.startswith(
                REASON_PREFIX)
        decision = guard(config, decide(config, findings, reading, memory, ours, theirs), memory, reading.now)
        if config.mode == "slurm" and not config.dry_run:
            if decision.action == "drain":
                _run([config.scontrol, "update", f"nodename={config.node}", "state=DRAIN",
                      f"reason={decision.message}"], config.timeout)
                memory["last_drain"], memory["pending"] = reading.now, None
            elif decision.action == "resume":
                _run([config.scontrol, "update", f"nodename={config.node}", "state=RESUME"], config.timeout)
        elif decision.action == "drain":
            memory["pending"] = None if config.mode == "slurm" else memory.get("pending")
        if config.dry_run and decision.action in ("drain", "resume"):
            decision.message = f"dry run, would {decision.action}: {decision.message}"
        _record(config, memory, decision, config.node)
        memory["last_run"] = reading.now
        state.write(config.state_file, memory)
    drained = decision.action == "none" and (ours or theirs) and decision.level >= DRAIN
    status = NONOK_STATUS if decision.action in ("drain", "refuse") or drained else OK_STATUS
    return status, decision.message


def main(argv: list[str]) -> int:
    """node health check for Slurm (HealthCheckProgram, NHC) and node-problem-detector: drain at GPU risk"""
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    try:
        config = load_config(argv)
    except (ValueError, OSError) as exc:
        print(f"goodput: bad health settings: {exc}"[:80])
        return UNKNOWN_STATUS
    if config.mode == "slurm" and not shutil.which(config.scontrol):
        print(f"goodput: {config.scontrol} not found")
        return UNKNOWN_STATUS
    try:
        status, message = run(config, lambda: load_config(argv))
    except Exception as exc:
        status, message = UNKNOWN_STATUS, f"goodput: health check failed: {exc}"
    if config.mode != "slurm":
        message = message[:config.message_limit]
    print(message)
    return status

