"""Listening sockets, opened before any server starts so that errors name the address."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

from .config import parse_listen_address


def bind(address: str) -> socket.socket:
    host, port = parse_listen_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {address}: {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def unix_socket(path: str) -> socket.socket:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() or target.is_symlink():
        if not stat.S_ISSOCK(target.lstat().st_mode):
            raise OSError(f"{path} exists and is not a socket; not replacing it")
        target.unlink()  # left behind by an earlier run
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o666)  # jobs run as any user; use ingest.token_file to restrict who may write
    sock.listen(512)
    return sock
