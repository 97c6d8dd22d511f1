"""Who may write which workload over the events API: a workload belongs to the sender of its first event (its uid, as
the kernel names it through SO_PEERCRED) while it has live ranks; other uids get 403 and change nothing; each uid's
live workloads are capped below the node's cap, so one user's junk leaves room for everyone else's jobs.

The senders are real processes of real, unprivileged users that the test creates (so it runs as root, and is
skipped otherwise), talking to a real daemon over its real Unix socket."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from conftest import free_port, live_server, quick_config, samples, series, value, wait_for
from goodput_client.contract import capture_event

from exporter.sources.ingest.app import create_ingest_app
from exporter.sources.ingest.models import EventBatch
from exporter.sources.ingest.peer import PeerCredProtocol, Sender, cgroup_owner
from exporter.sources.ingest.state import IngestState, Rejected
from exporter.sources.nvml.simulated import SimulatedGpus

User = tuple[int, int]  # uid, gid

# Run as root by the test's own interpreter, which drops to the user before it connects: everything it needs is
# imported first (the interpreter's files may lie where the user cannot read, e.g. under /root).
SENDER = textwrap.dedent("""
    import http.client, json, os, socket, sys
    path, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    requests = json.load(sys.stdin)
    os.setgroups([]); os.setgid(gid); os.setuid(uid)

    class UnixConnection(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(path)

    answers = []
    for query, body in requests:
        connection = UnixConnection("goodput", timeout=20)
        connection.request("POST", "/v1/events" + query, body=json.dumps(body),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        answers.append([response.status, json.loads(response.read())])
        connection.close()
    json.dump({"uid": os.getuid(), "answers": answers}, sys.stdout)
""")


@pytest.fixture
def local_users() -> Iterator[Callable[[], User]]:
    """Makes unprivileged users (useradd --system, no home); all are deleted at the end."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test creates unprivileged users and sends events as them")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("needs useradd and userdel (Debian's passwd package) to create the senders' users")
    made: list[str] = []

    def make() -> User:
        name = f"gp-test-{secrets.token_hex(4)}"
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                       check=True, capture_output=True)
        made.append(name)
        entry = pwd.getpwnam(name)
        return entry.pw_uid, entry.pw_gid

    yield make
    for name in made:
        subprocess.run(["userdel", name], capture_output=True)


def send_as(user: User, path: str, requests: list[tuple[str, dict]]) -> list[tuple[int, dict]]:
    """POST each (query string, body) to the events socket at `path` from a process of `user`, one connection
    each; their (status, body) answers."""
    result = subprocess.run([sys.executable, "-c", SENDER, path, str(user[0]), str(user[1])],
                            input=json.dumps(requests), capture_output=True, text=True, timeout=60, cwd="/")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["uid"] == user[0]  # it really was that user on the other end
    return [(status, body) for status, body in out["answers"]]


def reachable(path: str) -> str:
    """The socket is 0666; its folder (a 0700 mkdtemp) must let other users through."""
    os.chmod(os.path.dirname(path), 0o711)
    return path


