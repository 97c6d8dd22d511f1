"""The kubelet source: which pod and container each GPU is assigned to, from the pod-resources API.

Asked on its own interval in the background, never on a scrape. Each answer replaces the whole
mapping, so a pod that is gone from the kubelet's answer is gone from /metrics at the next refresh.
A failed call (socket missing, kubelet down or slow, an answer that does not decode) marks the
source down and withdraws its series, like any source: an old mapping is never shown as current.

With kubelet.pod_labels set, the listed pod labels are added to goodput_gpu_pod_info from the
Kubernetes API server, asked on a thread of its own (attribution/podlabels.py): the API server being
slow, down or refusing costs the labels (counted as pod_labels_<reason> errors of this source), never
the mapping itself, and never a scrape.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from fnmatch import fnmatchcase

from ...core.exposition import Batch
from ...core.gpus import NodeGpus
from ..base import Source, SourceError
from . import metrics as c
from .devices import GpuMatcher, Match
from .podlabels import PodLabeler, PodLabelsClient, in_cluster_url, prometheus_label
from .podresources import DRA, Assignment, PodResourcesClient, PodResourcesError
from .settings import KubeletConfig, gpu_resource_patterns, pod_label_names

log = logging.getLogger(__name__)

GRPC_SHARE_OF_TIMEOUT = 0.8  # the call gives up before the runner does, so its reason is the real one
MISSING_HINT = ("mount the kubelet's /var/lib/kubelet/pod-resources into the exporter's pod, or set "
                "kubelet.enabled=false off Kubernetes")


class KubeletSource(Source):
    name = "kubelet"

    def __init__(self, config: KubeletConfig, table: NodeGpus) -> None:
        self.table = table
        self.patterns = gpu_resource_patterns(config.gpu_resources)
        self.client = PodResourcesClient(config.socket_path, deadline=config.timeout * GRPC_SHARE_OF_TIMEOUT,
                                         reconnect_seconds=config.interval)
        self._unmatched_logged: set[str] = set()
        wanted = pod_label_names(config.pod_labels)
        self.pod_info = c.GPU_POD_INFO
        self.labeler: PodLabeler | None = None
        if wanted:
            # the same metric with one label_<name> per wanted label, fixed for the life of the process
            self.pod_info = dataclasses.replace(
                c.GPU_POD_INFO, labels=(*c.GPU_POD_INFO.labels, *(prometheus_label(n) for n in wanted)))
            url = config.api_url or in_cluster_url(os.environ) or ""
            client = PodLabelsClient(url, config.node_name, wanted, config.api_token_file, config.api_ca_file,
                                     timeout=config.timeout, max_bytes=config.api_max_bytes)
            self.labeler = PodLabeler(client, config.interval).start()

    def is_gpu_resource(self, resource: str) -> bool:
        return any(fnmatchcase(resource, pattern) for pattern in self.patterns)

    def collect(self) -> Batch:
        try:
            assignments, invalid = self.client.list(self.is_gpu_resource)
        except PodResourcesError as exc:
            hint = f"; {MISSING_HINT}" if exc.reason == "socket_missing" else ""
            raise SourceError(exc.reason, f"kubelet pod-resources: {exc}{hint}") from None
        matcher = GpuMatcher(self.table.gpus())
        batch = Batch()
        rows: set[tuple[str, ...]] = set()
        unmatched: list[str] = []
        labels: dict[tuple[str, str], tuple[str, ...]] | None = None
        no_labels: tuple[str, ...] = ()
        if self.labeler is not None:
            labels, batch.errors = self.labeler.current()
            no_labels = ("",) * (len(self.pod_info.labels) - len(c.GPU_POD_INFO.labels))
            batch.add(c.KUBELET_POD_LABELS_UP, (), 0 if labels is None else 1)
        for item in assignments:
            found = _match(matcher, item)
            if found is None:
                unmatched.append(_describe(item))
                continue
            extra = labels.get((item.namespace, item.pod), no_labels) if labels is not None else no_labels
            rows.add((found.gpu.gpu, found.gpu.uuid, found.mig_uuid, item.pod, item.namespace, item.container,
                      *extra))
        for row in sorted(rows, key=lambda r: (int(r[0]) if r[0].isdigit() else 0, r)):
            batch.add(self.pod_info, row, 1)
        fresh = set(unmatched) - self._unmatched_logged
        if fresh and len(matcher):
            log.warning("kubelet: devices that name no GPU on this node: %s", ", ".join(sorted(fresh)[:10]))
        self._unmatched_logged = set(unmatched) if len(matcher) else set()
        batch.add(c.KUBELET_SKIPPED, ("unmatched",), len(unmatched))
        batch.add(c.KUBELET_SKIPPED, ("invalid",), invalid)
        return batch

    def close(self) -> None:
        if self.labeler is not None:
            self.labeler.close()
        self.client.close()


def _match(matcher: GpuMatcher, item: Assignment) -> Match | None:
    if item.resource != DRA:
        return matcher.match(item.device_id)
    found = matcher.match_dra(item.driver, item.device) if item.device else None
    for name in item.cdi_names:
        if found is not None:
            break
        found = matcher.match(name)
    return found


def _describe(item: Assignment) -> str:
    if item.resource == DRA:
        return f"dra:{item.driver}/{item.device}" if item.device else f"dra:{item.device_id}"
    return item.device_id
