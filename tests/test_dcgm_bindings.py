"""The real DCGM bindings adapter (`DcgmBindings`) against fake DCGM binding modules.

The fakes are Python files written to tmp_path and loaded through the real loader, like DCGM's own
bindings directory: dcgm_structs (DCGMError with DCGM's status codes), dcgm_fields, dcgm_agent (a
fake host engine: open handles, field groups, samples), DcgmFieldGroup (with the class-level
registry the real one keeps) and pydcgm (DcgmHandle, system, default group, samples.GetLatest with
DCGM's sample objects: ts in microseconds since the epoch, value, isBlank). Only the surface the
adapter uses is there; the behaviour follows DCGM's documented API.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import ManualClock

from exporter.config import load
from exporter.core.gpus import NodeGpus
from exporter.core.source import SourceError
from exporter.sources.dcgm import bindings as bindings_module
from exporter.sources.dcgm.api import (
    CONNECTION_NOT_VALID,
    FE_GPU,
    FE_GPU_I,
    FI_PROF_DRAM_ACTIVE,
    FI_PROF_PIPE_TENSOR_ACTIVE,
    FI_PROF_SM_ACTIVE,
    PROFILING_FIELDS,
    PROFILING_NOT_SUPPORTED,
    DcgmError,
)
from exporter.sources.dcgm.bindings import DcgmBindings
from exporter.sources.dcgm.source import DcgmSource

FAKE_MODULES = {
    "dcgm_structs.py": '''
DCGM_ST_OK = 0
DCGM_ST_GENERIC_ERROR = -3
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_DUPLICATE_KEY = -26
DCGM_ST_PROFILING_NOT_SUPPORTED = -36
DCGM_OPERATION_MODE_AUTO = 1

class DCGMError(Exception):
    value = DCGM_ST_GENERIC_ERROR
    def __str__(self):
        return "fake DCGM error %d" % self.value

_classes = {}

def dcgmExceptionClass(code):
    if code not in _classes:
        _classes[code] = type("DCGMError_%d" % -code, (DCGMError,), {"value": code})
    return _classes[code]
''',
    "dcgm_fields.py": '''
DCGM_FI_PROF_SM_ACTIVE = 1002
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE = 1004
DCGM_FI_PROF_DRAM_ACTIVE = 1005
''',
    "dcgm_agent.py": '''
import threading
import dcgm_structs

class Engine:
    """The fake host engine's state; tests reach it as sys.modules["dcgm_agent"].ENGINE."""
    def __init__(self):
        self.connects = []            # (ipAddress, unixSocketPath) per DcgmHandle made
        self.open_handles = set()
        self.field_groups = {}        # name -> field ids, as the engine holds them
        self.watches = []             # (field group name, update usec, keep seconds)
        self.gpus = {0: "GPU-00000000-1111-2222-3333-444444444444", 1: b"GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"}
        # (entity group, entity id) -> field -> list of (ts usec, value, blank); by default a fresh value
        # of GPU 0, so that a collection has something usable
        self.samples = {(1, 0): {1002: [(1_700_000_000_000_000, 0.5, False)]}}
        self.hierarchy = []           # MIG GPU instances: (entity id, parent GPU id, NVML instance id)
        self.groups = {}              # entity group name -> entities added, as the engine holds them
        self.fail = {}                # call name -> exception to raise
        self.gate = None              # a threading.Event GetLatest waits on, when set
        self.in_call = 0
        self.shutdown_during_call = 0
        self.lock = threading.Lock()
        self.next_handle = 1

    def check(self, call):
        error = self.fail.get(call)
        if error is not None:
            raise error

ENGINE = Engine()

def error(code):
    return dcgm_structs.dcgmExceptionClass(code)()

class _Pair:
    def __init__(self, group, entity):
        self.entityGroupId, self.entityId = group, entity

class _Info:
    def __init__(self, instance):
        self.nvmlInstanceId = instance

class _HierarchyItem:
    def __init__(self, entity, parent, instance):
        self.entity, self.parent, self.info = _Pair(4, entity), _Pair(1, parent), _Info(instance)

class _Hierarchy:
    def __init__(self, items):
        self.count = len(items)
        # a fixed-size array in DCGM: entries past `count` are whatever was there
        self.entityList = items + [_HierarchyItem(999, 7, 99)]

def dcgmGetGpuInstanceHierarchy(handle):
    ENGINE.check("hierarchy")
    return _Hierarchy([_HierarchyItem(*item) for item in ENGINE.hierarchy])
''',
    "DcgmFieldGroup.py": '''
import threading
import dcgm_agent
import dcgm_structs

