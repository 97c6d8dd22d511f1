"""Risk levels from real GPU outputs (issue 42, acceptance 2): each level from what real GPUs printed.

The inputs are outputs real nodes printed, as published (tests/risk_corpus/README.md gives each one's source; the
dcgm-exporter scrapes are tests/dcgm_corpus's): kernel-log XID lines, `nvidia-smi -q` sections and dcgm-exporter
scrapes. None is written here. Each is read into what NVML answered for one GPU:

- an XID line is an XID event of the GPU (NVML's nvmlEventSetWait hands the daemon the same code) at the line's
  time, relative to the output's first XID; XID 79 ("fallen off the bus") also makes NVML answer GPU_IS_LOST from
  then on, as the driver does for a GPU gone from the bus;
- a `nvidia-smi -q` value is the NVML field nvidia-smi printed it from (Remapped Rows: nvmlDeviceGetRemappedRows,
  the fields NVML_FI_DEV_REMAPPED_*; ECC Errors Volatile: the volatile totals NVML_FI_DEV_ECC_SBE/DBE_VOL_TOTAL,
  SRAM + DRAM; Retired Pages: NVML_FI_DEV_RETIRED_*; N/A: not supported);
- a dcgm-exporter health field (DCGM_FI_DEV_ROW_REMAP_*, DCGM_FI_DEV_PCIE_REPLAY_COUNTER, ...) is the NVML field
  DCGM read it from; its lines are split by the daemon's own dcgm-exporter line parser
  (exporter.sources.dcgm.scrape). The daemon's dcgm source itself takes only the DCGM_FI_PROF_* fields: the risk
  inputs always come from its nvml source, which is what is run here.

Those answers are served by a simulated GPU (SimulatedGpus, with the output's UUID and PCI bus id, its health fields
and XID events replaced by the output's), read every 30 s by the real nvml source and rendered by the real renderer;
promtool then evaluates the shipped risk groups (rules/goodput-recording.rules.yml, as tests/
test_risk_healthy_hour.py does) on those scrapes and the test asserts each GPU's gpu:goodput_gpu_risk_level:max
before and after the output's events (and at the last scrape, minutes later), at the level NVIDIA's documents give
(exporter/health/risk.py, docs/health.md): the XID catalogue (docs.nvidia.com/deploy/xid-errors) and the memory
error management notes (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt). A node whose output shows a state (a
pending row remap) is scraped in it from the daemon's start; the events come 10 minutes in.

No real output was found for: a failed row remap (`Remapping Failure Occurred: Yes`, DCGM_FI_DEV_ROW_REMAP_FAILURE
1), 60 or more retired pages, XID 79 twice on one GPU within 24 h, or a rising PCIe replay, NVLink error or
corrected-ECC count (all published outputs are single snapshots). rules/tests/risk.test.yml covers those with
written sequences.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
from conftest import ROOT, ManualClock
from risk_promtool import LEVEL, Scraped, record, run

from exporter.core.exposition import TEXT, Renderer
from exporter.health.risk import DRAIN, OK, WATCH
from exporter.sources.dcgm import scrape
from exporter.sources.nvml.api import (
    FI_ECC_DBE_VOL_TOTAL,
    FI_ECC_SBE_VOL_TOTAL,
    FI_PCIE_REPLAY_COUNTER,
    FI_REMAPPED_COR,
    FI_REMAPPED_FAILURE,
    FI_REMAPPED_PENDING,
    FI_REMAPPED_UNC,
    FI_RETIRED_DBE,
    FI_RETIRED_PENDING,
    FI_RETIRED_SBE,
)
from exporter.sources.nvml.simulated import SimulatedGpus
from exporter.sources.nvml.source import NvmlSource

RISK = ROOT / "tests" / "risk_corpus"
DCGM = ROOT / "tests" / "dcgm_corpus"
SCRAPE = 30  # s
EVENTS_AT = 600  # s after the daemon's start: the output's first event
AFTER = 120  # s after its last event: the level then
TAIL = 300  # s scraped after that

# the NVML fields the nvml source reads for the risk inputs -> the series each fills (exporter/sources/nvml/readings.py)
SERIES = {
    FI_ECC_SBE_VOL_TOTAL: ("goodput_gpu_ecc_errors_total", ("error_type", "corrected")),
    FI_ECC_DBE_VOL_TOTAL: ("goodput_gpu_ecc_errors_total", ("error_type", "uncorrected")),
    FI_RETIRED_SBE: ("goodput_gpu_retired_pages_total", ("cause", "single_bit")),
    FI_RETIRED_DBE: ("goodput_gpu_retired_pages_total", ("cause", "double_bit")),
    FI_RETIRED_PENDING: ("goodput_gpu_retired_pages_pending", ()),
    FI_PCIE_REPLAY_COUNTER: ("goodput_gpu_pcie_replays_total", ()),
    FI_REMAPPED_COR: ("goodput_gpu_remapped_rows_total", ("error_type", "corrected")),
    FI_REMAPPED_UNC: ("goodput_gpu_remapped_rows_total", ("error_type", "uncorrected")),
    FI_REMAPPED_PENDING: ("goodput_gpu_row_remap_pending", ()),
    FI_REMAPPED_FAILURE: ("goodput_gpu_row_remap_failure", ()),
}
# dcgm-exporter's health fields -> the NVML field DCGM reads each from
DCGM_FIELDS = {
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": FI_ECC_SBE_VOL_TOTAL,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": FI_ECC_DBE_VOL_TOTAL,
    "DCGM_FI_DEV_RETIRED_SBE": FI_RETIRED_SBE,
    "DCGM_FI_DEV_RETIRED_DBE": FI_RETIRED_DBE,
    "DCGM_FI_DEV_RETIRED_PENDING": FI_RETIRED_PENDING,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": FI_PCIE_REPLAY_COUNTER,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": FI_REMAPPED_COR,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": FI_REMAPPED_UNC,
    "DCGM_FI_DEV_ROW_REMAP_PENDING": FI_REMAPPED_PENDING,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": FI_REMAPPED_FAILURE,
}
# `nvidia-smi -q` keys (section path) -> NVML field; the ECC totals add SRAM and DRAM
SMI_FIELDS = {
    "Retired Pages/Single Bit ECC": FI_RETIRED_SBE,
    "Retired Pages/Double Bit ECC": FI_RETIRED_DBE,
    "Retired Pages/Pending Page Blacklist": FI_RETIRED_PENDING,
    "Remapped Rows/Correctable Error": FI_REMAPPED_COR,
    "Remapped Rows/Uncorrectable Error": FI_REMAPPED_UNC,
    "Remapped Rows/Pending": FI_REMAPPED_PENDING,
    "Remapped Rows/Remapping Failure Occurred": FI_REMAPPED_FAILURE,
}
SMI_ECC = {"Correctable": FI_ECC_SBE_VOL_TOTAL, "Uncorrectable": FI_ECC_DBE_VOL_TOTAL}
LOST_XIDS = (79,)  # the GPU is gone from the bus: NVML answers GPU_IS_LOST for it from then on

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:]+)[^)]*\): (\d+),")
_GPU_AT = re.compile(r"NVRM: GPU at PCI:([0-9a-fA-F:]+): (GPU-[0-9a-fA-F-]+)")
_STAMP = re.compile(r"\[\s*(\d+\.\d+)\]|\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]")
_SMI_VALUE = re.compile(r"(\S.*?)\s+: ?(.*)")


@dataclass
class Output:
    """What a real output says about one GPU: NVML's answers."""

    uuid: str = ""
    pci_bus_id: str = ""
    fields: dict[int, int | None] = field(default_factory=dict)  # NVML field id -> value (None: N/A)
    xids: list[tuple[float, int]] = field(default_factory=list)  # (seconds after the first XID, code)


