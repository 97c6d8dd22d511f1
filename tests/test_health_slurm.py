"""`goodput-exporter health` as Slurm's HealthCheckProgram, against a real Slurm (Debian's slurmctld, slurmd and
munge, `make deps`), started here with a generated slurm.conf: this machine as node one, plus a second node that
never answers (it only counts for the breaker). The daemon runs in this process on simulated GPUs; a Slurm job
reports steps and checkpoint saves to it through the client, saving when the test touches a file.

One module-wide Slurm and daemon; the checks run in order, each leaving the node in service for the next."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import ROOT

from exporter.assemble import build_daemon
from exporter.config import load
from exporter.core.http import ServerThread, bind, create_app
from exporter.sources.nvml.simulated import SimulatedGpus

BINARIES = ("slurmctld", "slurmd", "munged", "scontrol", "sinfo", "sbatch", "squeue")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(b) for b in BINARIES),
    reason="needs root and Debian's slurm-wlm and munge (make deps)")

FAKE = "goodput-fake2"  # the second node of slurm.conf: no slurmd, it only makes the cluster two nodes big
HEALTH_INTERVAL = 1  # slurm.conf HealthCheckInterval, seconds

JOB = """
import os, sys, time
from pathlib import Path
from goodput_client import Telemetry
work = Path(sys.argv[1])
telemetry = Telemetry(workload="hc-job", rank=0, socket_path=sys.argv[2], flush_interval=0.1)
def save():
    with telemetry.phase("checkpoint_save"):
        time.sleep(0.2)
    telemetry.flush()
save(); save()  # two saves: the daemon learns the checkpoint interval
(work / "started").write_text(str(os.getpid()))
while not (work / "stop").exists():
    with telemetry.step():
        time.sleep(0.05)
    if (work / "save").exists():
        save()
        (work / "save").unlink()
        (work / "saved").write_text(str(time.time()))
