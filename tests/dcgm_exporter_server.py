"""A real HTTP server on loopback that answers like NVIDIA's dcgm-exporter: its /metrics text, its
field names and label style. Tests change what it serves, make it fail, or make it hang."""

from __future__ import annotations

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
    def __init__(self) -> None:
        self.body = ""
        self.status = 200
        self.hang = threading.Event()  # set: requests block until released
        self.trickle = threading.Event()  # set: headers come one byte every 50 ms until released
        self.release = threading.Event()
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests += 1
                if outer.hang.is_set():
                    outer.release.wait(30)
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
                data = outer.body.encode()
                try:
                    self.send_response(outer.status)
                    self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up waiting (a hang test)
                    pass

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
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
