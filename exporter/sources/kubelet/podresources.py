"""A client of the kubelet pod-resources API (v1 List) on its Unix socket, and checks on its answer.

The answer is hostile input like any other: a reply that does not decode is rejected whole
(`malformed`); a GPU device of a pod, namespace or container whose name cannot be valid, or with an
impossible device id, is skipped and counted (`invalid`, one per device); an answer with more than
MAX_PODS pods is rejected (`oversize`).

Which devices are GPUs: devices of the extended resources that `is_gpu_resource` accepts (the
kubelet.gpu_resources patterns), and DRA devices of NVIDIA's driver (gpu.nvidia.com) or whose CDI
name is of kind nvidia.com/gpu or names a GPU-/MIG- UUID. Devices of other resources and drivers
(CPUs, NICs, SR-IOV functions) are not looked at.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from . import podresources_v1_pb2 as pb
from .devices import NVIDIA_DRA_DRIVER
from .k8s_names import LABEL, MAX_PODS, SUBDOMAIN

MAX_MESSAGE_BYTES = 16 * 2**20
MAX_DEVICE_ID = 256
LIST_METHOD = "/v1.PodResourcesLister/List"
DRA = "dra"  # the `resource` of a device allocated through Dynamic Resource Allocation
_GPU_UUID = re.compile(r"^(gpu|mig)-", re.IGNORECASE)


class PodResourcesError(Exception):
    """The List call failed; `reason` labels goodput_exporter_source_errors_total{source="kubelet"}."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class Assignment:
    """One GPU device that the kubelet assigned to one container: a device plugin's device id, or a
    DRA device (resource "dra": its driver and pool device name, and its CDI device names)."""

    pod: str
    namespace: str
    container: str
    resource: str
    device_id: str  # a device plugin's id; for a DRA device its first CDI name (may be empty)
    driver: str = ""
    device: str = ""
    cdi_names: tuple[str, ...] = ()


_REASONS = {
    grpc.StatusCode.DEADLINE_EXCEEDED: "deadline_exceeded",
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.UNIMPLEMENTED: "unimplemented",
    grpc.StatusCode.PERMISSION_DENIED: "permission_denied",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "oversize",
}


@dataclass(frozen=True, slots=True)
class _Undecodable:
    error: str


def _decode(data: bytes) -> pb.ListPodResourcesResponse | _Undecodable:
    """The response deserializer: an answer that does not decode is returned as _Undecodable rather
    than raised, so that grpc neither logs a traceback nor folds it into a generic INTERNAL status."""
    try:
        return pb.ListPodResourcesResponse.FromString(data)
    except DecodeError as exc:
        return _Undecodable(str(exc))


