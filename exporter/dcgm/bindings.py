"""The real DCGM backend: DCGM's own Python bindings (pydcgm), loaded from where DCGM installs them.

They are not on PyPI: they ship with DCGM (datacenter-gpu-manager), under
/usr/share/datacenter-gpu-manager-4/bindings/python3 (DCGM 4) or /usr/local/dcgm/bindings/python3
(older), and load libdcgm.so from the system's library path. `dcgm.bindings_path` names another
directory. Nothing here is imported until the source first connects.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from ..config import DCGM_BINDINGS_PATHS
from .api import GENERIC_ERROR, LIBRARY_NOT_FOUND, DcgmError, DcgmGpu

log = logging.getLogger(__name__)

T = TypeVar("T")
MODULES = ("dcgm_structs", "dcgm_fields", "pydcgm")
KEEP_SAMPLES_FOR = 60.0  # seconds of samples DCGM keeps per field (at least 10 intervals)


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


def _translated(fn: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(fn)
    def wrapper(self: DcgmBindings, *args: Any, **kwargs: Any) -> T:
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

    return wrapper


class DcgmBindings:
    name = "dcgm"

    def __init__(self, bindings_path: str, hostengine: str) -> None:
        self.bindings_path = bindings_path
        self.hostengine = hostengine
        self._modules: dict[str, ModuleType] = {}
        self._handle: Any = None
        self._system: Any = None
        self._group: Any = None
        self._field_group: Any = None

    @_translated
    def connect(self) -> None:
        if not self._modules:
            self._modules = load_bindings(find_bindings(self.bindings_path))
            log.info("dcgm: bindings loaded from %s", os.path.dirname(self._modules["pydcgm"].__file__ or ""))
        pydcgm, structs = self._modules["pydcgm"], self._modules["dcgm_structs"]
        mode = structs.DCGM_OPERATION_MODE_AUTO
        if self.hostengine == "embedded":
            self._handle = pydcgm.DcgmHandle(ipAddress=None, opMode=mode)
        elif self.hostengine.startswith("unix:"):
            self._handle = pydcgm.DcgmHandle(unixSocketPath=self.hostengine.removeprefix("unix:"), opMode=mode)
        else:
            self._handle = pydcgm.DcgmHandle(ipAddress=self.hostengine, opMode=mode)
        self._system = self._handle.GetSystem()
        self._group = self._system.GetDefaultGroup()

    @_translated
    def gpus(self) -> list[DcgmGpu]:
        out = []
        for gpu_id in self._group.GetGpuIds():
            attributes = self._system.discovery.GetGpuAttributes(gpu_id)
            uuid = attributes.identifiers.uuid
            out.append(DcgmGpu(int(gpu_id), uuid.decode() if isinstance(uuid, bytes) else str(uuid)))
        return out

    @_translated
    def watch(self, field_ids: Sequence[int], interval: float) -> None:
        pydcgm = self._modules["pydcgm"]
        self._field_group = pydcgm.DcgmFieldGroup(self._handle, f"goodput_exporter_{os.getpid()}", list(field_ids))
        keep = max(KEEP_SAMPLES_FOR, 10 * interval)
        self._group.samples.WatchFields(self._field_group, int(interval * 1e6), keep, 0)
        self._system.UpdateAllFields(1)  # the first read then finds values

    @_translated
    def latest(self) -> dict[int, dict[int, float]]:
        values = self._group.samples.GetLatest(self._field_group).values
        out: dict[int, dict[int, float]] = {}
        for gpu_id, fields in values.items():
            row = out.setdefault(int(gpu_id), {})
            for field_id, samples in fields.items():
                if samples and not samples[-1].isBlank:
                    row[int(field_id)] = float(samples[-1].value)
        return out

    def disconnect(self) -> None:
        handle, self._handle = self._handle, None
        self._field_group = self._group = self._system = None
        if handle is not None:
            try:
                handle.Shutdown()
            except Exception as exc:  # a dead engine cannot be told goodbye
                log.debug("dcgm: disconnecting failed: %s", exc)
