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

import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .api import FIELD_NAMES, RATIO_FIELDS

FIELD_BY_NAME = {name: field_id for field_id, name in FIELD_NAMES.items()}
MAX_BODY_BYTES = 16 * 2**20  # dcgm-exporter's output for 8 GPUs with every field is well under 1 MiB
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
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


def fetch(client: httpx.Client, url: str, deadline: float) -> str:
    """GET `url`, abandoned after `deadline` seconds in all (a server can hang or trickle)."""
    give_up = time.monotonic() + deadline
    try:
        with client.stream("GET", url, timeout=httpx.Timeout(deadline)) as response:
            if response.status_code != 200:
                raise ScrapeError("dcgm_exporter_http_error", f"{url} answered HTTP {response.status_code}")
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise ScrapeError("dcgm_exporter_too_large", f"{url} sent more than {MAX_BODY_BYTES} bytes")
                if time.monotonic() > give_up:
                    raise ScrapeError("dcgm_exporter_timeout", f"{url} did not finish within {deadline:g}s")
                chunks.append(chunk)
    except httpx.TimeoutException:
        raise ScrapeError("dcgm_exporter_timeout", f"{url} did not answer within {deadline:g}s") from None
    except httpx.ConnectError as exc:
        raise ScrapeError("dcgm_exporter_unreachable", f"cannot connect to {url}: {exc}: is dcgm-exporter "
                          "running on this node, and is dcgm.exporter_url its address?") from None
    except httpx.HTTPError as exc:
        raise ScrapeError("dcgm_exporter_bad_response", f"{url}: {exc.__class__.__name__}: {exc}") from None
    return b"".join(chunks).decode("utf-8", errors="replace")


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
        if not math.isfinite(value) or value < 0 or (field_id in RATIO_FIELDS and value > 1):
            _reject(reading, "dcgm_exporter_bad_value", line)
            continue
        row = reading.values.setdefault(uuid, {})
        if field_id in row:
            _reject(reading, "dcgm_exporter_duplicate", line)
            continue
        row[field_id] = value
        reading.gpu_ids.setdefault(uuid, labels.get(GPU_LABEL, ""))
    return reading


def _reject(reading: Reading, reason: str, line: str) -> None:
    reading.rejected[reason] += 1
    reading.examples.setdefault(reason, line[:200])
