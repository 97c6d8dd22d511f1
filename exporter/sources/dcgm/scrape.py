"""Reading a dcgm-exporter's text: take the DCGM_FI_PROF_* series, keyed by GPU UUID and MIG instance.

dcgm-exporter (NVIDIA's DCGM exporter) names series after DCGM's fields and labels them its own way:

    DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-...",pci_bus_id="...",device="nvidia0",
                           modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",
                           DCGM_FI_DRIVER_VERSION="550.54.15"} 0.42

What varies between versions and settings, and is all understood here:

- the UUID label is `UUID`, or `uuid` with --use-old-namespace (whose counters file may also spell the
  field names in lower case, dcgm_fi_prof_gr_engine_active);
- the host label is `Hostname` (before 3.3) or `hostname`; neither is used;
- a GPU in MIG mode is reported per GPU instance (the default, --devices f): the series carry
  `GPU_I_ID` (NVML's GPU instance id) and `GPU_I_PROFILE`, and the parent GPU's `gpu` and `UUID`;
- with --kubernetes, one series per pod sharing the GPU, all with the GPU's value;
- HELP and TYPE lines may be missing, label sets may have spaces after commas (or, in 2.0.0-rc.0,
  spaces and no commas).

Its profiling ratios are DCGM's, 0-1; PCIe/NVLink ones are bytes per second. DCGM's "blank" markers
(values from 2**47 up, such as 9223372036854775794) mean "no value" and are counted, never taken.

Each line is parsed on its own, so one bad line is rejected and counted while the rest is used. The
parse is one pass over the text with a regular expression per profiling line (prometheus-client's
parser, line by line as before, costs about 4 times as much: bench/dcgm_parse.py measures both).
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field

from .api import FIELD_NAMES, RATIO_FIELDS, is_blank

FIELD_BY_NAME = {name: field_id for field_id, name in FIELD_NAMES.items()}
PREFIX = "DCGM_FI_PROF_"
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)[ \t]*(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+-?[0-9]+)?[ \t]*")
# a label, and its separator: a comma, or (dcgm-exporter 2.0.0-rc.0) only a space
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*,?')
_UUID = re.compile(r"GPU-[0-9a-fA-F][0-9a-fA-F-]{7,63}")  # NVML's form: GPU-8-4-4-4-12 hex digits
_NUMBER = re.compile(r"[0-9]{1,4}")
UUID_LABELS = ("UUID", "uuid")  # dcgm-exporter's, and its --use-old-namespace spelling
GPU_LABEL = "gpu"
MIG_LABEL = "GPU_I_ID"
MAX_GPUS = 64  # GPUs taken from one scrape; a node has at most a few dozen
MAX_ENTITIES = MAX_GPUS * 8  # a GPU has at most 7 MIG GPU instances
RATIO_EPSILON = 1e-6  # a ratio this little above 1 is rounding, and taken as 1
YIELD_EVERY = 4096  # profiling lines between pauses that let the daemon's other threads run
Entity = tuple[str, str]  # (GPU UUID, MIG GPU instance id or "" for the whole GPU)


@dataclass
class Reading:
    values: dict[Entity, dict[int, float]] = field(default_factory=dict)  # entity -> field id -> value
    gpu_ids: dict[str, str] = field(default_factory=dict)  # UUID -> dcgm-exporter's `gpu` label
    rejected: Counter[str] = field(default_factory=Counter)  # reason -> series rejected
    examples: dict[str, str] = field(default_factory=dict)  # reason -> one rejected line, for the log
    taken: int = 0  # DCGM_FI_PROF_* series of the fields we map, before any was rejected
    unmapped: int = 0  # DCGM_FI_PROF_* series of fields we do not map (NVDEC, C2C, ...)
    labels_seen: set[str] = field(default_factory=set)  # label names of the series without a UUID

    @property
    def mig_instances(self) -> int:
        return sum(1 for _, instance in self.values if instance)


def parse(text: str) -> Reading:
    reading = Reading()
    start = 0
    size = len(text)
    while start < size:
        end = text.find("\n", start)
        if end < 0:
            end = size
        line = text[start:end]
        start = end + 1
        # the cheap test first: most of a dcgm-exporter's lines are other fields
        stripped = line.lstrip()
        if stripped[:13].upper() != PREFIX:
            continue
        reading.taken += 1
        if reading.taken % YIELD_EVERY == 0:
            time.sleep(0)  # a huge body: let /metrics be served meanwhile
        _take(reading, stripped.rstrip())
    return reading


def _take(reading: Reading, line: str) -> None:
    match = _SAMPLE.fullmatch(line)
    if match is None:
        _reject(reading, "dcgm_exporter_unparsable", line)
        return
    name, label_text, value_text = match.groups()
    field_id = FIELD_BY_NAME.get(name.upper())
    if field_id is None:
        reading.taken -= 1  # a profiling field we do not take (NVDEC, NVJPG, NVOFA, C2C, ...)
        reading.unmapped += 1
        return
    labels = _labels(label_text or "")
    try:
        value = float(value_text)
    except ValueError:
        labels = None
    if "_" in value_text:  # Python's float() takes 1_0; the text format does not
        labels = None
    if labels is None:
        _reject(reading, "dcgm_exporter_unparsable", line)
        return
    uuid = next((labels[key] for key in UUID_LABELS if labels.get(key)), "")
    if not uuid:
        reading.labels_seen.update(labels)
        _reject(reading, "dcgm_exporter_no_uuid", line)
        return
    if not _UUID.fullmatch(uuid):
        _reject(reading, "dcgm_exporter_bad_uuid", line)
        return
    gpu_id = labels.get(GPU_LABEL, "")
    instance = labels.get(MIG_LABEL, "")
    if (gpu_id and not _NUMBER.fullmatch(gpu_id)) or (instance and not _NUMBER.fullmatch(instance)):
        _reject(reading, "dcgm_exporter_bad_gpu", line)
        return
    if math.isfinite(value) and is_blank(value):
        _reject(reading, "dcgm_exporter_blank", line)
        return
    if field_id in RATIO_FIELDS and 1 < value <= 1 + RATIO_EPSILON:
        value = 1.0  # DCGM's float rounding, not a bad value
    if not math.isfinite(value) or value < 0 or (field_id in RATIO_FIELDS and value > 1):
        _reject(reading, "dcgm_exporter_bad_value", line)
        return
    entity = (uuid, instance)
    row = reading.values.get(entity)
    if row is None:
        if len(reading.values) >= MAX_ENTITIES or (uuid not in reading.gpu_ids and len(reading.gpu_ids) >= MAX_GPUS):
            _reject(reading, "dcgm_exporter_too_many_gpus", line)
            return
        row = reading.values[entity] = {}
        reading.gpu_ids.setdefault(uuid, gpu_id)
    if field_id in row:
        # dcgm-exporter --kubernetes on a shared GPU: one series per pod (pod/namespace/container
        # labels), all with the GPU's value. Only series that disagree are a real conflict.
        if not math.isclose(row[field_id], value, rel_tol=1e-9, abs_tol=1e-12):
            _reject(reading, "dcgm_exporter_duplicate", line)
        return
    row[field_id] = value


def _labels(text: str) -> dict[str, str] | None:
    """The label set between the braces, or None where it is not one."""
    labels: dict[str, str] = {}
    position, size = 0, len(text)
    while position < size:
        match = _LABEL.match(text, position)
        if match is None:
            return None if text[position:].strip() else labels
        labels[match.group(1)] = match.group(2)
        position = match.end()
    return labels


def _reject(reading: Reading, reason: str, line: str) -> None:
    reading.rejected[reason] += 1
    reading.examples.setdefault(reason, line[:200])