def _dmesg(text: str, pci: str, out: Output) -> None:
    """The kernel log's XID lines of the GPU on PCI bus `pci` (its NVRM "GPU at" line names its UUID)."""
    times: list[tuple[float, int]] = []
    for line in text.splitlines():
        if (at := _GPU_AT.search(line)) and at[1].lower() == pci:
            out.uuid = at[2]
        match = _XID.search(line)
        if match is None or match[1].lower() != pci:
            continue
        stamp = _STAMP.search(line)
        if stamp is None:  # a line quoted without its time: the output's only XID
            when = 0.0
        elif stamp[1]:  # seconds since boot
            when = float(stamp[1])
        else:  # dmesg -T
            when = datetime.strptime(stamp[2], "%a %b %d %H:%M:%S %Y").timestamp()
        times.append((when, int(match[2])))
    assert times, f"no XID of PCI {pci}"
    assert len(times) == 1 or all(_STAMP.search(line) for line in text.splitlines() if _XID.search(line)), pci
    out.xids = [(when - times[0][0], xid) for when, xid in times]
    domain, bus, device = pci.split(":")
    out.pci_bus_id = out.pci_bus_id or f"0000{domain}:{bus}:{device}.0".upper()


def _nvidia_smi(text: str, out: Output) -> None:
    """The `nvidia-smi -q` values of the output's one GPU."""
    path: list[tuple[int, str]] = []
    ecc: dict[int, int] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped == "[...]" or stripped.startswith("NVRM:"):
            continue
        indent = len(line) - len(line.lstrip())
        while path and path[-1][0] >= indent:
            path.pop()
        match = _SMI_VALUE.fullmatch(stripped)
        if match is None:
            path.append((indent, stripped))
            if indent == 0 and stripped.startswith("GPU "):
                out.pci_bus_id = stripped[4:]
            continue
        key = "/".join([*(name for _, name in path[-1:]), match[1]])
        value = match[2].strip()
        number = {"Yes": 1, "No": 0, "N/A": None}.get(value, None if not value.isdigit() else int(value))
        if match[1] == "GPU UUID":
            out.uuid = value
        elif key in SMI_FIELDS:
            out.fields[SMI_FIELDS[key]] = number
        elif [name for _, name in path[-2:]] == ["ECC Errors", "Volatile"] and number is not None:
            kind = match[1].split(" ", 1)[1]  # SRAM/DRAM Correctable/Uncorrectable
            ecc[SMI_ECC[kind]] = ecc.get(SMI_ECC[kind], 0) + number
    out.fields.update(ecc)


