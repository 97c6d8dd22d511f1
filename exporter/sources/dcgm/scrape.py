"""Reading a dcgm-exporter: fetch its /metrics, take the DCGM_FI_PROF_* series, keyed by GPU UUID.

dcgm-exporter (NVIDIA's DCGM exporter) names series after DCGM's fields and labels them its own way:

    DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-...",pci_bus_id="...",device="nvidia0",
                           modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",
                           DCGM_FI_DRIVER_VERSION="550.54.15"} 0.42

Its profiling ratios are DCGM's, 0-1; PCIe/NVLink ones are bytes per second. Each line is parsed on
its own with prometheus-client's parser, so one bad line is rejected and counted while the rest is
used. Series of MIG instances (a GPU_I_ID label) describe part of a GPU and are not taken.
"""

from __future__ import annotations

import contextlib
import http.client
import math
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from .api import FIELD_NAMES, RATIO_FIELDS

FIELD_BY_NAME = {name: field_id for field_id, name in FIELD_NAMES.items()}
MAX_BODY_BYTES = 16 * 2**20  # dcgm-exporter's output for 8 GPUs with every field is well under 1 MiB
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_UUID = re.compile(r"GPU-[0-9a-fA-F][0-9a-fA-F-]{7,63}")  # NVML's form: GPU-8-4-4-4-12 hex digits
_GPU_ID = re.compile(r"[0-9]{1,4}")
MAX_GPUS = 64  # GPUs taken from one scrape; a node has at most a few dozen
RATIO_EPSILON = 1e-6  # a ratio this little above 1 is rounding, and taken as 1
UUID_LABEL = "UUID"
GPU_LABEL = "gpu"
MIG_LABEL = "GPU_I_ID"


class ScrapeError(Exception):
    """The dcgm-exporter could not be read at all; `reason` becomes the source's error label."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclass
class Reading:
    values: dict[str, dict[int, float]] = field(default_factory=dict)  # UUID -> field id -> value
    gpu_ids: dict[str, str] = field(default_factory=dict)  # UUID -> dcgm-exporter's `gpu` label
    rejected: Counter[str] = field(default_factory=Counter)  # reason -> series rejected
    examples: dict[str, str] = field(default_factory=dict)  # reason -> one rejected line, for the log
    taken: int = 0  # DCGM_FI_PROF_* series seen, before any was rejected
    mig_series: int = 0


class Fetcher:
    """GETs one URL, abandoned after a hard overall deadline: a server that hangs, or trickles its
    headers or body a byte at a time, is cut off when the deadline passes, not when one read times out.

    The connection's socket is shut down by a timer thread, which wakes a read blocked in any phase.
    `close()` (from another thread, when the daemon stops) aborts a request in flight the same way;
    the socket itself is only closed by the thread that reads from it.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._lock = threading.Lock()  # guards _sock, _closed
        self._sock: socket.socket | None = None
        self._closed = False

    def fetch(self, deadline: float) -> str:
        url = self.url
        connection_class = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        connection = connection_class(self._host, self._port, timeout=deadline)
        aborted = threading.Event()
        timer = threading.Timer(deadline, self._abort, (aborted,))
        timer.daemon = True
        timer.start()
        started = time.monotonic()
        try:
            connection.connect()
            with self._lock:
                if self._closed:
                    raise ScrapeError("dcgm_exporter_closed", f"{url}: the source is closing")
                self._sock = connection.sock
            if aborted.is_set():  # the deadline passed while connecting
                raise TimeoutError
            connection.request("GET", self._target, headers={"Accept": "text/plain"})
            response = connection.getresponse()
            if response.status != 200:
                raise ScrapeError("dcgm_exporter_http_error", f"{url} answered HTTP {response.status}")
            chunks: list[bytes] = []
            size = 0
            while chunk := response.read1(65536):
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise ScrapeError("dcgm_exporter_too_large", f"{url} sent more than {MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
            if aborted.is_set():  # the shutdown may read as a clean end of the body
                raise TimeoutError
        except ScrapeError:
            raise
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            if aborted.is_set() or isinstance(exc, TimeoutError):
                raise ScrapeError("dcgm_exporter_timeout", f"{url} did not answer in full within {deadline:g}s "
                                  f"(gave up after {time.monotonic() - started:.1f}s)") from None
            if isinstance(exc, ConnectionRefusedError) or (isinstance(exc, OSError) and self._sock is None):
                raise ScrapeError("dcgm_exporter_unreachable", f"cannot connect to {url}: {exc}: is dcgm-exporter "
                                  "running on this node, and is dcgm.exporter_url its address?") from None
            raise ScrapeError("dcgm_exporter_bad_response", f"{url}: {exc.__class__.__name__}: {exc}") from None
        finally:
            timer.cancel()
            with self._lock:
                self._sock = None
            connection.close()
        return b"".join(chunks).decode("utf-8", errors="replace")

    def _abort(self, aborted: threading.Event | None = None) -> None:
        if aborted is not None:
            aborted.set()
        with self._lock:
            sock = self._sock
            if sock is not None:
                with contextlib.suppress(OSError):  # already closed by the reading thread
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._abort()


def parse(text: str) -> Reading:
    reading = Reading()
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _NAME.match(line)
        field_id = FIELD_BY_NAME.get(match.group(0)) if match else None
        if field_id is None:
            continue  # not a field we take
        reading.taken += 1
        try:
            families = list(text_string_to_metric_families(line + "\n"))
            sample = families[0].samples[0]
        except Exception:  # the parser raises ValueError and friends on garbage
            _reject(reading, "dcgm_exporter_unparsable", line)
            continue
        labels, value = sample.labels, float(sample.value)
        if labels.get(MIG_LABEL):
            reading.mig_series += 1
            continue
        uuid = labels.get(UUID_LABEL, "")
        if not uuid:
            _reject(reading, "dcgm_exporter_no_uuid", line)
            continue
        if not _UUID.fullmatch(uuid):
            _reject(reading, "dcgm_exporter_bad_uuid", line)
            continue
        gpu_id = labels.get(GPU_LABEL, "")
        if not _GPU_ID.fullmatch(gpu_id):
            _reject(reading, "dcgm_exporter_bad_gpu", line)
            continue
        if field_id in RATIO_FIELDS and 1 < value <= 1 + RATIO_EPSILON:
            value = 1.0  # DCGM's float rounding, not a bad value
        if not math.isfinite(value) or value < 0 or (field_id in RATIO_FIELDS and value > 1):
            _reject(reading, "dcgm_exporter_bad_value", line)
            continue
        row = reading.values.get(uuid)
        if row is None:
            if len(reading.values) >= MAX_GPUS:
                _reject(reading, "dcgm_exporter_too_many_gpus", line)
                continue
            row = reading.values[uuid] = {}
            reading.gpu_ids[uuid] = gpu_id
        if field_id in row:
            # dcgm-exporter --kubernetes on a shared GPU: one series per pod (pod/namespace/container
            # labels), all with the GPU's value. Only series that disagree are a real conflict.
            if not math.isclose(row[field_id], value, rel_tol=1e-9, abs_tol=1e-12):
                _reject(reading, "dcgm_exporter_duplicate", line)
            continue
        row[field_id] = value
    return reading


def _reject(reading: Reading, reason: str, line: str) -> None:
    reading.rejected[reason] += 1
    reading.examples.setdefault(reason, line[:200])
