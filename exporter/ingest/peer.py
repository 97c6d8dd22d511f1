"""Who is on the other end of the events socket: the sender's PID, from the kernel (SO_PEERCRED).

A training process that reports over the Unix socket thereby declares which workload and rank *it*
is; the kernel names the process, so nothing in the request can claim another one. The PID is
translated into the daemon's PID namespace: with hostPID it is the host PID that NVML reports, and
it is 0 for a sender in a namespace the daemon cannot see. TCP senders (ingest.listen_address) have
no peer PID.

uvicorn has no hook for this: the protocol below reads the credential when a connection is made and
puts it into each request's ASGI scope["state"]["peer_pid"].
"""

from __future__ import annotations

import asyncio
import socket
import struct
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