def _dcgm_exporter(text: str, uuid: str, out: Output) -> None:
    """The health fields of GPU `uuid` in a dcgm-exporter scrape, split by the daemon's line parser; a GPU in MIG
    mode has them once per GPU instance, all with the GPU's value. DCGM_FI_DEV_XID_ERRORS is the last XID (0:
    none) at the scrape."""
    out.uuid = uuid
    for line in text.splitlines():
        match = scrape._SAMPLE.fullmatch(line.strip())
        if match is None or line.lstrip().startswith("#"):
            continue
        name, label_text, value_text = match.groups()
        labels = scrape._labels(label_text or "")
        assert labels is not None, line
        if next((labels[key] for key in scrape.UUID_LABELS if labels.get(key)), "") != uuid:
            continue
        out.pci_bus_id = labels.get("pci_bus_id", out.pci_bus_id)
        value = int(float(value_text))
        if name == "DCGM_FI_DEV_XID_ERRORS":
            if value and (0.0, value) not in out.xids:
                out.xids.append((0.0, value))
        elif name in DCGM_FIELDS:
            field_id = DCGM_FIELDS[name]
            assert out.fields.get(field_id, value) == value, (line, out.fields)
            out.fields[field_id] = value


class ReplayedGpu(SimulatedGpus):
    """One simulated GPU answering NVML with a real output's identity, health fields and XID events."""

    def __init__(self, output: Output, clock: ManualClock, rising: bool) -> None:
        super().__init__(1, clock=clock)
        self.output = output
        self.rising = rising  # the fields read 0 until the events, the output's values from then on
        self.happened = False
        gpu = self._gpus[0]
        gpu.uuid = output.uuid or gpu.uuid
        gpu.pci_bus_id = output.pci_bus_id or gpu.pci_bus_id

    def happen(self, xid: int) -> None:
        self.happened = True
        self.inject_xid(0, xid)
        if xid in LOST_XIDS:
            self.lose(0)

    def device_field_values(self, handle, fields):  # type: ignore[no-untyped-def]
        answers = super().device_field_values(handle, fields)
        for i, (field_id, _scope) in enumerate(fields):
            if field_id in SERIES:
                value = self.output.fields.get(field_id)
                answers[i] = 0 if value is not None and self.rising and not self.happened else value
        return answers


