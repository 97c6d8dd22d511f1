"""Workload and rank of GPU processes: real child processes started with launcher variables, the
simulated NVML reporting their PIDs, the precedence of a declaration over the environment."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, ManualClock, live_server, quick_config, series, value, wait_for
from goodput_client.launcher import job_from, run_from, workload_from

from exporter.core.exposition import TEXT, Renderer
from exporter.sources.ingest.models import StepEvent
from exporter.sources.ingest.peer import pid_namespace_is_hosts, start_time
from exporter.sources.ingest.state import IngestState
from exporter.sources.nvml.simulated import SimulatedGpus
from exporter.sources.nvml.source import NvmlSource
from exporter.sources.process.procenv import MAX_ENVIRON_BYTES, Outcome, parse_environ, read_identity
from exporter.sources.process.source import ProcessSource

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
    source = ProcessSource(nvml.table)
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
        from exporter.sources.process.procenv import read_identity
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
    from goodput_client import Telemetry
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


def step(workload: str, rank: int) -> StepEvent:
    return StepEvent(type="step", workload=workload, rank=rank, duration_seconds=0.1)


def fake_stat(proc: Path, pid: int, started: int) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    fields = ["S", *["0"] * 18, str(started), "0"]  # field 3 (state) .. field 22 (starttime) ..
    (proc / str(pid) / "stat").write_text(f"{pid} (python3 (odd) name) {' '.join(fields)}\n")


def test_declarations_are_bound_to_the_process_not_the_pid(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    state = IngestState(10, 100, idle_timeout=60, proc_path=str(proc))
    fake_stat(proc, 4242, started=1000)
    fake_stat(proc, 4343, started=1000)
    state.apply([step("job-a", 0), step("job-a", 0)], peer_pid=4242)
    state.apply([step("job-a", 1), step("job-b", 0)], peer_pid=4343)  # a relay: two identities
    declared = state.declared()
    assert declared.claims == {4242: ("job-a", "0")}
    assert declared.ignored == {"mixed_identity": 1}
    fake_stat(proc, 4242, started=2000)  # the process exits; another one gets its PID
    declared = state.declared()
    assert declared.claims == {}
    assert declared.ignored == {"mixed_identity": 1, "pid_reused": 1}
    fake_stat(proc, 4242, started=2000)
    state.apply([step("job-a", 0)], peer_pid=4242)  # the new process declares for itself
    assert state.declared().claims == {4242: ("job-a", "0")}
    shutil.rmtree(proc / "4242")  # gone: forgotten, not counted as reused
    declared = state.declared()
    assert declared.claims == {} and declared.ignored["pid_reused"] == 1
    assert 4242 not in state._declared


def test_start_time_of_a_real_process(spawn) -> None:  # type: ignore[no-untyped-def]
    child = spawn()
    started = start_time(Path("/proc"), child.pid)
    ours = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
    assert started is not None and started >= ours
    child.kill()
    child.wait()
    assert start_time(Path("/proc"), child.pid) is None


def test_declarations_are_not_bound_across_pid_namespaces(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                          spawn) -> None:  # type: ignore[no-untyped-def]
    child = spawn(TORCHELASTIC_RUN_ID="env-job", RANK="3")
    state = IngestState(10, 100, idle_timeout=60)
    state.apply([step("declared-job", 0)], peer_pid=child.pid)
    sim = SimulatedGpus(1)
    nvml = NvmlSource(sim)
    sim.attach_process(0, child.pid)
    nvml.collect()
    # a procfs whose init is in another PID namespace than ours
    other = tmp_path / "proc"
    (other / "1" / "ns").mkdir(parents=True)
    os.symlink("pid:[4026530000]", other / "1" / "ns" / "pid")
    with caplog.at_level("WARNING", logger="exporter.sources.process.source"):
        foreign = ProcessSource(nvml.table, proc_path=str(other), declared=state.declared)
        foreign.collect()
        foreign.collect()
    assert not foreign.trust_peer_pids
    assert len([r for r in caplog.records if "PID namespace" in r.getMessage()]) == 1
    text = Renderer().render(foreign.collect(), TEXT).decode()
    assert value(text, "goodput_attribution_processes", state="declared") == 0
    # the same procfs as ours: the declaration is bound, and wins over the environment
    same = tmp_path / "same"
    (same / "1" / "ns").mkdir(parents=True)
    os.symlink(os.readlink("/proc/self/ns/pid"), same / "1" / "ns" / "pid")
    ok, _ = pid_namespace_is_hosts(str(same))
    assert ok
    source = ProcessSource(nvml.table, declared=state.declared)
    if source.trust_peer_pids:  # this machine's /proc is the host's (or NSpid says so)
        text = Renderer().render(source.collect(), TEXT).decode()
        assert workloads(text) == {("0", "declared-job", "0")}


KEEP_ALIVE_CLIENT = textwrap.dedent("""
    import http.client, os, socket, sys, time

    class Unix(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(sys.argv[1])

    conn = Unix("localhost")
    conn.connect()
    first = conn.sock
    seen = []
    for _ in range(20):
        conn.request("GET", "/")
        seen.append(conn.getresponse().read().decode())
        time.sleep(0.01)
    assert conn.sock is first, "the connection was not kept alive"
    print(os.getpid(), " ".join(seen))
""")


def test_each_request_carries_its_own_connections_pid(tmp_path: Path) -> None:
    """Two processes, each with one keep-alive connection to the same socket, interleaving requests:
    every request is attributed to the process on the other end of its own connection."""
    import threading

    import uvicorn

    from exporter.sources.ingest.peer import PeerCredProtocol

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        pid = scope.get("state", {}).get("peer_pid")
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": str(pid).encode()})

    path = str(tmp_path / "peer.sock")
    server = uvicorn.Server(uvicorn.Config(app, uds=path, http=PeerCredProtocol, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        clients = [subprocess.Popen([sys.executable, "-c", KEEP_ALIVE_CLIENT, path], stdout=subprocess.PIPE,
                                    text=True, env=env) for _ in range(2)]
        outputs = [client.communicate(timeout=60)[0] for client in clients]
        assert all(client.returncode == 0 for client in clients)
    finally:
        server.should_exit = True
        thread.join(10)
    pids = set()
    for output in outputs:
        pid, *seen = output.split()
        assert len(seen) == 20 and set(seen) == {pid}, output
        pids.add(pid)
    assert pids == {str(client.pid) for client in clients}


def test_a_variable_cut_by_the_read_cap_is_dropped() -> None:
    """A real process whose environment exceeds MAX_ENVIRON_BYTES with the cap falling inside
    TORCHELASTIC_RUN_ID: the cut value (run-12345) must not become a workload."""
    target = "TORCHELASTIC_RUN_ID=run-123456789"
    env: dict[str, str] = {}
    used = 0
    room = MAX_ENVIRON_BYTES - (len(target) - 4)  # the cap falls 4 bytes before the end of target
    i = 0
    while used < room:
        size = min(100_000, room - used - 1 - len(f"PAD{i}="))
        assert size > 0
        env[f"PAD{i}"] = "x" * size
        used += len(f"PAD{i}=") + size + 1
        i += 1
    assert used == room
    env["TORCHELASTIC_RUN_ID"] = "run-123456789"
    env["RANK"] = "4"
    child = subprocess.Popen([sys.executable, "-c", SLEEPER], env=env)
    try:
        wait_for(lambda: Path(f"/proc/{child.pid}/environ").read_bytes().startswith(b"PAD0="))
        assert len(Path(f"/proc/{child.pid}/environ").read_bytes()) > MAX_ENVIRON_BYTES
        identity = read_identity(Path("/proc"), child.pid)
    finally:
        child.kill()
        child.wait()
    assert identity.workload is None, identity  # not "run-12345"
    assert identity.outcome == Outcome.UNATTRIBUTED


def test_environ_names_given_twice_keep_the_first_value() -> None:
    data = b"RANK=1\0TORCHELASTIC_RUN_ID=a\0RANK=2\0TORCHELASTIC_RUN_ID=b\0"
    assert parse_environ(data) == {"RANK": "1", "TORCHELASTIC_RUN_ID": "a"}
    assert parse_environ(b"RANK=1\0RANK=2", truncated=True) == {"RANK": "1"}  # RANK=2 may be RANK=23
    assert parse_environ(b"RANK=1\0RANK=2\0", truncated=True) == {"RANK": "1"}


def test_a_loopback_rendezvous_is_qualified_with_the_host(spawn) -> None:  # type: ignore[no-untyped-def]
    assert workload_from({"MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}, "node-a") == "node-a/localhost:29500"
    assert workload_from({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "node-b.dc") == \
        "node-b/127.0.0.1:29500"
    assert workload_from({"MASTER_ADDR": "::1", "MASTER_PORT": "1"}, "n") == "n/::1:1"
    assert workload_from({"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500"}, "n") == "10.1.2.3:29500"
    assert workload_from({"MASTER_ADDR": "trainer-0.svc", "MASTER_PORT": "29500"}, "n") == "trainer-0.svc:29500"
    child = spawn(MASTER_ADDR="localhost", MASTER_PORT="29500", RANK="2")
    wait_for(lambda: b"MASTER_ADDR" in Path(f"/proc/{child.pid}/environ").read_bytes())
    identity = read_identity(Path("/proc"), child.pid)
    host = socket.gethostname().partition(".")[0]
    assert (identity.workload, identity.rank) == (f"{host}/localhost:29500", 2)


def test_goodput_job_names_the_workload_over_the_launchers_run(spawn) -> None:  # type: ignore[no-untyped-def]
    """GOODPUT_JOB, the job's name across its runs, wins over the launcher's run id, as the client names itself; a
    GOODPUT_JOB that is no workload name is passed over for the run."""
    assert workload_from({"GOODPUT_JOB": "llm-7b", "TORCHELASTIC_RUN_ID": "run-8"}) == "llm-7b"
    assert run_from({"GOODPUT_JOB": "llm-7b", "TORCHELASTIC_RUN_ID": "run-8"}) == "run-8"
    assert workload_from({"GOODPUT_JOB": "bad name\n", "SLURM_JOB_ID": "77"}) == "77"
    assert job_from({"GOODPUT_JOB": "  "}) is None
    child = spawn(GOODPUT_JOB="llm-7b", TORCHELASTIC_RUN_ID="run-8", RANK="1")
    wait_for(lambda: b"GOODPUT_JOB" in Path(f"/proc/{child.pid}/environ").read_bytes())
    identity = read_identity(Path("/proc"), child.pid)
    assert (identity.workload, identity.rank) == ("llm-7b", 1)
