"""What the sitecustomize runs at interpreter start, in every Python process of an instrumented command: read the
settings, make the process's recorder, and have each probe installed when its library is imported. Nothing here
imports PyTorch or opens a socket; a process that never trains stays silent. Never raises."""

from __future__ import annotations

import os
import time

from .probes.base import LOGGER

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .recorder import Recorder

# the flight recorder's ring (entries): TORCH_FR_BUFFER_SIZE since PyTorch 2.7 (which warns about the older name),
# TORCH_NCCL_TRACE_BUFFER_SIZE before
FR_BUFFER_ENVS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_BUFFER_ENTRIES = "2000"  # PyTorch's own default where it turns the recorder on by itself
FR_DUMP_ENV = "TORCH_FR_DUMP_TEMP_FILE"  # where NCCL's dump on a timeout goes: the node's flight dir
# NCCL's per-collective timing (CUDA events around each collective): the durations in the flight recorder's entries,
# from which the rules derive each rank's wait on the GPU, where its CPU does not wait
NCCL_TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"
NCCL_TIMING_OFF = "nccl_timing"  # its name in GOODPUT_INSTRUMENT_PROBES_OFF

recorder: Recorder | None = None  # this process's, once booted


def boot() -> Recorder | None:
    global recorder
    if recorder is not None:
        return recorder
    started = time.perf_counter()
    try:
        from .settings import from_environment

        settings = from_environment()
        if not settings.enabled:
            return None
        from .hooks import when_imported
        from .probes import PROBES
        from .recorder import Recorder, watch_explicit

        recorder = Recorder(settings, started)
        watch_explicit(recorder)
        os.register_at_fork(after_in_child=recorder.after_fork)
        _flight_dump_environment(settings.flight_dir)
        if NCCL_TIMING_OFF not in settings.probes_off:
            _nccl_timing_environment()
        when_imported("torch", _flight_recorder_on)
        for probe_class in PROBES:
            if probe_class.name in settings.probes_off:
                continue
            probe = probe_class(recorder)
            recorder.probes.append(probe)
            for module in probe.modules:
                when_imported(module, probe.instrument)
    except Exception as exc:  # never into the job: it runs without instrumentation
        import logging

        logging.getLogger(LOGGER).warning("goodput-instrument: not loaded: %s: %s", exc.__class__.__name__, exc)
        recorder = None
    return recorder


def _nccl_timing_environment() -> None:
    """In a rank: NCCL times each collective on the GPU (TORCH_NCCL_ENABLE_TIMING=1), unless the job set it itself.
    Read by ProcessGroupNCCL when it starts; gloo ignores it."""
    if not (os.environ.get("RANK") or os.environ.get("SLURM_PROCID")) or NCCL_TIMING_ENV in os.environ:
        return
    from ..launcher import rank_from

    if rank_from(os.environ) is not None:
        os.environ[NCCL_TIMING_ENV] = "1"


def _flight_dump_environment(directory: str) -> None:
    """In a rank (the launcher named one): NCCL's dump on a timeout written where the daemon reads it, unless the job
    names another place itself."""
    if not (os.environ.get("RANK") or os.environ.get("SLURM_PROCID")):  # not a rank: the launcher's module not loaded
        return
    from ..launcher import rank_from, workload_from

    if rank_from(os.environ) is None:
        return
    workload = workload_from(os.environ)
    if workload and not os.environ.get(FR_DUMP_ENV) and os.path.isdir(directory):
        from ..contract import FLIGHT_DUMP_PREFIX, workload_folder

        os.environ[FR_DUMP_ENV] = os.path.join(directory, workload_folder(workload), FLIGHT_DUMP_PREFIX)


def _flight_recorder_on(torch: object) -> None:
    """Once torch is imported, before torch.distributed starts a process group: in a rank, the flight recorder on
    (its ring sized), under the name this PyTorch reads, unless the job sized it itself."""
    try:
        from ..launcher import rank_from

        if rank_from(os.environ) is None or any(os.environ.get(name) for name in FR_BUFFER_ENVS):
            return
        c10d = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
        name = FR_BUFFER_ENVS[0] if hasattr(c10d, "_dump_fr_trace") else FR_BUFFER_ENVS[1]
        os.environ[name] = FR_BUFFER_ENTRIES
    except Exception as exc:  # never into the job
        import logging

        logging.getLogger(LOGGER).warning("goodput-instrument: flight recorder not set up: %s", exc)
