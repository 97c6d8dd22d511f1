"""A client of the kubelet pod-resources API (v1 List) on its Unix socket, and checks on its answer.

The answer is hostile input like any other: a reply that does not decode is rejected whole
(`malformed`); an entry with a missing or impossible pod, namespace or container name is skipped
and counted (`invalid_entry`); an answer with more than MAX_PODS pods is rejected (`oversize`).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
from dataclasses import dataclass

import grpc

from . import podresources_v1_pb2 as pb
from . import podresources_v1_pb2_grpc as pb_grpc

# grpc logs every answer it cannot decode, with a traceback, at ERROR; the source reports it instead
# (source_errors_total{reason="malformed"}, one log line per change of state)
logging.getLogger("grpc._common").setLevel(logging.CRITICAL)

MAX_PODS = 10_000
MAX_MESSAGE_BYTES = 16 * 2**20
# pod names are DNS subdomains (253), namespaces and container names DNS labels (63)
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
MAX_DEVICE_ID = 256


class PodResourcesError(Exception):
    """The List call failed; `reason` labels goodput_exporter_source_errors_total{source="kubelet"}."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class Assignment:
    """One device id that the kubelet assigned to one container."""

    pod: str
    namespace: str
    container: str
    resource: str
    device_id: str


_REASONS = {
    grpc.StatusCode.DEADLINE_EXCEEDED: "deadline_exceeded",
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.UNIMPLEMENTED: "unimplemented",
    grpc.StatusCode.PERMISSION_DENIED: "permission_denied",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "oversize",
}


class PodResourcesClient:
    def __init__(self, socket_path: str, deadline: float) -> None:
        self.socket_path = socket_path
        self.deadline = deadline
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.PodResourcesListerStub | None = None

    def _connect(self) -> pb_grpc.PodResourcesListerStub:
        if self._stub is None:
            self._channel = grpc.insecure_channel(
                f"unix://{self.socket_path}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                         ("grpc.enable_retries", 0)])
            self._stub = pb_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def list(self) -> tuple[list[Assignment], int]:
        """(assignments, entries skipped as invalid). Raises PodResourcesError."""
        try:
            mode = os.stat(self.socket_path).st_mode
        except FileNotFoundError:
            raise PodResourcesError("socket_missing", f"{self.socket_path} does not exist") from None
        except OSError as exc:
            raise PodResourcesError("socket_unreadable", f"{self.socket_path}: {exc.strerror}") from None
        if not stat.S_ISSOCK(mode):
            raise PodResourcesError("socket_missing", f"{self.socket_path} is not a socket")
        with self._lock:
            stub = self._connect()
        try:
            reply = stub.List(pb.ListPodResourcesRequest(), timeout=self.deadline, wait_for_ready=False)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            details = exc.details() if hasattr(exc, "details") else str(exc)
            if code is grpc.StatusCode.INTERNAL and "deserializ" in (details or "").lower():
                raise PodResourcesError("malformed", "the kubelet's answer is not a ListPodResourcesResponse") from None
            reason = _REASONS.get(code, f"grpc_{code.name.lower()}" if code else "grpc_unknown")
            raise PodResourcesError(reason, f"List failed: {code.name if code else '?'}: {details}") from None
        return validate(reply)

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._stub = None


def validate(reply: pb.ListPodResourcesResponse) -> tuple[list[Assignment], int]:
    if len(reply.pod_resources) > MAX_PODS:
        raise PodResourcesError("oversize", f"{len(reply.pod_resources)} pods in one answer (at most {MAX_PODS})")
    out: list[Assignment] = []
    invalid = 0
    for pod in reply.pod_resources:
        if not (_SUBDOMAIN.fullmatch(pod.name) and _LABEL.fullmatch(pod.namespace)):
            invalid += 1
            continue
        for container in pod.containers:
            if not _LABEL.fullmatch(container.name):
                invalid += 1
                continue
            for devices in container.devices:
                for device_id in devices.device_ids:
                    if not device_id or len(device_id) > MAX_DEVICE_ID or not device_id.isprintable():
                        invalid += 1
                        continue
                    out.append(Assignment(pod.name, pod.namespace, container.name, devices.resource_name,
                                          device_id))
            for dynamic in container.dynamic_resources:
                for claim in dynamic.claim_resources:
                    for cdi in claim.cdi_devices:
                        if cdi.name and len(cdi.name) <= MAX_DEVICE_ID and cdi.name.isprintable():
                            out.append(Assignment(pod.name, pod.namespace, container.name, "dra", cdi.name))
                        else:
                            invalid += 1
    return out, invalid
