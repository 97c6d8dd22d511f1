"""The kubelet source: which pod and container each GPU is assigned to, from the pod-resources API.

Asked on its own interval in the background, never on a scrape. Each answer replaces the whole
mapping, so a pod that is gone from the kubelet's answer is gone from /metrics at the next refresh.
A failed call (socket missing, kubelet down or slow, an answer that does not decode) marks the
source down and withdraws its series, like any source: an old mapping is never shown as current.
"""

from __future__ import annotations

import logging

from .. import catalog as c
from ..attribution.devices import GpuMatcher
from ..attribution.kubelet import PodResourcesClient, PodResourcesError
from ..config import KubeletConfig
from ..exposition import Batch
from ..gpu_processes import GpuProcessTable
from .base import SourceError

log = logging.getLogger(__name__)

GRPC_SHARE_OF_TIMEOUT = 0.8  # the call gives up before the runner does, so its reason is the real one
MISSING_HINT = ("mount the kubelet's /var/lib/kubelet/pod-resources into the exporter's pod, or set "
                "kubelet.enabled=false off Kubernetes")


class KubeletSource:
    name = "kubelet"

    def __init__(self, config: KubeletConfig, processes: GpuProcessTable) -> None:
        self.processes = processes
        self.prefix = config.resource_prefix
        self.client = PodResourcesClient(config.socket_path, deadline=config.timeout * GRPC_SHARE_OF_TIMEOUT)
        self._unmatched_logged: set[str] = set()

    def collect(self) -> Batch:
        try:
            assignments, invalid = self.client.list()
        except PodResourcesError as exc:
            hint = f"; {MISSING_HINT}" if exc.reason == "socket_missing" else ""
            raise SourceError(exc.reason, f"kubelet pod-resources: {exc}{hint}") from None
        matcher = GpuMatcher(self.processes.gpus())
        batch = Batch()
        rows: set[tuple[str, str, str, str, str]] = set()
        unmatched: set[str] = set()
        for item in assignments:
            if item.resource == "dra":
                if not item.device_id.rpartition("=")[2].lower().startswith(("gpu-", "mig-")):
                    continue  # a DRA device that is not named by a GPU UUID: not ours to claim
            elif not item.resource.startswith(self.prefix):
                continue  # CPUs, NICs, other accelerators
            gpu = matcher.match(item.device_id)
            if gpu is None:
                unmatched.add(item.device_id)
                continue
            rows.add((gpu.gpu, gpu.uuid, item.pod, item.namespace, item.container))
        for row in sorted(rows, key=lambda r: (int(r[0]) if r[0].isdigit() else 0, r)):
            batch.add(c.GPU_POD_INFO, row, 1)
        fresh = unmatched - self._unmatched_logged
        if fresh and len(matcher):
            log.warning("kubelet: device ids that name no GPU on this node: %s", ", ".join(sorted(fresh)[:10]))
        self._unmatched_logged = unmatched if len(matcher) else set()
        batch.add(c.KUBELET_SKIPPED, ("unmatched",), len(unmatched))
        batch.add(c.KUBELET_SKIPPED, ("invalid",), invalid)
        return batch

    def close(self) -> None:
        self.client.close()