class PodResourcesClient:
    """`reconnect_seconds` bounds grpc's reconnect backoff (by default it grows to 120 s, so a kubelet
    that came back would stay unreachable for minutes); a call that finds the kubelet unavailable also
    drops the channel, so the next call connects afresh."""

    def __init__(self, socket_path: str, deadline: float, reconnect_seconds: float = 10.0) -> None:
        self.socket_path = socket_path
        self.deadline = deadline
        self.reconnect_ms = max(100, int(reconnect_seconds * 1000))
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._list: grpc.UnaryUnaryMultiCallable | None = None

    def _connect(self) -> grpc.UnaryUnaryMultiCallable:
        if self._list is None:
            self._channel = grpc.insecure_channel(
                f"unix://{self.socket_path}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                         ("grpc.enable_retries", 0),
                         ("grpc.initial_reconnect_backoff_ms", self.reconnect_ms),
                         ("grpc.min_reconnect_backoff_ms", self.reconnect_ms),
                         ("grpc.max_reconnect_backoff_ms", self.reconnect_ms),
                         # a channel of its own: not a subchannel (and its backoff) shared process-wide
                         ("grpc.use_local_subchannel_pool", 1)])
            self._list = self._channel.unary_unary(
                LIST_METHOD, request_serializer=pb.ListPodResourcesRequest.SerializeToString,
                response_deserializer=_decode)
        return self._list

    def _drop(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._list = None

    def list(self, is_gpu_resource: Callable[[str], bool]) -> tuple[list[Assignment], int]:
        """(GPU assignments, GPU devices skipped as invalid). Raises PodResourcesError."""
        try:
            mode = os.stat(self.socket_path).st_mode
        except FileNotFoundError:
            raise PodResourcesError("socket_missing", f"{self.socket_path} does not exist") from None
        except OSError as exc:
            raise PodResourcesError("socket_unreadable", f"{self.socket_path}: {exc.strerror}") from None
        if not stat.S_ISSOCK(mode):
            raise PodResourcesError("socket_missing", f"{self.socket_path} is not a socket")
        with self._lock:
            call = self._connect()
        try:
            reply = call(pb.ListPodResourcesRequest(), timeout=self.deadline, wait_for_ready=False)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            if code is grpc.StatusCode.UNAVAILABLE:
                self._drop()
            reason = _REASONS.get(code, f"grpc_{code.name.lower()}")
            raise PodResourcesError(reason, f"List failed: {code.name}: {details}") from None
        if isinstance(reply, _Undecodable):
            raise PodResourcesError("malformed",
                                    f"the kubelet's answer is not a ListPodResourcesResponse ({reply.error})")
        return validate(reply, is_gpu_resource)

    def close(self) -> None:
        self._drop()


def _valid_id(text: str) -> bool:
    return bool(text) and len(text) <= MAX_DEVICE_ID and text.isprintable()


def is_gpu_dra(driver: str, cdi_names: tuple[str, ...]) -> bool:
    """A DRA device is a GPU when NVIDIA's driver allocated it, or a CDI name says so."""
    if driver == NVIDIA_DRA_DRIVER:
        return True
    for name in cdi_names:
        kind, _, ident = name.rpartition("=")
        if kind.lower() == "nvidia.com/gpu" or _GPU_UUID.match(ident):
            return True
    return False


def validate(reply: pb.ListPodResourcesResponse,
             is_gpu_resource: Callable[[str], bool]) -> tuple[list[Assignment], int]:
    """The GPU devices of the answer, and how many of them were skipped as invalid (one per device)."""
    if len(reply.pod_resources) > MAX_PODS:
        raise PodResourcesError("oversize", f"{len(reply.pod_resources)} pods in one answer (at most {MAX_PODS})")
    out: list[Assignment] = []
    invalid = 0
    for pod in reply.pod_resources:
        pod_ok = bool(SUBDOMAIN.fullmatch(pod.name) and LABEL.fullmatch(pod.namespace))
        for container in pod.containers:
            ok = pod_ok and bool(LABEL.fullmatch(container.name))
            for devices in container.devices:
                if not is_gpu_resource(devices.resource_name):
                    continue  # CPUs, NICs, SR-IOV functions, other accelerators
                for device_id in devices.device_ids:
                    if not ok or not _valid_id(device_id):
                        invalid += 1
                        continue
                    out.append(Assignment(pod.name, pod.namespace, container.name, devices.resource_name,
                                          device_id))
            for dynamic in container.dynamic_resources:
                for claim in dynamic.claim_resources:
                    names = tuple(cdi.name for cdi in claim.cdi_devices)
                    if claim.device_name:  # 1.31+: one device per ClaimResource
                        units = [(claim.driver_name, claim.device_name, names)]
                    else:  # older kubelets: CDI names only, one device each
                        units = [("", "", (name,)) for name in names]
                    for driver, device, cdi in units:
                        if not is_gpu_dra(driver, cdi):
                            continue
                        if not ok or not all(_valid_id(n) for n in (*cdi, *([device] if device else []),
                                                                      *([driver] if driver else []))):
                            invalid += 1
                            continue
                        out.append(Assignment(pod.name, pod.namespace, container.name, DRA,
                                              cdi[0] if cdi else "", driver, device, cdi))
    return out, invalid
