"""The `flight` source: collectives, from PyTorch flight-recorder dumps."""

from __future__ import annotations

from typing import Any

from ..base import Node, Source, SourceSpec
from .metrics import METRICS
from .settings import FlightConfig


def _build(node: Node, settings: Any) -> Source:
    from .source import FlightSource

    source = FlightSource(settings)
    source.on_trouble = node.captures
    source.rank_ends = node.rank_ends
    return source


SPEC = SourceSpec("flight", "Collectives (source `flight`, from PyTorch flight-recorder dumps)", FlightConfig,
                  METRICS, _build, chart_managed=frozenset({"enabled", "dir"}))
