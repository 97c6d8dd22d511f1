"""A real gRPC server implementing the kubelet pod-resources v1 service on a Unix socket, for tests
and the benchmark (bench/attribution.py loads this file by its path). Its answers can be changed while
it runs: pods come and go, List can be made slow, or its answer bytes replaced with ones that do not
decode; it can stop leaving its socket file behind, as a kubelet that died does."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from collections.abc import Iterable
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from exporter.sources.kubelet import podresources_v1_pb2 as pb

GARBAGE = b"\x0a\xff\xff\xff\xff\x0f\x01"  # field 1, length-delimited, length far past the end


@dataclass(frozen=True)
class DraDevice:
    """One ClaimResource: a DRA driver's device (1.31+ fields; empty for an older kubelet) and its CDI names."""

    driver: str = ""
    device: str = ""
    cdi_names: tuple[str, ...] = ()
    pool: str = "node-0"


@dataclass
class Pod:
    name: str
    namespace: str
    containers: dict[str, list[tuple[str, list[str]]]] = field(default_factory=dict)  # name -> [(resource, ids)]
    dra: dict[str, list[DraDevice]] = field(default_factory=dict)  # container name -> its DRA devices


def gpu_pod(name: str, namespace: str, *device_ids: str, container: str = "trainer",
            resource: str = "nvidia.com/gpu") -> Pod:
    return Pod(name, namespace, {container: [(resource, list(device_ids))]})


class KubeletServer:
    def __init__(self, path: str | None = None) -> None:
        self.path = path or os.path.join(tempfile.mkdtemp(prefix="gp-kl-"), "kubelet.sock")
        self.pods: list[Pod] = []
        self.delay = 0.0
        self.malformed = False
        self.calls = 0
        self._lock = threading.Lock()
        self._stopped = threading.Event()  # ends a delayed answer early when the server stops
        self._server: grpc.Server | None = None

    def set_pods(self, pods: Iterable[Pod]) -> None:
        with self._lock:
            self.pods = list(pods)

    def answer(self) -> pb.ListPodResourcesResponse:
        with self._lock:
            pods = list(self.pods)
        reply = pb.ListPodResourcesResponse()
        for pod in pods:
            item = reply.pod_resources.add(name=pod.name, namespace=pod.namespace)
            for container_name, devices in pod.containers.items():
                container = item.containers.add(name=container_name)
                for resource, ids in devices:
                    container.devices.add(resource_name=resource, device_ids=ids)
            for container_name, dra in pod.dra.items():
                container = next((c for c in item.containers if c.name == container_name), None) \
                    or item.containers.add(name=container_name)
                claim = container.dynamic_resources.add(claim_name=f"{pod.name}-gpu", claim_namespace=pod.namespace)
                for device in dra:
                    resource = claim.claim_resources.add(
                        driver_name=device.driver, device_name=device.device,
                        pool_name=device.pool if device.device else "")
                    for name in device.cdi_names:
                        resource.cdi_devices.add(name=name)
        return reply

    def _list(self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext) -> pb.ListPodResourcesResponse:
        self.calls += 1
        if self.delay:
            self._stopped.wait(self.delay)
        return self.answer()

    def _serialize(self, reply: pb.ListPodResourcesResponse) -> bytes:
        return GARBAGE if self.malformed else reply.SerializeToString()

    def start(self) -> KubeletServer:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list, request_deserializer=pb.ListPodResourcesRequest.FromString,
                response_serializer=self._serialize),
        })
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self._stopped.clear()
        self._server = server
        return self

    def stop(self, leave_socket: bool = False) -> None:
        """Stop serving; with `leave_socket`, a socket file that refuses connections stays behind."""
        self._stopped.set()
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        if os.path.exists(self.path):
            os.unlink(self.path)
        if leave_socket:  # bound, never listening: connect() is refused, like a dead kubelet's socket
            dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            dead.bind(self.path)
            dead.close()

    def restart(self) -> KubeletServer:
        """Serve again on the same path (after stop, with or without its socket left behind)."""
        if os.path.exists(self.path):
            os.unlink(self.path)
        return self.start()

    def __enter__(self) -> KubeletServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
