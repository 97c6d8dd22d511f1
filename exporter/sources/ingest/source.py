"""The ingest source: publishes what training jobs reported, on its interval like any other source, and owns
the events server they report to."""

from __future__ import annotations

import logging

from ...core.exposition import Batch
from ..base import Source, SourceError
from .listener import IngestServer
from .settings import IngestConfig
from .state import IngestState
from .statefile import StateFile

log = logging.getLogger(__name__)


class IngestSource(Source):
    name = "ingest"

    def __init__(self, state: IngestState, server: IngestServer | None = None) -> None:
        self.state = state
        self.server = server
        self.listen_error: str | None = None  # set when the events socket could not be opened

    @classmethod
    def from_settings(cls, settings: IngestConfig) -> IngestSource:
        """The state and its server; reading the token file may raise ConfigError, before anything binds."""
        if not settings.state_dir:
            log.info("ingest: no state_dir; restart accounting lasts as long as this daemon")
        state = IngestState(settings.max_workloads, settings.max_ranks, settings.idle_timeout,
                            max_models=settings.max_models, step_history=settings.step_history,
                            restart_window=settings.restart_window,
                            state_file=StateFile(settings.state_dir) if settings.state_dir else None)
        return cls(state, IngestServer(settings, state))

    def start(self) -> None:
        if self.server is None:
            return
        try:
            self.server.start()
        except OSError as exc:  # metrics keep being served; collect() reports why this source is down
            log.error("ingest: %s; training jobs cannot report to this node", exc)
            self.listen_error = str(exc)

    def collect(self) -> Batch:
        if self.listen_error is not None:
            raise SourceError("listen_failed", self.listen_error)
        batch = self.state.snapshot()
        self.state.save()  # before the batch is published: a counter seen is a counter kept
        return batch

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.state.save()  # after the server: nothing it accepted is left out