@dataclass(frozen=True)
class Case:
    name: str
    files: tuple[Path, ...]
    gpu: str  # the GPU of the output: its PCI bus (kernel log, "0000:07:00") or UUID (dcgm-exporter); "" if one
    level: int  # NVIDIA's level after the output's events (or throughout, with none)
    before: int = OK  # before them
    rising: bool = False  # the output's counters and flags appear with its events (else: from the daemon's start)
    why: str = ""


CASES = [
    # ok: healthy scrapes, every risk input the exporter printed at 0
    Case("ok-dcgm-exporter-l40s-row-remap-0", (DCGM / "k8s-ai-conformance-upcloud-l40s.txt",),
         "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43", OK,
         why="no remapped row, no remap failure, no PCIe replay"),
    Case("ok-dcgm-exporter-a100-mig-xid-0", (DCGM / "runai-a100-sxm4-40gb-all-mig-4-instances.txt",),
         "GPU-473571f2-fb37-ef7e-50fe-9885b74a23cd", OK,
         why="DCGM_FI_DEV_XID_ERRORS 0 (no XID), no PCIe replay, on every GPU instance"),
    Case("ok-dcgm-exporter-t4-pcie-replay-0", (DCGM / "k8s-ai-conformance-ericsson-t4-no-help-type.txt",),
         "GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a", OK, why="no PCIe replay"),
    Case("ok-one-application-xid-31", (RISK / "issue-akash-support-244-xid43-xid31-xid94.txt",), "0000:00:07", OK,
         why="one MMU fault (XID 31) of an application: the catalogue's application error, once"),
    # watch: application XIDs that repeat within the hour
    Case("watch-xid-43-twice", (RISK / "issue-akash-support-244-xid43-xid31-xid94.txt",), "0000:00:05", WATCH,
         why="XID 43 (GPU stopped processing) twice in 68 s"),
    Case("drain-xid-109-after-three-xid-13", (RISK / "gpud-xid-readme-xid13-x3-xid109.txt",), "0000:cb:00", DRAIN,
         why="three graphics engine exceptions (XID 13), then a context switch timeout (XID 109), whose catalogued "
             "action is a GPU reset"),
    # drain: a reset is due, or the GPU is gone
    Case("drain-row-remap-pending-and-xid-63", (RISK / "stas00-ml-engineering-a100-xid63-row-remap-pending.txt",),
         "0000:10:1c", DRAIN, before=DRAIN,
         why="A100 with Remapped Rows Pending: Yes (a reset activates the remap) and XID 63 (row remapper: new row "
             "marked for remapping, reset gpu to activate)"),
    Case("drain-row-remap-pending-uncorrectable", (RISK / "gpud-pr-80-remapped-rows-pending.txt",), "", DRAIN,
         before=DRAIN, why="4 rows remapped after uncorrectable errors, Pending: Yes"),
    Case("watch-xid-94-contained-ecc", (RISK / "issue-akash-support-244-xid43-xid31-xid94.txt",), "0000:00:08", WATCH,
         why="XID 94: a contained memory error (the catalogue: restart the application; the GPU stays in service)"),
    Case("drain-xid-79-fallen-off-the-bus", (RISK / "gpud-sxid-readme-xid79-fallen-off-the-bus.txt",), "0000:91:00",
         DRAIN, why="XID 79: the GPU fell off the bus (and NVML lost it)"),
    Case("drain-sram-uncorrectable-counted", (RISK / "stas00-ml-engineering-sram-uncorrectable.txt",), "", DRAIN,
         rising=True, why="the volatile uncorrectable ECC count goes from 0 (driver load) to the output's 1"),
    Case("drain-sram-uncorrectable-since-start", (RISK / "stas00-ml-engineering-sram-uncorrectable.txt",), "",
         DRAIN, before=DRAIN,
         why="the volatile uncorrectable ECC count at 1 from the daemon's start: no reset since the error"),
    Case("drain-xid-48-then-64", (RISK / "issue-gpu-operator-1146-xid48-xid64.txt",), "0000:07:00", DRAIN,
         why="a double-bit error (XID 48) whose page could not be retired (XID 64): the catalogue's action for both "
             "is a GPU reset (the RMA case is a failed row remap, which no published output shows)"),
]