class DcgmFieldGroup:
    groups = {}  # like DCGM's: a process-wide registry of the groups created
    groupLock = threading.RLock()

    def __init__(self, dcgmHandle, name="", fieldIds=None, fieldGroupId=None):
        engine = dcgm_agent.ENGINE
        engine.check("field_group")
        if name in engine.field_groups:
            raise dcgm_agent.error(dcgm_structs.DCGM_ST_DUPLICATE_KEY)
        engine.field_groups[name] = list(fieldIds or [])
        self.name, self.fieldIds, self._dcgmHandle = name, list(fieldIds or []), dcgmHandle
        self.fieldGroupId = name
        with DcgmFieldGroup.groupLock:
            DcgmFieldGroup.groups[name] = self

    def Delete(self):
        engine = dcgm_agent.ENGINE
        with DcgmFieldGroup.groupLock:
            DcgmFieldGroup.groups.pop(self.fieldGroupId, None)
        engine.check("field_group_delete")
        engine.field_groups.pop(self.fieldGroupId, None)
        self.fieldGroupId = None
''',
    "pydcgm.py": '''
import time
import dcgm_agent
import dcgm_structs
from DcgmFieldGroup import DcgmFieldGroup

class _Value:
    def __init__(self, ts, value, blank):
        self.ts, self.value, self.isBlank = ts, value, blank

class _Collection:
    def __init__(self, values):
        self.values = values

class _Identifiers:
    def __init__(self, uuid):
        self.uuid = uuid

class _Attributes:
    def __init__(self, uuid):
        self.identifiers = _Identifiers(uuid)

class _Discovery:
    def GetGpuAttributes(self, gpu_id):
        dcgm_agent.ENGINE.check("attributes")
        return _Attributes(dcgm_agent.ENGINE.gpus[gpu_id])

class _Samples:
    def __init__(self, handle, group=None):
        self._handle, self._group = handle, group

    def WatchFields(self, fieldGroup, updateFreq, maxKeepAge, maxKeepSamples):
        engine = dcgm_agent.ENGINE
        engine.check("watch")
        if fieldGroup.fieldGroupId not in engine.field_groups:
            raise dcgm_agent.error(dcgm_structs.DCGM_ST_GENERIC_ERROR)
        engine.watches.append((fieldGroup.fieldGroupId, updateFreq, maxKeepAge))

    def GetLatest_v2(self, fieldGroup):
        engine = dcgm_agent.ENGINE
        with engine.lock:
            engine.in_call += 1
        try:
            if engine.gate is not None:
                engine.gate.wait(10)
            if self._handle.handle is None:
                raise dcgm_agent.error(dcgm_structs.DCGM_ST_CONNECTION_NOT_VALID)
            engine.check("latest")
            out = {}
            for entity in engine.groups[self._group]:
                fields = engine.samples.get(entity, {})
                out.setdefault(entity[0], {})[entity[1]] = {
                    f: [_Value(*s) for s in series] for f, series in fields.items() if f in fieldGroup.fieldIds}
            return _Collection(out)
        finally:
            with engine.lock:
                engine.in_call -= 1

class _EntityGroup:
    def __init__(self, handle, name):
        engine = dcgm_agent.ENGINE
        engine.check("group")
        engine.groups[name] = []
        self._name = name
        self.samples = _Samples(handle, name)

    def AddEntity(self, entityGroupId, entityId):
        dcgm_agent.ENGINE.groups[self._name].append((entityGroupId, entityId))

    def Delete(self):
        engine = dcgm_agent.ENGINE
        engine.check("group_delete")
        engine.groups.pop(self._name, None)

class _Group:
    def __init__(self, handle):
        self.samples = _Samples(handle)

    def GetGpuIds(self):
        dcgm_agent.ENGINE.check("gpus")
        return list(dcgm_agent.ENGINE.gpus)

class DcgmSystem:
    def __init__(self, handle):
        self._handle = handle
        self.discovery = _Discovery()

    def GetDefaultGroup(self):
        return _Group(self._handle)

    def GetEmptyGroup(self, groupName):
        return _EntityGroup(self._handle, groupName)

    def UpdateAllFields(self, waitForUpdate):
        dcgm_agent.ENGINE.check("update")