telemetry.close()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def until(what: str, check: Callable[[], object], timeout: float = 20.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@dataclass
class Cluster:
    work: Path
    conf: Path
    node: str
    env: dict[str, str]
    gpus: SimulatedGpus
    health_config: Path
    state_file: Path
    log_file: Path
    daemon_url: str

    def run(self, *args: str) -> str:
        return subprocess.run(args, env=self.env, capture_output=True, text=True, check=True, timeout=20).stdout

    def node_line(self, node: str | None = None) -> str:
        return self.run("scontrol", "show", "node", node or self.node, "--oneliner")

    def state(self, node: str | None = None) -> str:
        line = self.node_line(node)
        return line.split("State=", 1)[1].split(" ", 1)[0]

    def reason(self, node: str | None = None) -> str:
        line = self.node_line(node)
        return line.split(" Reason=", 1)[1].split(" [", 1)[0] if " Reason=" in line else ""

    def settings(self, **changes: object) -> None:
        data = yaml.safe_load(self.health_config.read_text())
        data.update(changes)
        self.health_config.write_text(yaml.safe_dump(data))

    def counts(self) -> dict[str, int]:
        return json.loads(self.state_file.read_text())["counts"] if self.state_file.exists() else {}

    def health_runs(self) -> float:
        return json.loads(self.state_file.read_text()).get("last_run") or 0.0 if self.state_file.exists() else 0.0

    def after_checks(self, n: int = 3) -> None:
        """Until the health check has run n more times."""
        for _ in range(n):
            seen = self.health_runs()
            until("the next health check", lambda seen=seen: self.health_runs() > seen, 15)


def _start_munge() -> Path:
    """A munged of the test's own (its key and socket), as root: slurm.conf's AuthInfo points Slurm at its socket."""
    # munged checks every folder above its files: pytest's own (0700) will not do
    munge = Path(tempfile.mkdtemp(prefix="goodput-munge-"))
    munge.chmod(0o755)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = munge / "munge.socket"
    subprocess.run(["munged", f"--socket={sock}", f"--key-file={key}", f"--pid-file={munge / 'munged.pid'}",
                    f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}"],
                   check=True, timeout=20)
    until("munged's socket", sock.exists, 10)
    return sock


def _stop_pidfile(path: Path) -> None:
    try:
        pid = int(path.read_text().strip())
        os.kill(pid, 15)
    except (OSError, ValueError):
        pass


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("slurm")
    work.chmod(0o755)
    munge_socket = _start_munge()
    gpus = SimulatedGpus(2)
    port = _free_port()
    config = load(None, {
        "web": {"listen_address": f"127.0.0.1:{port}"},
        "nvml": {"interval": "0.5s", "slow_interval": "0.5s"},
        "ingest": {"interval": "0.5s", "socket_path": str(work / "events.sock")},
        "health": {"interval": "0.5s", "state_file": str(work / "health-state.json")},
        "kubelet": {"enabled": False}, "fabric": {"enabled": False}, "dcgm": {"enabled": False},
        "flight": {"enabled": False}, "host": {"enabled": False}, "process": {"enabled": False},
    }, environ={})
    sock = bind(config.web.listen_address)
    daemon = build_daemon(config, backend=gpus)
    daemon.start()
    server = ServerThread(create_app(daemon), [sock], "health-test-http")
    server.start()
    daemon_url = f"http://127.0.0.1:{port}"
    until("the daemon", lambda: httpx.get(f"{daemon_url}/readyz").status_code == 200, 20)

    node = socket.gethostname().split(".")[0]
    conf = work / "slurm.conf"
    env = {**os.environ, "SLURM_CONF": str(conf)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "client"), str(ROOT / "mixin"),
                                         env.get("PYTHONPATH", "")])
    health_config = work / "health.yaml"
    state_file = work / "health-state.json"
    log_file = work / "health.log"
    health_config.write_text(yaml.safe_dump({
        "mode": "slurm", "daemon_url": daemon_url, "node": node, "state_file": str(state_file),
        "log_file": str(log_file), "repeat_window": 0, "max_drained_share": 0.5, "checkpoint_wait": "10m",
        "xid_hold": "10s"}))
    program = work / "goodput-health.sh"
    program.write_text(f"#!/bin/sh\nexport SLURM_CONF={conf}\nexport PYTHONPATH={env['PYTHONPATH']}\n"
                       f"export GOODPUT_HEALTH_CONFIG={health_config}\n"
                       f"exec {sys.executable} -X faulthandler -c 'import faulthandler, sys; "
                       f"faulthandler.dump_traceback_later(20, exit=True); from exporter.cli import main; "
                       f"sys.exit(main([\"health\"]))' >>{work / 'health.out'} 2>&1\n")
    program.chmod(0o755)
    ctld_port, slurmd_port = _free_port(), _free_port()
    for sub in ("state", "spool"):
        (work / sub).mkdir()
    conf.write_text(f"""ClusterName=goodputtest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={work / 'state'}
SlurmdSpoolDir={work / 'spool'}
SlurmctldPidFile={work / 'slurmctld.pid'}
SlurmdPidFile={work / 'slurmd.pid'}
SlurmctldLogFile={work / 'slurmctld.log'}
SlurmdLogFile={work / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
HealthCheckProgram={program}
HealthCheckInterval={HEALTH_INTERVAL}
HealthCheckNodeState=ANY
NodeName={node} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
NodeName={FAKE} NodeAddr=127.0.0.1 Port={_free_port()} CPUs=1 RealMemory=100 State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    # in the foreground, as children of this process: stopped by their PIDs
    daemons = [subprocess.Popen([name, "-D", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT) for name in ("slurmctld", "slurmd")]
    c = Cluster(work, conf, node, env, gpus, health_config, state_file, log_file, daemon_url)
    try:
        until("the node idle", lambda: "IDLE" in c.state() or "MIX" in c.state(), 30)
        c.run("sbatch", f"--nodelist={node}", "--job-name=hc-job", f"--output={work / 'job.out'}",
              f"--chdir={work}", f"--export=ALL,PYTHONPATH={env['PYTHONPATH']}",
              f"--wrap={sys.executable} -c '{_job_file(work)}' {work} {work / 'events.sock'}")
        until("the job's first saves", lambda: (work / "started").exists(), 30)
        yield c
    finally:
        (work / "stop").write_text("")
        for proc in reversed(daemons):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        _stop_pidfile(munge_socket.parent / "munged.pid")
        server.stop()
        daemon.stop()


def _job_file(work: Path) -> str:
    path = work / "job.py"
    path.write_text(JOB)
    return f"exec(open(\"{path}\").read())"


def _job_running(c: Cluster) -> bool:
    return c.run("squeue", "--noheader", "--name=hc-job", "--format=%T").strip() == "RUNNING"


def _metric(c: Cluster, name: str) -> str:
    return "\n".join(line for line in httpx.get(f"{c.daemon_url}/metrics").text.splitlines()
                     if line.startswith(name))


def test_a_pending_row_remap_drains_the_node_after_the_next_checkpoint_then_resumes(cluster: Cluster) -> None:
    c = cluster
    c.after_checks(2)
    assert "DRAIN" not in c.state(), c.node_line()
    assert 'goodput_checkpoint_interval_seconds{workload="hc-job",rank="0"}' in _metric(c, "goodput_checkpoint")
    c.gpus.remap_row(1)
    # the job has not saved since: the drain waits
    until("the wait for a checkpoint", lambda: "wait|row_remap_pending|false" in c.counts(), 15)
    assert "DRAIN" not in c.state(), c.node_line()
    # the daemon's health source reads the check's state file on its own interval
    until("the daemon shows the drain pending",
          lambda: "goodput_health_drain_pending 1" in _metric(c, "goodput_health_drain_pending"), 15)
    (c.work / "save").write_text("")
    until("the checkpoint", lambda: (c.work / "saved").exists(), 10)
    saved_at = float((c.work / "saved").read_text())
    until("the drain", lambda: "DRAIN" in c.state(), 15)
    drained_at = time.time()
    assert drained_at >= saved_at
    reason = c.reason()
    assert reason.startswith("goodput: GPU 1 row_remap_pending (GPU-") and "after checkpoint" in reason, reason
    assert _job_running(c), "the drain killed the job"
    assert c.counts().get("drain|row_remap_pending|false") == 1
    logged = [json.loads(line) for line in c.log_file.read_text().splitlines()]
    drain = next(e for e in logged if e["action"] == "drain")
    assert drain["evidence"] and "goodput_gpu_row_remap_pending=1" in drain["evidence"][0]
    # the GPU reset: the remap took effect, the node returns to service
    c.gpus.reset(1)
    until("the resume", lambda: "DRAIN" not in c.state(), 15)
    assert c.counts().get("resume|cleared|false") == 1 and _job_running(c)


def test_a_drain_set_by_a_person_is_never_resumed(cluster: Cluster) -> None:
    c = cluster
    c.run("scontrol", "update", f"nodename={c.node}", "state=DRAIN", "reason=maintenance by hand")
    c.after_checks(2)  # at least one whole check saw the drain
    assert "DRAIN" in c.state() and c.reason() == "maintenance by hand"
    c.run("scontrol", "update", f"nodename={c.node}", "state=RESUME")
    until("the node back", lambda: "DRAIN" not in c.state(), 10)


def test_dry_run_changes_nothing_but_counts_and_logs(cluster: Cluster) -> None:
    c = cluster
    c.settings(dry_run=True)
    c.after_checks(2)  # checks do not overlap: the second started after the change
    c.gpus.fail_row_remap(0)  # replace: drains at once, no checkpoint wait
    try:
        until("the dry-run decision", lambda: c.counts().get("drain|row_remap_failure|true"), 15)
        c.after_checks(1)
        assert "DRAIN" not in c.state(), c.node_line()
        assert "dry run, would drain" in (c.work / "health.out").read_text()
        assert any(json.loads(line)["dry_run"] for line in c.log_file.read_text().splitlines())
        until("the counter on /metrics", lambda: 'action="drain",reason="row_remap_failure",dry_run="true"'
              in _metric(c, "goodput_health_actions_total"), 10)
    finally:
        c.gpus._gpus[0].row_remap_failure = 0  # the GPU replaced
        c.settings(dry_run=False)
    c.after_checks(2)


def test_the_breaker_refuses_a_drain_past_its_share_and_says_why(cluster: Cluster) -> None:
    c = cluster
    # the other node already drained by goodput: one of two; draining this one too would pass 50%
    c.run("scontrol", "update", f"nodename={FAKE}", "state=DRAIN", "reason=goodput: GPU 3 (GPU-x) xid_79")
    c.after_checks(1)
    c.gpus.fail_row_remap(0)
    try:
        until("the refusal", lambda: c.counts().get("refuse|breaker|false"), 15)
        c.after_checks(1)
        assert "DRAIN" not in c.state(), c.node_line()
        assert "breaker open" in (c.work / "health.out").read_text()
        assert "1 of 2 nodes already drained by goodput" in (c.work / "health.out").read_text()
    finally:
        c.gpus._gpus[0].row_remap_failure = 0
    assert _job_running(c)


def test_a_node_drained_within_the_repeat_window_is_not_drained_again_without_a_person(cluster: Cluster) -> None:
    """Drained by goodput and back in service, a node that fails again within repeat_window is left to a person:
    the check refuses, counts it and says why (a GPU that keeps failing after its reset is no longer one for the
    automation)."""
    c = cluster
    c.settings(max_drained_share=1.0)  # the breaker's test left the other node drained by goodput
    c.after_checks(1)
    c.gpus.fail_row_remap(0)  # replace: drains at once
    try:
        until("the drain", lambda: "DRAIN" in c.state(), 15)
    finally:
        c.gpus._gpus[0].row_remap_failure = 0  # the GPU replaced
    until("the resume", lambda: "DRAIN" not in c.state(), 15)
    c.settings(repeat_window="1h")
    try:
        c.after_checks(1)
        c.gpus.fail_row_remap(0)
        until("the refusal", lambda: c.counts().get("refuse|repeat_window|false"), 15)
        c.after_checks(1)
        assert "DRAIN" not in c.state(), c.node_line()
        assert "not draining again" in (c.work / "health.out").read_text()
    finally:
        c.gpus._gpus[0].row_remap_failure = 0
        c.settings(repeat_window=0, max_drained_share=0.5)
    assert _job_running(c)
