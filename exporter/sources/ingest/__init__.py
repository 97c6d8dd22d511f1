"""The `ingest` source: step, phase and lifecycle events that training jobs send to `POST /v1/events`."""

from __future__ import annotations

from typing import Any

from ..base import Node, Source, SourceSpec
from .metrics import METRICS
from .settings import IngestConfig

CAPTURE_BOOST_SECONDS = 120.0  # about as long as a capture's profiled steps and dumps take


def _build(node: Node, settings: Any) -> Source:
    from .source import IngestSource

    source = IngestSource.from_settings(settings)
    node.declarations = source.state.declared  # which process reported what: for the process source
    node.rank_ends = source.state.rank_ends  # which ranks' processes ended: for the flight source
    captures = source.captures
    if captures is not None:  # ingest.capture_dir is set: the flight source's hangs and missing ranks ask too
        def ask(workload: str, ranks: list[str], trigger: str, detail: str) -> str | None:
            capture_id = captures.trigger(workload, ranks, trigger, detail)
            if capture_id is not None and node.boost is not None:
                node.boost(CAPTURE_BOOST_SECONDS)  # adaptive sources sample at their fastest while it runs
            return capture_id

        node.captures = ask

        def on_shift(workload: str, rank: str, direction: int, ranks: list[str]) -> None:
            # slower: a new straggler, or the job's share of a regression. Every rank of the workload on this node
            # is captured, so that the trace of the shifted rank comes with its peers' to compare against
            if direction > 0:
                ask(workload, ranks, "step_time_shift", f"rank {rank}'s step time shifted up")

        source.state.on_shift = on_shift
    return source


SPEC = SourceSpec("ingest", "Training jobs (source `ingest`, from `POST /v1/events`)", IngestConfig, METRICS,
                  _build, chart_managed=frozenset({"enabled", "socket_path", "state_dir", "capture_dir",
                                                            "client_dir"}))
