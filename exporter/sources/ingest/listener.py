"""The events server: its own uvicorn instance, on a Unix socket and optionally loopback TCP."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

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

    def start(self) -> None:
        """Open the sockets and serve; raises OSError (with the path) when a socket cannot be opened."""
        try:
            self._sockets.append(unix_socket(self.config.socket_path))
        except OSError as exc:
            raise OSError(f"cannot open the events socket {self.config.socket_path}: {exc}") from None
        if self.config.listen_address:
            self._sockets.append(bind(self.config.listen_address))
        app = create_ingest_app(self.state, self.token, self.config.max_body_bytes,
                                self.config.max_batch_events, self.captures)
        self._server = ServerThread(app, self._sockets, "ingest-http", http=PeerCredProtocol)
        self._server.start()
        log.info("ingest: accepting events on unix:%s%s", self.config.socket_path,
                 f" and http://{self.config.listen_address}" if self.config.listen_address else "")

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        for sock in self._sockets:
            sock.close()
        if self._sockets:
            Path(self.config.socket_path).unlink(missing_ok=True)
