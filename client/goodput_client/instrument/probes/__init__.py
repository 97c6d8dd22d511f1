"""The registry of probes, one per library or part of PyTorch, each installed when its module is imported.
GOODPUT_INSTRUMENT_PROBES_OFF names those to leave out."""

from __future__ import annotations

from .backward import BackwardProbe
from .base import Probe
from .checkpoint import CheckpointProbe, DistributedCheckpointProbe
from .collectives import CollectivesProbe
from .compile import CompileProbe
from .dataloader import DataLoaderProbe
from .evaluation import EvalProbe
from .flops import FlopsProbe
from .lightning import LightningProbe
from .optimizer import OptimizerProbe
from .pipeline import PipelineProbe
from .schedule import ScheduleProbe
from .transformers import TransformersProbe

PROBES: tuple[type[Probe], ...] = (OptimizerProbe, DataLoaderProbe, CheckpointProbe, DistributedCheckpointProbe,
                                   CollectivesProbe, BackwardProbe, CompileProbe, EvalProbe, FlopsProbe,
                                   TransformersProbe, LightningProbe, PipelineProbe,
                                   ScheduleProbe)

__all__ = ["PROBES", "Probe"]
