"""The ingest source: publishes what training jobs reported, on its interval like any other source, and owns
the events server they report to."""

from __future__ import annotations

import logging
from functools import partial

from ...core.exposition import Batch
from ..base import Source, SourceError
from .captures import Captures
from .changepoint import StepTimeDetector
from .listener import IngestServer
from .publish import publish_client
from .settings import IngestConfig
from .state import IngestState
from .statefile import StateFile

log = logging.getLogger(__name__)


class IngestSource(Source):
    name = "ingest"

    def __init__(self, state: IngestState, server: IngestServer | None = None,
                 captures: Captures | None = None) -> None:
        self.state = state
        self.server = server
        self.captures = captures  # None: ingest.capture_dir is empty, captures are off
        self.listen_error: str | None = None  # set when the events socket could not be opened
        self.client_dir = ""  # ingest.client_dir: where the training client is published at start

    @classmethod
    def from_settings(cls, settings: IngestConfig) -> IngestSource:
        """The state and its server; reading the token file may raise ConfigError, before anything binds."""
        if not settings.state_dir:
            log.info("ingest: no state_dir; restart accounting lasts as long as this daemon")
        state = IngestState(settings.max_workloads, settings.max_ranks, settings.idle_timeout,
                            max_models=settings.max_models, step_history=settings.step_history,
                            restart_window=settings.restart_window,
                            state_file=StateFile(settings.state_dir) if settings.state_dir else None,
                            detector=partial(StepTimeDetector, threshold=settings.shift_threshold,
                                             min_ratio=settings.shift_min_ratio, warmup=settings.shift_warmup),
                            trusted_uids={int(uid) for uid in settings.trusted_uids},
                            owner_by_cgroup=settings.owner_by_cgroup,
                            max_workloads_per_uid=settings.max_workloads_per_uid,
                            max_ranks_per_uid=settings.max_ranks_per_uid,
                            max_models_per_uid=settings.max_models_per_uid)
        captures = Captures.from_settings(settings) if settings.capture_dir else None
        if captures is not None and not settings.capture_workloads:
            log.warning("ingest: capture_dir is set but capture_workloads names no workload; nothing is captured")
        source = cls(state, IngestServer(settings, state, captures), captures)
        source.client_dir = settings.client_dir
        return source

    def start(self) -> None:
        if self.client_dir:
            try:
                publish_client(self.client_dir)
            except OSError as exc:  # the events API still serves; jobs that opted in run uninstrumented
                log.error("ingest: the training client could not be published in %s: %s", self.client_dir, exc)
        if self.server is None:
            return
        try:
            self.server.start()
        except OSError as exc:  # metrics keep being served; collect() reports why this source is down
            log.error("ingest: %s; training jobs cannot report to this node", exc)
            self.listen_error = str(exc)

    def not_ready(self) -> str | None:
        """Why training jobs cannot yet report everywhere they should (None: they can): the events server still
        tries to bind ingest.listen_address."""
        return self.server.not_ready() if self.server is not None else None

    def collect(self) -> Batch:
        if self.listen_error is not None:
            raise SourceError("listen_failed", self.listen_error)
        batch = self.state.snapshot()  # saves the state file first: a counter seen is a counter kept
        if self.captures is not None:
            self.captures.expire()
            self.captures.prune()
            self.captures.render(batch)
        return batch

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.state.save(whole=True)  # after the server: nothing it accepted is left out
        if self.captures is not None:
            self.captures.close()
        if self.state.state_file is not None:
            self.state.state_file.close()
