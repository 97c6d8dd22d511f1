"""The `kubelet` source: which pod and container each GPU is assigned to (pod-resources API), and pod labels."""

from __future__ import annotations

from typing import Any

from ..base import Node, Source, SourceSpec
from .metrics import METRICS
from .settings import KubeletConfig


def _build(node: Node, settings: Any) -> Source:
    # imported here: grpc and protobuf cost about 15 MB and 40 ms, and the source is off by default
    from .source import KubeletSource

    return KubeletSource(settings, node.gpus)


SPEC = SourceSpec("kubelet", "Pods (source `kubelet`, from the kubelet pod-resources API)", KubeletConfig, METRICS,
                  _build, chart_managed=frozenset({"enabled", "socket_path", "node_name", "pod_labels"}))