def _output(case: Case) -> Output:
    out = Output()
    for path in case.files:
        text = path.read_text()
        if path.parent == DCGM:
            _dcgm_exporter(text, case.gpu, out)
            continue
        if "NVRM: Xid" in text:
            _dmesg(text, case.gpu, out)
        _nvidia_smi(text, out)
    return out


def _scrapes(case: Case, out: Output) -> tuple[Scraped, float, float]:
    """Every series of the node's nvml source at each scrape (None where a scrape lacks it), the time of the
    output's last event and of the last scrape."""
    clock = ManualClock(0.0)
    gpus = ReplayedGpu(out, clock, case.rising)
    source = NvmlSource(gpus, clock=clock)
    renderer = Renderer()
    events = sorted((EVENTS_AT + offset, xid) for offset, xid in out.xids)
    last = events[-1][0] if events else EVENTS_AT
    count = int((last + AFTER + TAIL) // SCRAPE) + 1
    found: Scraped = {}
    for i in range(count):
        while events and events[0][0] <= clock.now:
            gpus.happen(events.pop(0)[1])
        if case.rising and not out.xids and clock.now >= EVENTS_AT:
            gpus.happened = True
        record(found, i, count, renderer.render(source.collect(), TEXT).decode())
        clock.advance(SCRAPE)
    return found, last, (count - 1) * SCRAPE


def _level_at(uuid: str, seconds: float, level: int) -> dict[str, object]:
    return {"expr": f'{LEVEL}{{uuid="{uuid}"}}', "eval_time": f"{int(seconds)}s",
            "exp_samples": [{"labels": f'{LEVEL}{{cluster="c1",gpu="0",instance="node0:9445",uuid="{uuid}"}}',
                             "value": level}]}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_real_output_puts_its_gpu_at_nvidias_level(case: Case, tmp_path: Path) -> None:
    out = _output(case)
    assert out.fields or out.xids, "nothing read from the output"
    scraped, last, end = _scrapes(case, out)
    uuid = next(dict(labels)["uuid"] for name, labels in scraped if name == "goodput_gpu_up")
    assert not out.uuid or uuid == out.uuid
    # the output's values reached the daemon's series as they were printed (a lost GPU publishes none)
    lost = any(xid in LOST_XIDS for _, xid in out.xids)
    for field_id, value in out.fields.items():
        name, extra = SERIES[field_id]
        key = (name, frozenset({("gpu", "0"), ("uuid", uuid), *([extra] if extra else [])}))
        assert (scraped[key][-1] if key in scraped else None) == (None if lost else value), (name, extra)
    for xid in {xid for _, xid in out.xids}:
        key = ("goodput_gpu_xid_errors_total", frozenset({("gpu", "0"), ("uuid", uuid), ("xid", str(xid))}))
        assert scraped[key][-1] == sum(1 for _, x in out.xids if x == xid)
    assert [v for (name, _), values in scraped.items() if name == "goodput_gpu_up" for v in values[-1:]] == \
        [0.0 if lost else 1.0]

    # and still at the last scrape, TAIL later: the output's state has not changed, nor its level
    result = run(tmp_path, scraped, SCRAPE, SCRAPE, [_level_at(uuid, EVENTS_AT - 60, case.before),
                                                     _level_at(uuid, last + AFTER, case.level),
                                                     _level_at(uuid, end, case.level)], timeout=120)
    assert result.returncode == 0, f"{case.why}\n{result.stdout[-4000:]}{result.stderr[-2000:]}"
