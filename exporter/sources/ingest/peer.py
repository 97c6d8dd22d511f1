"""Who is on the other end of the events socket: the sender's PID and uid, from the kernel (SO_PEERCRED), and
the pod, Slurm job or container its cgroup names.

A training process that reports over the Unix socket thereby declares which workload and rank *it*
is; the kernel names the process, so nothing in the request can claim another one. The PID is
translated into the daemon's PID namespace: with hostPID it is the host PID that NVML reports, and
it is 0 for a sender in a namespace the daemon cannot see. The uid is translated into the daemon's user
namespace. TCP senders (ingest.listen_address) have no peer credentials at all.

The uid (and the pod, Slurm job or container, where the daemon can read the sender's /proc/PID/cgroup) is what
owns a workload: see `Sender`, `IngestState` and the README's Security section.

uvicorn has no hook for this: the protocol below reads the credentials when a connection is made and
puts them into each request's ASGI scope["state"] ("peer_pid", and "sender", a `Sender`). It overrides two
methods of uvicorn's httptools protocol (an internal class), which is why pyproject.toml pins uvicorn to the
releases it was verified on.

The PID is only worth binding to NVML's PIDs when the daemon's PID namespace is the host's (hostPID):
`pid_namespace_is_hosts` says whether it is; the process source ignores declarations otherwise. A PID
is also reused after its process exits, so a declaration is kept with the process's start time
(`start_time`) and checked against it when used.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
ROOT_UID = 0

# a pod's UID in the kubelet's cgroup names: .../kubepods/burstable/pod<uid>/... (cgroupfs driver) or
# .../kubepods-burstable-pod<uid with _ for ->.slice/... (systemd driver); a static pod's is a 32-digit hash
_POD = re.compile(r"pod([0-9a-f]{8}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{12})(?![0-9a-f])")
_SLURM_JOB = re.compile(r"/job_(\d+)(?:/|$)")  # slurmstepd: .../job_<id>/step_<n>/...
# a container outside Kubernetes: /docker/<id>, docker-<id>.scope, cri-containerd-<id>.scope, crio-<id>, libpod-<id>
_CONTAINER = re.compile(r"(?:docker|containerd|crio|libpod)[-/]([0-9a-f]{64})(?![0-9a-f])")


@dataclass(frozen=True, slots=True)
class Sender:
    """Who sent a request: its `uid` as the kernel names it (None: no credentials, a TCP sender), its PID, and
    the pod, Slurm job or container its cgroup names ("pod <uid>", "slurm job <id>", "container <id>"; None
    where the daemon cannot read it: a sender in a PID namespace the daemon does not see, or none of them)."""

    uid: int | None
    pid: int | None = None
    cgroup: str | None = None

    def same_owner(self, other: Sender, by_cgroup: bool) -> bool:
        """Whether `other` is the same owner as this sender: the same uid (no credentials is one owner of its
        own), and with `by_cgroup` the same pod, job or container where both are known."""
        if self.uid != other.uid:
            return False
        return not (by_cgroup and self.cgroup and other.cgroup and self.cgroup != other.cgroup)

    def __str__(self) -> str:
        if self.uid is None:
            return "a sender without credentials (TCP)"
        return f"uid {self.uid}" + (f" ({self.cgroup})" if self.cgroup else "")


NO_CREDENTIALS = Sender(uid=None)


def peer_credentials(sock: socket.socket | None) -> tuple[int, int] | None:
    """(PID, uid) of a Unix-socket peer as the kernel saw them at connect(), or None when unknown (not a Unix
    socket). The PID is 0 for a peer outside the daemon's PID namespace."""
    if sock is None or sock.family != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return None
    return pid, uid


def cgroup_owner(text: str) -> str | None:
    """The pod, Slurm job or container that /proc/PID/cgroup's `text` puts a process in, or None."""
    paths = [line.split(":", 2)[-1] for line in text.splitlines()]
    for path in paths:
        match = _POD.search(path) if "kubepods" in path else None
        if match is not None:
            return f"pod {match.group(1).replace('_', '-')}"
    for path in paths:
        match = _SLURM_JOB.search(path)
        if match is not None:
            return f"slurm job {match.group(1)}"
    for path in paths:
        match = _CONTAINER.search(path)
        if match is not None:
            return f"container {match.group(1)[:12]}"
    return None


def sender_of(sock: socket.socket | None, proc: Path) -> Sender:
    """The sender on the other end of `sock`, its cgroup read under `proc` (the daemon's own procfs, where the
    kernel's PIDs are)."""
    credentials = peer_credentials(sock)
    if credentials is None:
        return NO_CREDENTIALS
    pid, uid = credentials
    if pid <= 0:
        return Sender(uid)
    try:
        cgroup = cgroup_owner((proc / str(pid) / "cgroup").read_text(errors="replace"))
    except OSError:
        cgroup = None
    return Sender(uid, pid, cgroup)


def start_time(proc: Path, pid: int) -> int | None:
    """The start time of `pid` (clock ticks after boot, /proc/PID/stat field 22), or None when gone (a zombie, which
    has exited and waits for its parent to reap it, is gone)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # after the command name, which may hold spaces and ")"
    try:
        return None if fields[0] in ("Z", "X") else int(fields[19])  # fields[0] is field 3 (state)
    except (IndexError, ValueError):
        return None


def pid_namespace_is_hosts(proc_path: str) -> tuple[bool, str]:
    """Whether PIDs as the daemon sees them are the host's (those NVML reports), and how that was found.

    Compares /proc/self/ns/pid with <proc_path>/1/ns/pid (the host's init). Reading the latter needs
    ptrace access to init, which even root lacks without CAP_SYS_PTRACE; then the daemon is in the
    host's namespace when /proc/self/status NSpid has one entry (the initial PID namespace)."""
    try:
        ours = os.readlink("/proc/self/ns/pid")
    except OSError as exc:
        return False, f"/proc/self/ns/pid: {exc.strerror}"
    try:
        host = os.readlink(os.path.join(proc_path, "1", "ns", "pid"))
    except OSError:
        try:
            status = Path("/proc/self/status").read_text()
        except OSError as exc:
            return False, f"/proc/self/status: {exc.strerror}"
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                levels = len(line.split()) - 1
                return levels == 1, f"NSpid has {levels} level(s)"
        return False, "no NSpid in /proc/self/status"
    return ours == host, f"daemon {ours}, host {host}"


class PeerCredProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the peer's PID in scope["state"]["peer_pid"] and the whole `Sender` in
    scope["state"]["sender"] (NO_CREDENTIALS on TCP)."""

    proc = Path("/proc")
    _sender: Sender = NO_CREDENTIALS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._sender = sender_of(transport.get_extra_info("socket"), self.proc)
        super().connection_made(transport)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        state: dict[str, Any] = self.scope.setdefault("state", {})  # type: ignore[assignment]
        state["peer_pid"] = self._sender.pid
        state["sender"] = self._sender
