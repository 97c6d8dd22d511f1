"""A real HTTP server on loopback that answers like NVIDIA's dcgm-exporter: its /metrics text, its
field names and label style. Tests change what it serves, make it fail, or make it hang."""

from __future__ import annotations

import base64
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# (field, type, help) as dcgm-exporter prints them. The types are those of NVIDIA's counters files:
# dcgm-exporter's default-counters.csv lists no DCGM_FI_PROF_* field at all (a server without them
# is the no-fields case); etc/dcp-metrics-included.csv (-f) lists some, and NVIDIA's files have typed
# the DCGM_FI_PROF_PCIE_* fields as counter, although their values are DCGM's per-second rates.
FIELDS = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active sending or "
     "receiving data."),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the fp64 pipes are active."),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the fp32 pipes are active."),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the fp16 pipes are active."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "counter", "Bytes transmitted through PCIe TX."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "counter", "Bytes received through PCIe RX."),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "The rate of data transmitted over NVLink, in bytes per second."),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "The rate of data received over NVLink, in bytes per second."),
]


@dataclass
class ExporterGpu:
    gpu: str  # dcgm-exporter's `gpu` label
    uuid: str
    values: dict[str, float | str]  # field name -> value (a string is printed as is)
    extra_labels: dict[str, str] = field(default_factory=dict)


def exposition(gpus: list[ExporterGpu], hostname: str = "node-7") -> str:
    lines = []
    for name, kind, help_text in FIELDS:
        rows = [g for g in gpus if name in g.values]
        if not rows:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for g in rows:
            labels = {"gpu": g.gpu, "UUID": g.uuid, "pci_bus_id": f"00000000:{0x18 + int(g.gpu or 0):02X}:00.0",
                      "device": f"nvidia{g.gpu}", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": hostname,
                      "DCGM_FI_DRIVER_VERSION": "550.54.15", **g.extra_labels}
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{name}{{{text}}} {g.values[name]}")
    return "\n".join(lines) + "\n"


class DcgmExporterServer:
    """Options, as a dcgm-exporter run with a web config (`--web-config-file`, Prometheus' exporter-toolkit)
    would behave: `basic_auth` (user, password) or `bearer_token` (as a kube-rbac-proxy in front of it)
    answer 401 with a WWW-Authenticate challenge unless the request carries them; `certfile`/`keyfile`
    serve HTTPS (tls_server_config); `client_ca_file` also requires a client certificate signed by that CA
    (client_auth_type: RequireAndVerifyClientCert)."""

    def __init__(
        self,
        *,
        basic_auth: tuple[str, str] | None = None,
        bearer_token: str | None = None,
        certfile: str | None = None,
        keyfile: str | None = None,
        client_ca_file: str | None = None,
    ) -> None:
        self.body = ""
        self.status = 200
        self.hang = threading.Event()  # set: requests block until released
        self.trickle = threading.Event()  # set: headers come one byte every 50 ms until released
        self.stall_body = threading.Event()  # set: half the body is sent, the rest only once released
        self.short_body = threading.Event()  # set: half the body is sent, then the connection is closed
        self.body_stalled = threading.Event()  # set by the server once a stalled body's first half is out
        self.content_length = True  # False: no Content-Length, the body ends when the connection closes
        self.release = threading.Event()
        self.requests = 0
        self.authorization: list[str] = []  # the Authorization header of each request ("" when none)
        self.handshake_failures = 0
        expected = None
        if basic_auth is not None:
            user, password = basic_auth
            expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        elif bearer_token is not None:
            expected = f"Bearer {bearer_token}"
        challenge = 'Basic realm="dcgm-exporter"' if basic_auth is not None else "Bearer"
        tls: ssl.SSLContext | None = None
        if certfile is not None:
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(certfile, keyfile)
            if client_ca_file is not None:
                tls.verify_mode = ssl.CERT_REQUIRED
                tls.load_verify_locations(client_ca_file)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def setup(self) -> None:
                if tls is not None:  # the handshake in this request's thread, not the accepting one
                    self.request.settimeout(10)
                    try:
                        self.request = tls.wrap_socket(self.request, server_side=True)
                    except (OSError, ssl.SSLError):
                        outer.handshake_failures += 1
                        raise
                    self.request.settimeout(None)
                super().setup()

            def do_GET(self) -> None:
                outer.requests += 1
                outer.authorization.append(self.headers.get("Authorization", ""))
                if outer.hang.is_set():
                    outer.release.wait(30)
                if expected is not None and self.headers.get("Authorization") != expected:
                    self._answer(401, b"Unauthorized\n", {"WWW-Authenticate": challenge})
                    return
                if outer.trickle.is_set():  # each read finds a byte: only an overall deadline ends it
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    self.wfile.flush()
                    try:
                        while not outer.release.wait(0.05):
                            self.wfile.write(b"X")
                            self.wfile.flush()
                    except OSError:  # the client gave up
                        pass
                    return
                self._answer(outer.status, outer.body.encode(),
                             {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

            def _answer(self, status: int, data: bytes, headers: dict[str, str]) -> None:
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    if outer.content_length:
                        self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if outer.stall_body.is_set() or outer.short_body.is_set():
                        half = len(data) // 2
                        self.wfile.write(data[:half])
                        self.wfile.flush()
                        if outer.short_body.is_set():
                            return  # the handler ends and the connection closes, short of the length
                        outer.body_stalled.set()
                        outer.release.wait(30)
                        data = data[half:]
                    self.wfile.write(data)
                except OSError:  # the client gave up waiting (a hang test)
                    pass

            def log_message(self, format: str, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: object, client_address: object) -> None:
                pass  # a client refused in the TLS handshake, or gone: the test sees it from the client side

        self.server = Server(("127.0.0.1", 0), Handler)
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}/metrics"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def serve(self, gpus: list[ExporterGpu], extra: str = "") -> None:
        self.body = exposition(gpus) + extra

    def start(self) -> DcgmExporterServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def dcgm_exporter() -> Iterator[DcgmExporterServer]:
    server = DcgmExporterServer().start()
    try:
        yield server
    finally:
        server.stop()
