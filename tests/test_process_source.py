"""Workload and rank of GPU processes: real child processes started with launcher variables, the
simulated NVML reporting their PIDs, the precedence of a declaration over the environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, ManualClock, live_server, quick_config, series, value, wait_for

from exporter.attribution.procenv import Outcome, read_identity
from exporter.exposition import TEXT, Renderer
from exporter.gpu.simulated import SimulatedGpus
from exporter.sources.nvml import NvmlSource
from exporter.sources.process import ProcessSource

SLEEPER = "import time; time.sleep(120)"
LAUNCHER_VARS = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_PROCID", "MASTER_ADDR", "MASTER_PORT", "RANK",
                 "LOCAL_RANK", "WORLD_SIZE")


@pytest.fixture
def spawn() -> Iterator:  # type: ignore[type-arg]
    procs: list[subprocess.Popen[bytes]] = []

    def start(code: str = SLEEPER, **launcher: str) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("GOODPUT_")}
        env.update(launcher)
        env["PYTHONPATH"] = str(ROOT)
        proc = subprocess.Popen([sys.executable, "-c", code], env=env)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def workloads(text: str) -> set[tuple[str, str, str]]:
    return {(s["gpu"], s["workload"], s["rank"]) for s in series(text, "goodput_gpu_workload_info")}


def test_launcher_variables_of_real_processes(spawn) -> None:  # type: ignore[no-untyped-def]
    torchrun = [spawn(TORCHELASTIC_RUN_ID="run-7", RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                      MASTER_ADDR="10.0.0.1", MASTER_PORT="29500") for r in range(2)]
    slurm = spawn(SLURM_JOB_ID="4242", SLURM_PROCID="3")
    legacy = spawn(TORCHELASTIC_RUN_ID="none", MASTER_ADDR="trainer-master-0", MASTER_PORT="23456", RANK="5")
    nothing = spawn()
    clock = ManualClock()
    sim = SimulatedGpus(8, clock=clock)
    nvml = NvmlSource(sim, clock=clock)
    source = ProcessSource(nvml.processes)
    for gpu, proc in enumerate([*torchrun, slurm, legacy, nothing]):
        sim.attach_process(gpu, proc.pid)
    sim.attach_process(6, torchrun[1].pid)  # one rank on two GPUs
    nvml.collect()
    text = Renderer().render(source.collect(), TEXT).decode()
    assert workloads(text) == {("0", "run-7", "0"), ("1", "run-7", "1"), ("6", "run-7", "1"),
                               ("2", "4242", "3"), ("3", "trainer-master-0:23456", "5")}
    uuid0 = sim.device_uuid(sim.device_handle(0))
    assert value(text, "goodput_gpu_workload_info", gpu="0") == 1
    assert series(text, "goodput_gpu_workload_info")[0]["uuid"] == uuid0  # joinable on uuid
    assert value(text, "goodput_attribution_processes", state="environment") == 4
    assert value(text, "goodput_attribution_processes", state="unattributed") == 1

    # a rank exits: NVML stops listing it (detach), and another dies while still listed
    sim.detach_process(1, torchrun[1].pid)
    sim.detach_process(6, torchrun[1].pid)
    slurm.kill()
    slurm.wait()
    nvml.collect()
    text = Renderer().render(source.collect(), TEXT).decode()
    assert workloads(text) == {("0", "run-7", "0"), ("3", "trainer-master-0:23456", "5")}
    assert value(text, "goodput_attribution_processes", state="invisible") == 1


def test_cgroup_gives_the_slurm_job_when_the_environment_is_refused() -> None:
    """A reader without ptrace access: a child running as nobody reads a procfs tree it may only
    partly read (a real permission check, not a mocked one)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    top = Path(tempfile.mkdtemp(prefix="gp-proc-"))  # not under pytest's 0700 tmp_path: nobody must get in
    proc = top / "proc"
    for pid, cgroup in ((100, "0::/system.slice/slurmstepd.scope/job_9001/step_0/user/task_2\n"),
                        (200, "0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-abc.scope\n")):
        (proc / str(pid)).mkdir(parents=True)
        environ = proc / str(pid) / "environ"
        environ.write_bytes(b"SLURM_JOB_ID=9001\0SLURM_PROCID=7\0")
        environ.chmod(0o400)  # root's, like another user's process
        (proc / str(pid) / "cgroup").write_text(cgroup)
    proc.chmod(0o755)
    top.chmod(0o755)
    script = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        from exporter.attribution.procenv import read_identity
        os.setgid(65534); os.setuid(65534)
        for pid in (100, 200, 300):
            print(read_identity(Path({str(proc)!r}), pid))
    """)
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
        # the same tree read with privileges: the environment wins, rank included
        identity = read_identity(proc, 100)
    finally:
        shutil.rmtree(top)
    lines = out.splitlines()
    assert "Outcome.CGROUP" in lines[0] and "workload='9001'" in lines[0] and "rank=None" in lines[0]
    assert "Outcome.DENIED" in lines[1]
    assert "Outcome.INVISIBLE" in lines[2]
    assert (identity.outcome, identity.workload, identity.rank) == (Outcome.ENVIRONMENT, "9001", 7)


DECLARING_CLIENT = textwrap.dedent("""
    import sys, time
    from exporter.client import Telemetry
    telemetry = Telemetry(workload="declared-job", rank=5, socket_path=sys.argv[1], flush_interval=0.05)
    with telemetry.step(tokens=1):
        pass
    telemetry.flush()
    print("sent", flush=True)
    time.sleep(120)
""")


def test_declared_identity_wins_over_the_environment_then_expires(spawn) -> None:  # type: ignore[no-untyped-def]
    sim = SimulatedGpus(2, seed=3)
    config = quick_config(ingest={"idle_timeout": "2s"}, process={"interval": "100ms"},
                          kubelet={"enabled": False})
    with live_server(config, backend=sim) as live:
        env_only = spawn(TORCHELASTIC_RUN_ID="env-job", RANK="9")
        declaring = subprocess.Popen(
            [sys.executable, "-c", DECLARING_CLIENT, config.ingest.socket_path],
            env={**{k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS},
                 "PYTHONPATH": str(ROOT), "TORCHELASTIC_RUN_ID": "env-job", "RANK": "1"})
        try:
            sim.attach_process(0, env_only.pid)
            sim.attach_process(1, declaring.pid)
            wait_for(lambda: ("1", "declared-job", "5") in workloads(live.metrics()))
            text = live.metrics()
            assert workloads(text) == {("0", "env-job", "9"), ("1", "declared-job", "5")}
            assert value(text, "goodput_attribution_processes", state="declared") == 1
            # the declaring rank goes quiet past ingest.idle_timeout: its declaration expires with
            # its series, and the environment speaks for the process again
            wait_for(lambda: ("1", "env-job", "1") in workloads(live.metrics()), timeout=15)
            assert ("1", "declared-job", "5") not in workloads(live.metrics())
        finally:
            declaring.kill()
            declaring.wait()
