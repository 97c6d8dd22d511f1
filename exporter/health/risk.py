"""The risk levels of a GPU and the documented mapping from NVIDIA's signals to them.

Levels, worst last: ok (0), watch (1: a worsening trend, nothing to do yet), drain (2: the GPU needs a reset or will
fail the job: take the node out of scheduling, at the job's next checkpoint), replace (3: an RMA case: drain at once
and call the vendor). The same tables drive the recording rules (mixin: goodput_mixin.rules.risk) and the health
command, which reads the node's daemon directly.

Where each fact comes from: NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors) for the codes and the action
each needs, NVIDIA's GPU memory error management notes (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt) for row
remapping (a pending remap takes effect at the next GPU reset; a failed remap: no spare row left) and page retirement
(at most 64 pages on the GPUs before Ampere).
"""

from __future__ import annotations

from dataclasses import dataclass

LEVELS = ("ok", "watch", "drain", "replace")
OK, WATCH, DRAIN, REPLACE = range(4)

# XID code -> (level, what NVIDIA's catalogue says of it). The level follows the catalogue's immediate action
# (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, the "Resolution Bucket" columns): RESET_GPU and
# RESTART_BM (a reset or a reboot is due) are drain; RESTART_APP, IGNORE with CONTACT_SUPPORT, and the memory
# events whose state NVML reports itself (a pending row remap is drain through goodput_gpu_row_remap_pending) are
# watch, at their first occurrence. Codes not listed are "other": application faults (13, 31, 43, 45: the job's
# own bugs, most of the time) and the NVLink5 codes 144-150, whose fatal subcodes the driver follows with an XID
# 154, raise a GPU to watch only when they repeat.
XIDS: dict[int, tuple[int, str]] = {
    46: (DRAIN, "GPU stopped processing (timeout): reset"),
    48: (DRAIN, "double-bit ECC error: a reset or reboot clears it"),
    61: (DRAIN, "internal micro-controller breakpoint/warning (GPUs before Ampere)"),
    62: (DRAIN, "internal micro-controller halt: reset"),
    63: (WATCH, "row remapping or page retirement recorded (the pending state is its own, drain, reason)"),
    64: (DRAIN, "row remapping or page retirement failed: reset, then the vendor (row_remap_failure: replace)"),
    74: (DRAIN, "NVLink error: a reset or reboot clears it"),
    79: (DRAIN, "GPU has fallen off the bus: restart the node"),
    92: (WATCH, "high single-bit ECC error rate"),
    94: (WATCH, "contained memory error: the application on the GPU restarts, the GPU stays in service"),
    95: (DRAIN, "uncontained memory error: reset before applications restart"),
    109: (DRAIN, "context switch timeout: reset"),
    110: (DRAIN, "security fault: reset"),
    119: (DRAIN, "GSP RPC timeout: reset"),
    120: (DRAIN, "GSP error: reset"),
    136: (DRAIN, "link training failed: reset"),
    140: (DRAIN, "uncorrectable ECC error that escaped row remapping: reset"),
    143: (DRAIN, "GPU initialisation error: reset"),
    154: (DRAIN, "GPU recovery action changed: the driver asks for a reset, a reboot or a drain"),
    155: (DRAIN, "NVLink link down by software: reset"),
    156: (DRAIN, "resource retirement event: reset"),
    158: (DRAIN, "GPU fatal timeout: reset"),
}
# a GPU that fell off the bus again within the repeat window after a reset is an RMA case
REPEAT_REPLACE_XIDS = (79,)
# pages retired (GPUs before Ampere): NVIDIA's page retirement supports at most 64; near it the GPU is an RMA case
RETIRED_PAGES_REPLACE = 60


def xid_level(xid: int) -> int:
    return XIDS.get(xid, (WATCH, ""))[0]


def xids_at(level: int) -> list[int]:
    return sorted(x for x, (lv, _) in XIDS.items() if lv == level)


@dataclass(frozen=True)
class Finding:
    """One reason a GPU is at a level."""

    gpu: str  # the GPU's index on the node
    uuid: str
    level: int
    reason: str  # row_remap_pending, xid_79, gpu_lost, ...
    evidence: str  # the series and value that prove it

    @property
    def level_name(self) -> str:
        return LEVELS[self.level]

    def describe(self) -> str:
        return f"GPU {self.gpu} {self.reason} ({self.uuid})"  # the cause first: NPD keeps 80 characters


# the reasons, their level and what they mean: the runbook's and docs' table (docs/health.md)
REASONS: dict[str, tuple[int, str]] = {
    "row_remap_failure": (REPLACE, "a row could not be remapped: no spare row left (goodput_gpu_row_remap_failure)"),
    "retired_pages_exhausted": (REPLACE, f"{RETIRED_PAGES_REPLACE} or more pages retired "
                                         "(goodput_gpu_retired_pages_total)"),
    "xid_repeated": (REPLACE, "the GPU fell off the bus (XID 79) again within the repeat window"),
    "row_remap_pending": (DRAIN, "a row remap waits for a GPU reset (goodput_gpu_row_remap_pending)"),
    "retired_pages_pending": (DRAIN, "a page retirement waits for a GPU reset (goodput_gpu_retired_pages_pending)"),
    "ecc_uncorrected": (DRAIN, "uncorrectable ECC errors since the driver loaded: no reset since "
                               "(goodput_gpu_ecc_errors_total{error_type=\"uncorrected\"} above 0)"),
    "gpu_lost": (DRAIN, "NVML no longer answers for the GPU (goodput_gpu_up 0)"),
    "recovery_action": (DRAIN, "the driver asks for a GPU reset, a node reboot or a drain (goodput_gpu_recovery_action "
                               "above 0)"),
    "xid_<code>": (DRAIN, "an XID whose catalogued action is a reset or a reboot (WATCH for 63, 92, 94; the table: "
                          "exporter/health/risk.py)"),
    "ecc_corrected_rising": (WATCH, "correctable ECC errors keep counting"),
    "pcie_replays_rising": (WATCH, "PCIe replays keep counting (goodput_gpu_pcie_replays_total)"),
    "nvlink_errors_rising": (WATCH, "NVLink CRC errors, replays or recoveries keep counting"),
    "thermal_throttling": (WATCH, "the clocks were held down by temperature (thermal margin gone)"),
    "xids_repeated": (WATCH, "non-fatal XIDs (application faults, 92) repeat"),
    "gpu_flapping": (WATCH, "the GPU was lost within the hour (goodput_gpu_lost_total rose, or goodput_gpu_up "
                            "changed)"),
    "exporter_restarted": (WATCH, "the exporter went dark and came back (its counters reset)"),
}