def uds_client(path: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://goodput", timeout=10)


def step(workload: str, rank: int = 0, duration: float = 0.5, tokens: int = 4096) -> dict:
    return {"type": "step", "workload": workload, "rank": rank, "duration_seconds": duration, "tokens": tokens,
            "samples": 8}


def phase(workload: str, name: str, seconds: float, rank: int = 0) -> dict:
    return {"type": "phase", "workload": workload, "rank": rank, "phase": name, "seconds": seconds}


def series_of(text: str, workload: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of `workload` but the step-time medians, which move with the wall clock."""
    return {key: v for key, v in samples(text).items()
            if ("workload", workload) in key[1] and not (key[0] == "goodput_step_time_seconds"
                                                         and ("window", "last") not in key[1])}


def accepted_total(text: str) -> float:
    return sum(v for (name, _), v in samples(text).items() if name == "goodput_ingest_events_accepted_total")


def test_another_user_cannot_write_a_job_it_does_not_own(local_users: Callable[[], User]) -> None:
    victim, intruder = local_users(), local_users()
    config = quick_config()
    path = reachable(config.ingest.socket_path)
    with live_server(config, backend=SimulatedGpus(1)) as live:
        job = [step("victim-job", 0, duration=4.4, tokens=4096), phase("victim-job", "compute", 4.4)]
        assert [s for s, _ in send_as(victim, path, [("", {"events": job})])] == [200]
        before_text = live.metrics_when("goodput_steps_total", 1, workload="victim-job", rank="0")
        before = series_of(before_text, "victim-job")
        assert before[("goodput_phase_seconds_total", frozenset(
            {("workload", "victim-job"), ("rank", "0"), ("phase", "compute")}))] == pytest.approx(4.4)

        forged = [
            ("", {"events": [phase("victim-job", "compute", 86_400.0)] * 100}),  # 4.4 s of compute -> 8,640,004.4
            ("", {"events": [step("victim-job", 0, tokens=10**12)] * 100}),  # 10^14 tokens
            ("", {"events": [{"type": "lifecycle", "workload": "victim-job", "rank": 0, "event": "end"}]}),
            ("", {"events": [step("intruder-job", 0), step("victim-job", 1)]}),  # all or nothing: no new job either
            ("", {"events": [capture_event("victim-job", 0, "c1", "profile", "written", path="x", size=1)]}),
            ("?workload=victim-job&rank=0", {"events": []}),  # a poll would take the victim's capture requests
        ]
        answers = send_as(intruder, path, forged)
        assert [s for s, _ in answers] == [403] * len(forged), answers
        assert all("'victim-job'" in body["error"] and f"uid {victim[0]}" in body["error"] for _, body in answers)

        after_text = live.metrics_when("goodput_ingest_rejected_requests_total", len(forged), reason="not_owner")
        assert series_of(after_text, "victim-job") == before
        assert accepted_total(after_text) == accepted_total(before_text)
        assert value(after_text, "goodput_steps_total", workload="intruder-job", rank="0") is None

        # the intruder's own job works
        assert [s for s, _ in send_as(intruder, path, [("", {"events": [step("intruder-job", 0, tokens=7)]})])] \
            == [200]
        live.metrics_when("goodput_tokens_total", 7, workload="intruder-job", rank="0")

        # 100 junk workloads: the intruder's uid reaches its own cap, far below the node's
        junk = send_as(intruder, path, [("", {"events": [step(f"junk-{i}", 0)]}) for i in range(100)])
        per_uid = live.daemon.runners["ingest"].source.state.max_workloads_per_uid
        assert per_uid < config.ingest.max_workloads
        assert Counter(s for s, _ in junk) == {200: per_uid - 1, 429: 100 - (per_uid - 1)}
        assert all("max_workloads_per_uid" in body["error"] for s, body in junk if s == 429)
        # a legitimate new job of another user, and one of root, still get in
        assert [s for s, _ in send_as(victim, path, [("", {"events": [step("victim-job-2", 0)]})])] == [200]
        with uds_client(path) as client:
            assert client.post("/v1/events", json={"events": [step("root-job", 0)]}).status_code == 200
        text = live.metrics_when("goodput_steps_total", 1, workload="root-job", rank="0")
        assert value(text, "goodput_ingest_rejected_requests_total", reason="uid_cap") == 100 - (per_uid - 1)
        workloads = {s["workload"] for s in series(text, "goodput_steps_total")}
        assert {"victim-job", "victim-job-2", "root-job", "intruder-job"} <= workloads
        assert len(workloads) == 4 + per_uid - 1
        assert value(text, "goodput_ingest_rejected_requests_total", reason="workload_cap") == 0


def test_ownership_ends_with_the_workloads_series(local_users: Callable[[], User]) -> None:
    """Once a workload's last rank expires and its series go, another user may start a workload of that name."""
    first, second = local_users(), local_users()
    config = quick_config(ingest={"idle_timeout": "1s"})
    path = reachable(config.ingest.socket_path)
    with live_server(config, backend=SimulatedGpus(1)) as live:
        assert send_as(first, path, [("", {"events": [step("shared-name", 0)]})])[0][0] == 200
        live.metrics_when("goodput_steps_total", 1, workload="shared-name", rank="0")
        assert send_as(second, path, [("", {"events": [step("shared-name", 0)]})])[0][0] == 403
        wait_for(lambda: value(live.metrics(), "goodput_steps_total", workload="shared-name", rank="0") is None)
        status, body = send_as(second, path, [("", {"events": [step("shared-name", 0, tokens=3)]})])[0]
        assert status == 200, body
        assert send_as(first, path, [("", {"events": [step("shared-name", 0)]})])[0][0] == 403  # the new owner's now


def test_tcp_senders_are_one_owner_without_trust(local_users: Callable[[], User]) -> None:
    """Loopback TCP has no peer credentials: its senders together are one owner, never trusted, capped like a uid."""
    user = local_users()
    config = quick_config(ingest={"listen_address": f"127.0.0.1:{free_port()}"})
    path = reachable(config.ingest.socket_path)
    with live_server(config, backend=SimulatedGpus(1)) as live, \
            httpx.Client(base_url=f"http://{config.ingest.listen_address}", timeout=10) as tcp, \
            uds_client(path) as root:
        assert send_as(user, path, [("", {"events": [step("unix-job", 0)]})])[0][0] == 200
        response = tcp.post("/v1/events", json={"events": [step("unix-job", 0)]})
        assert response.status_code == 403 and "TCP" in response.json()["error"]
        assert tcp.post("/v1/events", json={"events": [step("tcp-job", 0)]}).status_code == 200
        assert send_as(user, path, [("", {"events": [step("tcp-job", 0)]})])[0][0] == 403
        assert root.post("/v1/events", json={"events": [step("tcp-job", 1)]}).status_code == 200  # root may
        statuses = Counter(tcp.post("/v1/events", json={"events": [step(f"tcp-junk-{i}", 0)]}).status_code
                           for i in range(20))
        per_uid = live.daemon.runners["ingest"].source.state.max_workloads_per_uid
        assert statuses == {200: per_uid - 1, 429: 20 - (per_uid - 1)}
        live.metrics_when("goodput_ingest_rejected_requests_total", 2, reason="not_owner")


@contextmanager
def events_server(state: IngestState, path: str) -> Iterator[None]:
    """The events app on a real uvicorn server with the daemon's protocol, over a Unix socket (0666, as the
    daemon's)."""
    server = uvicorn.Server(uvicorn.Config(create_ingest_app(state, None, 2**20, 1000), uds=path,
                                           http=PeerCredProtocol, lifespan="off", log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=10)
        os.chmod(path, 0o666)
        yield
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_trusted_uid_may_write_any_workload_beyond_the_per_uid_caps(local_users: Callable[[], User]) -> None:
    owner, relay = local_users(), local_users()
    state = IngestState(32, 512, 600, trusted_uids={relay[0]}, max_workloads_per_uid=2)
    path = reachable(os.path.join(tempfile.mkdtemp(prefix="gp-"), "events.sock"))
    with events_server(state, path):
        assert send_as(owner, path, [("", {"events": [step("owned", 0)]})])[0][0] == 200
        answers = send_as(relay, path, [("", {"events": [step("owned", 1)]})]
                          + [("", {"events": [step(f"relayed-{i}", 0)]}) for i in range(5)])
        assert [s for s, _ in answers] == [200] * 6  # another's workload, and past max_workloads_per_uid
        # what the relay started is the relay's: the owner of "owned" may not write them
        assert send_as(owner, path, [("", {"events": [step("relayed-0", 1)]})])[0][0] == 403
    assert state.rejected["not_owner"] == 1 and state.rejected["uid_cap"] == 0


CGROUPS = [
    # cgroup v2, kubelet with the systemd driver (pod UID with underscores)
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6b2a9a0e_3c1f_4d2e_9a8b_0c1d2e3f4a5b.slice/"
     "cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n",
     "pod 6b2a9a0e-3c1f-4d2e-9a8b-0c1d2e3f4a5b"),
    # cgroup v1, kubelet with the cgroupfs driver
    ("12:memory:/kubepods/besteffort/pod6b2a9a0e-3c1f-4d2e-9a8b-0c1d2e3f4a5b/0123456789abcdef\n"
     "11:cpu,cpuacct:/kubepods/besteffort/pod6b2a9a0e-3c1f-4d2e-9a8b-0c1d2e3f4a5b/0123456789abcdef\n",
     "pod 6b2a9a0e-3c1f-4d2e-9a8b-0c1d2e3f4a5b"),
    ("0::/system.slice/slurmstepd.scope/job_9001/step_0/user/task_2\n", "slurm job 9001"),
    ("4:memory:/slurm/uid_1000/job_77/step_batch/task_0\n", "slurm job 77"),
    ("0::/system.slice/docker-" + "ab" * 32 + ".scope\n", "container " + "ab" * 6),
    ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
    ("0::/\n", None),
]


@pytest.mark.parametrize(("text", "expected"), CGROUPS, ids=[str(c[1]) for c in CGROUPS])
def test_the_cgroup_names_the_pod_job_or_container(text: str, expected: str | None) -> None:
    assert cgroup_owner(text) == expected


def test_this_process_is_seen_as_itself() -> None:
    """Over a real Unix socket: the uid, PID and cgroup the daemon reads for a sender are the sender's own."""
    path = os.path.join(tempfile.mkdtemp(prefix="gp-"), "events.sock")
    seen: list[Sender] = []

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] == "http":
            seen.append(scope["state"]["sender"])
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    server = uvicorn.Server(uvicorn.Config(app, uds=path, http=PeerCredProtocol, lifespan="off", log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=10)
        with uds_client(path) as client:
            assert client.get("/").status_code == 204
    finally:
        server.should_exit = True
        thread.join(10)
    expected = cgroup_owner(Path("/proc/self/cgroup").read_text())
    assert seen == [Sender(os.getuid(), os.getpid(), expected)]


def test_a_pod_or_job_owns_its_workload_when_known() -> None:
    """Two senders of one uid in different pods (or Slurm jobs): the second is refused, unless ingest.owner_by_cgroup
    is off; where either's cgroup is unknown, the uid decides."""
    events = EventBatch.model_validate({"events": [step("job", 0)]}).events
    pod_a, pod_b, unknown = Sender(1000, 11, "pod a"), Sender(1000, 12, "pod b"), Sender(1000, 13, None)
    strict = IngestState(32, 512, 600)
    strict.apply(events, sender=pod_a)
    with pytest.raises(Rejected) as refused:
        strict.apply(events, sender=pod_b)
    assert refused.value.status == 403 and "pod a" in str(refused.value)
    strict.apply(events, sender=unknown)
    loose = IngestState(32, 512, 600, owner_by_cgroup=False)
    loose.apply(events, sender=pod_a)
    loose.apply(events, sender=pod_b)
    with pytest.raises(Rejected):
        loose.apply(events, sender=Sender(1001, 14, "pod a"))  # the uid is never waived
    assert strict.rejected["not_owner"] == 1 and loose.rejected["not_owner"] == 1
