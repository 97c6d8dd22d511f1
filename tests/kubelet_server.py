"""A real gRPC server implementing the kubelet pod-resources v1 service on a Unix socket, for tests
and the benchmark. Its answers can be changed while it runs: pods come and go, List can be made slow,
or its answer bytes replaced with ones that do not decode."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterable
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from exporter.attribution import podresources_v1_pb2 as pb

GARBAGE = b"\x0a\xff\xff\xff\xff\x0f\x01"  # field 1, length-delimited, length far past the end


@dataclass
class Pod:
    name: str
    namespace: str
    containers: dict[str, list[tuple[str, list[str]]]] = field(default_factory=dict)  # name -> [(resource, ids)]


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

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        if os.path.exists(self.path):
            os.unlink(self.path)

    def __enter__(self) -> KubeletServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
