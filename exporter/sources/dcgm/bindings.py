"""The real DCGM backend: DCGM's own Python bindings (pydcgm), loaded from where DCGM installs them.

They are not on PyPI: they ship with DCGM (datacenter-gpu-manager), under
/usr/share/datacenter-gpu-manager-4/bindings/python3 (DCGM 4) or /usr/local/dcgm/bindings/python3
(older), and load libdcgm.so from the system's library path. `dcgm.bindings_path` names another
directory. Nothing here is imported until the source first connects.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from .api import (
    FE_GPU_I,
    FUNCTION_NOT_FOUND,
    GENERIC_ERROR,
    LIBRARY_NOT_FOUND,
    NOT_SUPPORTED,
    STALE_AFTER_INTERVALS,
    DcgmError,
    DcgmGpu,
    DcgmInstance,
    Entity,
    Latest,
)
from .settings import DCGM_BINDINGS_PATHS

log = logging.getLogger(__name__)

T = TypeVar("T")
MODULES = ("dcgm_structs", "dcgm_fields", "dcgm_agent", "pydcgm")
KEEP_SAMPLES_FOR = 60.0  # seconds of samples DCGM keeps per field (at least 10 intervals)
DISCONNECT_WAIT = 1.0  # seconds disconnect() waits for a DCGM call in another thread to return
_GROUP_SERIAL = itertools.count(1)


def find_bindings(path: str) -> Path:
    """The directory to load the bindings from, or DcgmError(reason=dcgm_bindings_not_found)."""
    candidates = [path] if path else list(DCGM_BINDINGS_PATHS)
    for candidate in candidates:
        if (Path(candidate) / "pydcgm.py").is_file():
            return Path(candidate)
    where = path or " or ".join(DCGM_BINDINGS_PATHS)
    raise DcgmError(LIBRARY_NOT_FOUND, f"DCGM's Python bindings (pydcgm.py) not found in {where}: install DCGM "
                    "(datacenter-gpu-manager) on the node and mount its bindings directory, set "
                    "dcgm.bindings_path, or use dcgm.mode=exporter to read a dcgm-exporter instead",
                    reason="dcgm_bindings_not_found")


def load_bindings(directory: Path) -> dict[str, ModuleType]:
    """Import DCGM's binding modules from `directory` (they import each other by bare name)."""
    entry = str(directory)
    if entry not in sys.path:
        sys.path.insert(0, entry)
    modules: dict[str, ModuleType] = {}
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # whatever a broken installation raises, it is one clear error
            raise DcgmError(LIBRARY_NOT_FOUND, f"importing {name} from {directory} failed: "
                            f"{exc.__class__.__name__}: {exc}", reason="dcgm_bindings_broken") from None
        loaded_from = os.path.dirname(os.path.abspath(getattr(module, "__file__", "") or ""))
        if loaded_from != os.path.abspath(entry):
            log.warning("dcgm: %s was loaded from %s, not %s (imported earlier in this process)",
                        name, loaded_from, entry)
        modules[name] = module
    return modules


def _call(fn: Callable[..., T]) -> Callable[..., T]:
    """Run a DCGM call holding the connection's lock (so `disconnect` from another thread never shuts
    the handle down under it) and translate DCGM's own exceptions into `DcgmError`."""

    @functools.wraps(fn)
    def wrapper(self: DcgmBindings, *args: Any, **kwargs: Any) -> T:
        with self._lock:
            try:
                return fn(self, *args, **kwargs)
            except DcgmError:
                raise
            except Exception as exc:
                # looked up after the call: the first connect() is what imports the bindings
                error_class = getattr(self._modules.get("dcgm_structs"), "DCGMError", None)
                if error_class is not None and isinstance(exc, error_class):
                    raise DcgmError(int(getattr(exc, "value", GENERIC_ERROR)), str(exc)) from None
                raise
            finally:
                if self._close_pending:  # disconnect() gave up waiting for this call: finish it now
                    self._close_pending = False
                    self._shutdown()

    return wrapper