class DcgmHandle:
    def __init__(self, handle=None, ipAddress=None, opMode=dcgm_structs.DCGM_OPERATION_MODE_AUTO,
                 persistAfterDisconnect=False, unixSocketPath=None, timeoutMs=0):
        engine = dcgm_agent.ENGINE
        if ipAddress is not None and unixSocketPath is not None:
            raise dcgm_agent.error(dcgm_structs.DCGM_ST_GENERIC_ERROR)
        engine.connects.append((ipAddress, unixSocketPath))
        engine.check("connect")
        self.handle = engine.next_handle
        engine.next_handle += 1
        engine.open_handles.add(self.handle)

    def GetSystem(self):
        return DcgmSystem(self)

    def Shutdown(self):
        engine = dcgm_agent.ENGINE
        if engine.in_call:
            engine.shutdown_during_call += 1
        engine.open_handles.discard(self.handle)
        self.handle = None
''',
}
FAKE_NAMES = ("dcgm_structs", "dcgm_fields", "dcgm_agent", "DcgmFieldGroup", "pydcgm")
NOW = 1_700_000_000.0  # the wall clock the adapter judges sample ages by
GPUS = [(FE_GPU, 0), (FE_GPU, 1)]


@pytest.fixture
def fake_dcgm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fake bindings directory; the modules are unloaded again after the test."""
    directory = tmp_path / "bindings"
    directory.mkdir()
    for name, text in FAKE_MODULES.items():
        (directory / name).write_text(text.lstrip())
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in FAKE_NAMES:
        sys.modules.pop(name, None)
    yield directory
    for name in FAKE_NAMES:
        sys.modules.pop(name, None)


def engine() -> Any:
    return sys.modules["dcgm_agent"].ENGINE  # type: ignore[attr-defined]


def structs() -> ModuleType:
    return sys.modules["dcgm_structs"]


def dcgm_error(code: int) -> Exception:
    return structs().dcgmExceptionClass(code)()  # type: ignore[no-any-return]


def make(directory: Path, hostengine: str = "localhost") -> DcgmBindings:
    return DcgmBindings(str(directory), hostengine, wall_clock=lambda: NOW)


def usec(t: float) -> int:
    return int(t * 1e6)


def dcgm_config(**keys: object):  # type: ignore[no-untyped-def]
    return load(None, {"dcgm": {"enabled": True, "interval": "1s", **keys}}, environ={}).dcgm


def test_connect_gpus_watch_latest_through_the_bindings(fake_dcgm: Path) -> None:
    dcgm = make(fake_dcgm)
    dcgm.connect()
    assert dcgm.gpus() == [
        bindings_module.DcgmGpu(0, "GPU-00000000-1111-2222-3333-444444444444"),
        bindings_module.DcgmGpu(1, "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"),  # bytes from DCGM, decoded
    ]
    dcgm.watch(PROFILING_FIELDS, 0.5, GPUS)
    ((name, update_usec, keep),) = engine().watches
    assert update_usec == 500_000 and keep >= 5.0
    assert engine().field_groups[name] == list(PROFILING_FIELDS)
    engine().samples = {
        (FE_GPU, 0): {FI_PROF_SM_ACTIVE: [(usec(NOW - 1.0), 0.25, False), (usec(NOW - 0.5), 0.75, False)],
            FI_PROF_DRAM_ACTIVE: [(usec(NOW - 0.5), 0.5, False)]},
        (FE_GPU, 1): {FI_PROF_SM_ACTIVE: [(usec(NOW - 0.5), None, True)],  # a blank: no value for this GPU
            FI_PROF_PIPE_TENSOR_ACTIVE: []},
    }
    latest = dcgm.latest()
    assert latest.values == {(FE_GPU, 0): {FI_PROF_SM_ACTIVE: 0.75, FI_PROF_DRAM_ACTIVE: 0.5}, (FE_GPU, 1): {}}
    assert latest.stale == 0


@pytest.mark.parametrize(("hostengine", "expected"), [
    ("localhost", ("localhost", None)),
    ("10.1.2.3:5555", ("10.1.2.3:5555", None)),
    ("unix:/run/nvidia-dcgm/socket", (None, "/run/nvidia-dcgm/socket")),
    ("embedded", (None, None)),  # neither: DCGM starts its engine in this process
])
def test_hostengine_setting_picks_how_dcgm_connects(fake_dcgm: Path, hostengine: str,
                                                    expected: tuple[str | None, str | None]) -> None:
    dcgm = make(fake_dcgm, hostengine)
    dcgm.connect()
    assert engine().connects == [expected]


def test_dcgm_errors_are_translated_including_the_first_connect(fake_dcgm: Path) -> None:
    import importlib

    sys.path.insert(0, str(fake_dcgm))
    importlib.import_module("dcgm_agent")  # only to reach the fake engine before the first connect
    engine().fail["connect"] = dcgm_error(CONNECTION_NOT_VALID)
    dcgm = make(fake_dcgm)
    with pytest.raises(DcgmError) as info:
        dcgm.connect()  # the call that imports the bindings raises DCGM's own error class
    assert info.value.code == CONNECTION_NOT_VALID and info.value.reason == "dcgm_connection_not_valid"
    engine().fail.clear()
    dcgm.connect()
    engine().fail["watch"] = dcgm_error(PROFILING_NOT_SUPPORTED)
    with pytest.raises(DcgmError) as info:
        dcgm.watch(PROFILING_FIELDS, 1.0, GPUS)
    assert info.value.reason == "dcgm_profiling_not_supported"
    engine().fail["latest"] = ValueError("not DCGM's")  # anything else is not dressed up as DCGM's
    with pytest.raises(ValueError):
        dcgm.latest()


def test_samples_older_than_three_intervals_are_dropped_and_counted(fake_dcgm: Path) -> None:
    dcgm = make(fake_dcgm)
    dcgm.connect()
    dcgm.watch(PROFILING_FIELDS, 1.0, GPUS)
    engine().samples = {(FE_GPU, 0): {FI_PROF_SM_ACTIVE: [(usec(NOW - 2.5), 0.5, False)],
                            FI_PROF_DRAM_ACTIVE: [(usec(NOW - 3.5), 0.9, False)],
                            FI_PROF_PIPE_TENSOR_ACTIVE: [(usec(NOW - 600), 0.1, False)]}}
    latest = dcgm.latest()
    assert latest.values == {(FE_GPU, 0): {FI_PROF_SM_ACTIVE: 0.5}, (FE_GPU, 1): {}}
    assert latest.stale == 2
    # through the source: counted per collection, and the fresh value still exported
    inventory = NodeGpus()
    inventory.record(engine().gpus[0], "0")
    source = DcgmSource(dcgm_config(bindings_path=str(fake_dcgm)), make(fake_dcgm), inventory)
    batch = source.collect()
    assert batch.errors.count("dcgm_stale_sample") == 2
    assert [rows for metric, rows in batch.series.items() if metric.name == "goodput_gpu_sm_active_ratio"] == [
        [(("0", engine().gpus[0], ""), 0.5)]]


def test_reconnecting_closes_the_old_handle_and_frees_the_field_group(fake_dcgm: Path) -> None:
    dcgm = make(fake_dcgm)
    for _ in range(3):  # each round: a new connection, a new field group; DCGM wants unique names
        dcgm.connect()
        dcgm.watch(PROFILING_FIELDS, 1.0, GPUS)
        assert len(engine().open_handles) == 1
        assert len(engine().field_groups) == 1
    field_group_class = sys.modules["DcgmFieldGroup"].DcgmFieldGroup  # type: ignore[attr-defined]
    assert len(field_group_class.groups) == 1
    assert len({name for name, _, _ in engine().watches}) == 3
    assert len(engine().groups) == 1  # the entity group of the last round only
    dcgm.disconnect()
    assert engine().open_handles == set()
    assert engine().field_groups == {} and field_group_class.groups == {} and engine().groups == {}


def test_field_group_that_cannot_be_deleted_does_not_stop_the_shutdown(fake_dcgm: Path) -> None:
    dcgm = make(fake_dcgm)
    dcgm.connect()
    dcgm.watch(PROFILING_FIELDS, 1.0, GPUS)
    engine().fail["field_group_delete"] = dcgm_error(CONNECTION_NOT_VALID)
    dcgm.disconnect()
    assert engine().open_handles == set()


@pytest.mark.parametrize("failing", ["gpus", "attributes", "watch", "update", "field_group"])
def test_failing_collections_leak_no_handles(fake_dcgm: Path, failing: str) -> None:
    source = DcgmSource(dcgm_config(), make(fake_dcgm), clock=ManualClock())
    source.collect()  # loads the fakes; nothing fails yet
    source.close()  # the next collection connects again
    engine().fail[failing] = RuntimeError("the bindings broke in a way that is not a DCGMError")
    for _ in range(5):
        with pytest.raises(RuntimeError):
            source.collect()
        assert len(engine().open_handles) == 0
    engine().fail.clear()
    source.collect()
    assert len(engine().open_handles) == 1
    source.close()
    assert engine().open_handles == set()


def test_failing_dcgm_errors_leak_no_handles_either(fake_dcgm: Path) -> None:
    source = DcgmSource(dcgm_config(), make(fake_dcgm), clock=ManualClock())
    source.collect()
    engine().fail["latest"] = dcgm_error(CONNECTION_NOT_VALID)
    for _ in range(5):
        with pytest.raises(SourceError) as info:
            source.collect()
        assert info.value.reason == "dcgm_connection_not_valid"
        assert len(engine().open_handles) <= 1  # the failing read dropped it; the next one reconnects
    assert len(engine().connects) == 5  # the first, then one per collection after a lost connection


def test_close_while_a_dcgm_call_runs_waits_for_it(fake_dcgm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bindings_module, "DISCONNECT_WAIT", 0.05)
    dcgm = make(fake_dcgm)
    dcgm.connect()
    dcgm.watch(PROFILING_FIELDS, 1.0, GPUS)
    engine().gate = gate = threading.Event()
    reader = threading.Thread(target=dcgm.latest)
    reader.start()
    deadline = time.monotonic() + 10
    while not engine().in_call and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine().in_call == 1  # latest() is inside DCGM now
    dcgm.disconnect()  # e.g. the daemon stopping while a collection hangs: must not shut down under it
    assert engine().shutdown_during_call == 0
    assert len(engine().open_handles) == 1
    gate.set()
    reader.join(10)
    assert not reader.is_alive()
    assert engine().shutdown_during_call == 0
    assert engine().open_handles == set()  # shut down as soon as the call returned


def test_source_reports_a_fresh_error_each_time_profiling_is_unavailable(fake_dcgm: Path) -> None:
    clock = ManualClock()
    source = DcgmSource(dcgm_config(), make(fake_dcgm), clock=clock)
    source.collect()
    source.close()
    engine().fail["watch"] = dcgm_error(PROFILING_NOT_SUPPORTED)
    errors = []
    for _ in range(3):
        with pytest.raises(SourceError) as info:
            source.collect()
        errors.append(info.value)
        clock.advance(1)
    assert [e.reason for e in errors] == ["dcgm_profiling_not_supported"] * 3
    assert len({id(e) for e in errors}) == 3  # never one instance re-raised (its traceback would grow)
    assert engine().open_handles == set()


def test_a_gpu_in_mig_mode_is_watched_per_gpu_instance_like_dcgm_exporters_default(fake_dcgm: Path) -> None:
    import importlib

    sys.path.insert(0, str(fake_dcgm))
    importlib.import_module("dcgm_agent")
    # GPU 1 is in MIG mode with two GPU instances (DCGM entities 8 and 9; NVML instance ids 1 and 2)
    engine().hierarchy = [(8, 1, 1), (9, 1, 2)]
    engine().samples = {
        (FE_GPU, 0): {FI_PROF_SM_ACTIVE: [(usec(NOW - 0.5), 0.5, False)]},
        (FE_GPU, 1): {FI_PROF_SM_ACTIVE: [(usec(NOW - 0.5), 0.9, False)]},  # not watched: in MIG mode
        (FE_GPU_I, 8): {FI_PROF_SM_ACTIVE: [(usec(NOW - 0.5), 0.25, False)]},
        (FE_GPU_I, 9): {FI_PROF_SM_ACTIVE: [(usec(NOW - 0.5), 0.75, False)],
                        FI_PROF_DRAM_ACTIVE: [(usec(NOW - 0.5), 9.5e18, False)]},  # an unmarked blank
    }
    inventory = NodeGpus()
    inventory.record(engine().gpus[0], "0")
    inventory.record(engine().gpus[1].decode(), "1")
    source = DcgmSource(dcgm_config(bindings_path=str(fake_dcgm)), make(fake_dcgm), inventory)
    batch = source.collect()
    (watched,) = engine().groups.values()
    assert sorted(watched) == [(FE_GPU, 0), (FE_GPU_I, 8), (FE_GPU_I, 9)]
    rows = {labels: v for metric, series in batch.series.items() if metric.name == "goodput_gpu_sm_active_ratio"
            for labels, v in series}
    uuid1 = engine().gpus[1].decode()
    assert rows == {("0", engine().gpus[0], ""): 0.5, ("1", uuid1, "1"): 0.25, ("1", uuid1, "2"): 0.75}
    assert not [rows for metric, rows in batch.series.items() if metric.name == "goodput_gpu_dram_active_ratio"]
    assert batch.errors.count("dcgm_blank_value") == 1


def test_without_a_mig_hierarchy_older_dcgm_watches_whole_gpus(fake_dcgm: Path) -> None:
    dcgm = make(fake_dcgm)
    dcgm.connect()
    engine().fail["hierarchy"] = dcgm_error(-6)  # DCGM before 2.0: NOT_SUPPORTED
    assert dcgm.gpu_instances() == []
    engine().fail["hierarchy"] = dcgm_error(CONNECTION_NOT_VALID)  # anything else is not "no MIG"
    with pytest.raises(DcgmError) as info:
        dcgm.gpu_instances()
    assert info.value.code == CONNECTION_NOT_VALID
