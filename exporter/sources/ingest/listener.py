"""The events server: its own uvicorn instance, on a Unix socket and optionally loopback TCP.

The Unix socket is opened first: a socket file that a running process still serves (another daemon) is never
replaced (SocketInUse, which ends the daemon), and one that cannot be opened raises OSError (the source reports
it). A TCP address that cannot be bound (the port is taken) does not hold the Unix socket back: it is served at
once, the address is tried again with backoff until it binds, and meanwhile `not_ready()` names it (/readyz 503).
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from ...core.connections import ServerLimits
from ...core.http import ServerThread, bind, unix_socket
from ...core.settings import ConfigError
from .app import create_ingest_app
from .captures import Captures
from .peer import PeerCredProtocol
from .settings import IngestConfig
from .state import IngestState

log = logging.getLogger(__name__)


def read_token(path: str) -> str | None:
    if not path:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"ingest.token_file: cannot read {path}: {exc.strerror}") from None
    if not token:
        raise ConfigError(f"ingest.token_file: {path} is empty")
    return token


class IngestServer:
    def __init__(self, config: IngestConfig, state: IngestState, captures: Captures | None = None) -> None:
        self.config = config
        self.state = state
        self.captures = captures
        self.token = read_token(config.token_file)
        self._server: ServerThread | None = None
        self._sockets: list[socket.socket] = []
        self._socket_file: tuple[int, int, int] | None = None  # device, inode, ctime of the socket file it made

    def start(self) -> None:
        """Open the sockets and serve. Raises SocketInUse when a running process serves the socket path, OSError
        (with the path) when the Unix socket cannot be opened; a TCP address that cannot be bound is retried."""
        path = self.config.socket_path
        try:
            unix = unix_socket(path)
        except OSError as exc:
            raise OSError(f"cannot open the events socket {path}: {exc}") from None
        self._sockets.append(unix)
        try:
            made = os.stat(path)
            self._socket_file = (made.st_dev, made.st_ino, made.st_ctime_ns)
        except OSError:
            pass
        pending: dict[str, str] = {}
        address = self.config.listen_address
        if address:
            try:
                self._sockets.append(bind(address))
            except OSError as exc:
                retry = min(1.0, self.config.listen_retry_interval)
                pending[address] = f"{exc}; next try in {retry:g}s"
                log.warning("ingest: %s; events are accepted on unix:%s meanwhile, and %s is tried again until it "
                            "binds", exc, path, address)
        try:
            app = create_ingest_app(self.state, self.token, self.config.max_body_bytes,
                                    self.config.max_batch_events, self.captures)
            self._server = ServerThread(app, self._sockets, "events", ServerLimits.of(self.config),
                                        http=PeerCredProtocol, pending=pending,
                                        retry_max=self.config.listen_retry_interval)
            self._server.start()
        except BaseException:  # nothing stays bound with nobody serving it
            self._server = None
            self.stop()
            raise
        log.info("ingest: accepting events on unix:%s%s", path,
                 f" and http://{address}" if address and not pending else "")

    def not_ready(self) -> str | None:
        """Why the events server does not listen everywhere it should (None: it does)."""
        waiting = self._server.not_listening if self._server is not None else {}
        if not waiting:
            return None
        return "; ".join(waiting.values())  # each names its address: "cannot listen on HOST:PORT: ..."

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        for sock in self._sockets:
            sock.close()
        if self._socket_file is not None:
            self._unlink_own_socket()

    def _unlink_own_socket(self) -> None:
        """Remove the socket file, unless it is no longer the one this server made."""
        path = self.config.socket_path
        try:
            now = os.stat(path)
        except OSError:
            return
        if (now.st_dev, now.st_ino, now.st_ctime_ns) == self._socket_file:
            Path(path).unlink(missing_ok=True)
        else:
            log.warning("ingest: %s is no longer this daemon's socket; left in place", path)
