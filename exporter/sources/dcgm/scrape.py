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
from collections import Counter
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from .api import FIELD_NAMES, RATIO_FIELDS

FIELD_BY_NAME = {name: field_id for field_id, name in FIELD_NAMES.items()}
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_UUID = re.compile(r"GPU-[0-9a-fA-F][0-9a-fA-F-]{7,63}")  # NVML's form: GPU-8-4-4-4-12 hex digits
_GPU_ID = re.compile(r"[0-9]{1,4}")
MAX_GPUS = 64  # GPUs taken from one scrape; a node has at most a few dozen
RATIO_EPSILON = 1e-6  # a ratio this little above 1 is rounding, and taken as 1
UUID_LABEL = "UUID"
GPU_LABEL = "gpu"
MIG_LABEL = "GPU_I_ID"


@dataclass
class Reading:
    values: dict[str, dict[int, float]] = field(default_factory=dict)  # UUID -> field id -> value
    gpu_ids: dict[str, str] = field(default_factory=dict)  # UUID -> dcgm-exporter's `gpu` label
    rejected: Counter[str] = field(default_factory=Counter)  # reason -> series rejected
    examples: dict[str, str] = field(default_factory=dict)  # reason -> one rejected line, for the log
    taken: int = 0  # DCGM_FI_PROF_* series seen, before any was rejected
    mig_series: int = 0


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
