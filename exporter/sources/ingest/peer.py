"""Who is on the other end of the events socket: the sender's PID, from the kernel (SO_PEERCRED).

A training process that reports over the Unix socket thereby declares which workload and rank *it*
is; the kernel names the process, so nothing in the request can claim another one. The PID is
translated into the daemon's PID namespace: with hostPID it is the host PID that NVML reports, and
it is 0 for a sender in a namespace the daemon cannot see. TCP senders (ingest.listen_address) have
no peer PID.

uvicorn has no hook for this: the protocol below reads the credential when a connection is made and
puts it into each request's ASGI scope["state"]["peer_pid"]. It overrides two methods of uvicorn's
httptools protocol (an internal class), which is why pyproject.toml pins uvicorn to the releases it
was verified on.

The PID is only worth binding to NVML's PIDs when the daemon's PID namespace is the host's (hostPID):
`pid_namespace_is_hosts` says whether it is; the process source ignores declarations otherwise. A PID
is also reused after its process exits, so a declaration is kept with the process's start time
(`start_time`) and checked against it when used.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from pathlib import Path
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_pid(sock: socket.socket | None) -> int | None:
    """The PID of a Unix-socket peer as the kernel saw it at connect(), or None when unknown."""
    if sock is None or sock.family != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        pid, _uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return None
    return pid if pid > 0 else None


def start_time(proc: Path, pid: int) -> int | None:
    """The start time of `pid` (clock ticks after boot, /proc/PID/stat field 22), or None when gone."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # after the command name, which may hold spaces and ")"
    try:
        return int(fields[19])  # fields[0] is field 3 (state)
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
    """uvicorn's httptools protocol, with the peer's PID in scope["state"]["peer_pid"]."""

    _peer_pid: int | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._peer_pid = peer_pid(transport.get_extra_info("socket"))
        super().connection_made(transport)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        state: dict[str, Any] = self.scope.setdefault("state", {})  # type: ignore[assignment]
        state["peer_pid"] = self._peer_pid
