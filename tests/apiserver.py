"""A real HTTP(S) server on loopback speaking the part of the Kubernetes API the pod-labels client uses:
`GET /api/v1/pods` with a `spec.nodeName` field selector, as a PodList or (when the Accept header asks
for it) a PartialObjectMetadataList, behind a bearer token (401 on a wrong one, 403 when told to
refuse). Its answers can be changed while it runs: pods come and go and change labels, the answer
can be made slow, replaced with bytes that are not JSON, or padded past any sane size."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

METADATA_ONLY = "as=PartialObjectMetadataList"
FORBIDDEN = ('pods is forbidden: User "system:serviceaccount:monitoring:goodput-exporter" cannot list resource '
             '"pods" in API group "" at the cluster scope')


@dataclass
class ApiPod:
    name: str
    namespace: str
    node: str = "node-a"
    labels: dict[str, str] = field(default_factory=dict)


def self_signed(directory: str, name: str = "server") -> tuple[str, str]:
    """(certificate, key) for 127.0.0.1, made by the openssl command line."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl not found: the HTTPS tests make their certificate with it")
    cert, key = os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key")
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


class ApiServer:
    def __init__(self, token: str = "good-token", tls: bool = False, node_field_selector: bool = True) -> None:
        self.token = token
        self.pods: list[ApiPod] = []
        self.delay = 0.0
        self.forbidden = False
        self.status: int | None = None  # answer every request with this status (a Status object)
        self.malformed: bytes | None = None
        self.padding = 0  # extra bytes of JSON in every answer
        self.metadata_only = True  # serves PartialObjectMetadataList when asked (every API server since 1.15)
        self.requests: list[tuple[str, dict[str, list[str]], dict[str, str]]] = []
        self.dir = tempfile.mkdtemp(prefix="gp-api-")
        self.token_file = os.path.join(self.dir, "token")
        self.write_token(token)
        self.ca_file = ""
        self._tls = tls
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._connections: set[socket.socket] = set()  # kept-alive ones too: stop() ends them all
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{self.port}"

    def write_token(self, token: str) -> None:
        """What the exporter presents (the kubelet rewrites this file when it rotates the token)."""
        with open(self.token_file + ".new", "w") as f:
            f.write(token + "\n")
        os.replace(self.token_file + ".new", self.token_file)

    def set_pods(self, pods: list[ApiPod]) -> None:
        with self._lock:
            self.pods = list(pods)

    def answer(self, node: str | None, metadata_only: bool) -> bytes:
        with self._lock:
            pods = [p for p in self.pods if node is None or p.node == node]
        if metadata_only:
            items = [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                      "metadata": {"name": p.name, "namespace": p.namespace, "uid": f"uid-{p.name}",
                                   **({"labels": p.labels} if p.labels else {})}} for p in pods]
            document = {"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                        "metadata": {"resourceVersion": "12345"}, "items": items}
        else:
            items = [{"metadata": {"name": p.name, "namespace": p.namespace, "uid": f"uid-{p.name}",
                                   **({"labels": p.labels} if p.labels else {})},
                      "spec": {"nodeName": p.node, "containers": [{"name": "trainer", "image": "x"}]},
                      "status": {"phase": "Running"}} for p in pods]
            document = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "12345"},
                        "items": items}
        if self.padding:
            document["metadata"]["padding"] = "x" * self.padding  # type: ignore[index]
        return json.dumps(document).encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with api._lock:
                    api._connections.add(self.connection)

            def finish(self) -> None:
                with api._lock:
                    api._connections.discard(self.connection)
                super().finish()

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(OSError):  # the client gave up (timeout, oversize)
                    self.wfile.write(body)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(code, json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                             "message": message, "reason": reason, "code": code}).encode())

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                api.requests.append((parts.path, query, dict(self.headers.items())))
                if api.delay:
                    api._stopped.wait(api.delay)
                if self.headers.get("Authorization") != f"Bearer {api.token}":
                    return self._status(401, "Unauthorized", "Unauthorized")
                if api.forbidden:
                    return self._status(403, "Forbidden", FORBIDDEN)
                if api.status is not None:
                    return self._status(api.status, "InternalError", "etcdserver: request timed out")
                if parts.path != "/api/v1/pods":
                    return self._status(404, "NotFound", "the server could not find the requested resource")
                node = None
                for selector in query.get("fieldSelector", []):
                    key, _, wanted = selector.partition("=")
                    if key != "spec.nodeName":
                        return self._status(400, "BadRequest", f'field label not supported: {key}')
                    node = wanted
                if api.malformed is not None:
                    return self._send(200, api.malformed)
                accept = self.headers.get("Accept", "")
                self._send(200, api.answer(node, api.metadata_only and METADATA_ONLY in accept))

        return Handler

    def start(self) -> ApiServer:
        server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        server.daemon_threads = True
        if self._tls:
            cert, key = self_signed(self.dir)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            server.socket = context.wrap_socket(server.socket, server_side=True)
            self.ca_file = cert
        self.port = server.server_address[1]
        self._stopped.clear()
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._lock:
            connections, self._connections = list(self._connections), set()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def restart(self) -> ApiServer:
        """Serve again on the same port."""
        return self.start()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
