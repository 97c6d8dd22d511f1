"""The `ingest` source: step, phase and lifecycle events that training jobs send to `POST /v1/events`."""

from __future__ import annotations

from typing import Any

from ..base import Node, Source, SourceSpec
from .metrics import METRICS
from .settings import IngestConfig


def _build(node: Node, settings: Any) -> Source:
    from .source import IngestSource

    source = IngestSource.from_settings(settings)
    node.declarations = source.state.declared  # which process reported what: for the process source
    return source


SPEC = SourceSpec("ingest", "Training jobs (source `ingest`, from `POST /v1/events`)", IngestConfig, METRICS,
                  _build, chart_managed=frozenset({"enabled", "socket_path", "state_dir"}))