class DcgmBindings:
    name = "dcgm"

    def __init__(self, bindings_path: str, hostengine: str, wall_clock: Callable[[], float] = time.time) -> None:
        self.bindings_path = bindings_path
        self.hostengine = hostengine
        self._wall_clock = wall_clock  # DCGM stamps samples in microseconds since the epoch
        self._lock = threading.RLock()
        self._close_pending = False
        self._modules: dict[str, ModuleType] = {}
        self._handle: Any = None
        self._system: Any = None
        self._group: Any = None  # the default group: every GPU, to list them
        self._watched: Any = None  # the group of the entities watched
        self._field_group: Any = None
        self._hierarchy_logged = False
        self._interval = 1.0

    @_call
    def connect(self) -> None:
        if not self._modules:
            self._modules = load_bindings(find_bindings(self.bindings_path))
            log.info("dcgm: bindings loaded from %s", os.path.dirname(self._modules["pydcgm"].__file__ or ""))
        self._shutdown()  # a handle left from an earlier connection is closed, never leaked
        pydcgm, structs = self._modules["pydcgm"], self._modules["dcgm_structs"]
        mode = structs.DCGM_OPERATION_MODE_AUTO
        if self.hostengine == "embedded":
            self._handle = pydcgm.DcgmHandle(ipAddress=None, opMode=mode)
        elif self.hostengine.startswith("unix:"):
            self._handle = pydcgm.DcgmHandle(unixSocketPath=self.hostengine.removeprefix("unix:"), opMode=mode)
        else:  # HOST or HOST:PORT, as DCGM's connect takes them
            self._handle = pydcgm.DcgmHandle(ipAddress=self.hostengine, opMode=mode)
        self._system = self._handle.GetSystem()
        self._group = self._system.GetDefaultGroup()

    @_call
    def gpus(self) -> list[DcgmGpu]:
        out = []
        for gpu_id in self._group.GetGpuIds():
            attributes = self._system.discovery.GetGpuAttributes(gpu_id)
            uuid = attributes.identifiers.uuid
            out.append(DcgmGpu(int(gpu_id), uuid.decode() if isinstance(uuid, bytes) else str(uuid)))
        return out

    @_call
    def gpu_instances(self) -> list[DcgmInstance]:
        agent = self._modules["dcgm_agent"]
        try:
            hierarchy = agent.dcgmGetGpuInstanceHierarchy(self._handle.handle)
        except Exception as exc:
            # DCGM before 2.0 has no MIG hierarchy (no such function, or NOT_SUPPORTED): no instances; any
            # other error (a lost connection) is the caller's, translated by @_call
            if not isinstance(exc, AttributeError) and getattr(exc, "value", None) not in (NOT_SUPPORTED,
                                                                                         FUNCTION_NOT_FOUND):
                raise
            if not self._hierarchy_logged:
                self._hierarchy_logged = True
                log.info("dcgm: DCGM did not give its MIG hierarchy (%s); watching whole GPUs only", exc)
            return []
        out = []
        for item in hierarchy.entityList[: hierarchy.count]:
            if item.entity.entityGroupId == FE_GPU_I:
                out.append(DcgmInstance(int(item.entity.entityId), int(item.parent.entityId),
                                        int(item.info.nvmlInstanceId)))
        return out

    @_call
    def watch(self, field_ids: Sequence[int], interval: float, entities: Sequence[Entity]) -> None:
        pydcgm = self._modules["pydcgm"]
        self._delete_groups()
        # DCGM wants group names unique; one per connection, never reused in this process
        name = f"goodput_exporter_{os.getpid()}_{next(_GROUP_SERIAL)}"
        self._watched = self._system.GetEmptyGroup(name)
        for entity_group, entity_id in entities:
            self._watched.AddEntity(entity_group, entity_id)
        self._field_group = pydcgm.DcgmFieldGroup(self._handle, name, list(field_ids))
        keep = max(KEEP_SAMPLES_FOR, 10 * interval)
        self._watched.samples.WatchFields(self._field_group, int(interval * 1e6), keep, 0)
        self._interval = interval
        self._system.UpdateAllFields(1)  # the first read then finds values

    @_call
    def latest(self) -> Latest:
        values = self._watched.samples.GetLatest_v2(self._field_group).values
        oldest = (self._wall_clock() - STALE_AFTER_INTERVALS * self._interval) * 1e6
        out = Latest()
        for entity_group, entities in values.items():
            for entity_id, fields in entities.items():
                row = out.values.setdefault((int(entity_group), int(entity_id)), {})
                for field_id, samples in fields.items():
                    if not samples or samples[-1].isBlank:
                        continue  # no value (yet), or none for this entity
                    sample = samples[-1]
                    if sample.ts < oldest:  # DCGM's sampler stopped updating this field
                        out.stale += 1
                        continue
                    row[int(field_id)] = float(sample.value)
        return out

    def disconnect(self) -> None:
        """Close the connection. If a DCGM call is running in another thread (a hung collection), the
        handle is shut down when that call returns, never under it."""
        if not self._lock.acquire(timeout=DISCONNECT_WAIT):
            self._close_pending = True
            log.warning("dcgm: a DCGM call is still running; the connection is closed when it returns")
            return
        try:
            self._shutdown()
        finally:
            self._lock.release()

    def _delete_groups(self) -> None:
        for attribute in ("_field_group", "_watched"):
            group = getattr(self, attribute)
            setattr(self, attribute, None)
            if group is not None:
                try:
                    group.Delete()
                except Exception as exc:  # the engine may be gone; the group goes with it
                    log.debug("dcgm: deleting a group failed: %s", exc)

    def _shutdown(self) -> None:
        """Under the lock: free the groups, then the handle."""
        if self._handle is not None:
            self._delete_groups()
        self._field_group = self._watched = None
        handle, self._handle = self._handle, None
        self._group = self._system = None
        if handle is not None:
            try:
                handle.Shutdown()
            except Exception as exc:  # a dead engine cannot be told goodbye
                log.debug("dcgm: disconnecting failed: %s", exc)
