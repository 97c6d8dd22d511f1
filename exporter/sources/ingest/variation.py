"""How much a rank's own work varies from step to step: the mark of the random straggler kind.

A rank's own time in a step is the seconds of its phases other than comm_wait reported between its previous step
and this one (untracked is nobody's own). When the work per step is the same each step (a steady model and batch
shape), it barely varies, even on a slow node or a pipeline stage slower by construction; when batches differ from
step to step (sequence lengths, uneven samples), it does, and the slowest rank changes from step to step: every rank
waits for another in turn. ByteDance's straggler study (OSDI 2025) calls that kind random; on its published traces
the measure below is 0.006 and 0.007 for the worker and stage kinds and 0.117 for the random one.

The measure is robust to the odd checkpoint or evaluation step: the interquartile range of the last STEPS own times
over 1.349 times their median (a normal distribution's standard deviation over its mean). Kept in memory only: after
a daemon restart it is back within MIN_STEPS steps.
"""

from __future__ import annotations

import statistics
from array import array

from goodput_client.contract import DEPRECATED_PHASES

STEPS = 64  # own times kept per rank: 512 bytes
MIN_STEPS = 32  # published from this many steps with phases on: the first steps' warm-up (compilation, allocation)
# stays within the interquartile range's 25% on either side once there are that many
WAIT_PHASE = "comm_wait"  # a wait for peers: not the rank's own time
IQR_PER_SIGMA = 1.349  # a normal distribution's interquartile range, in standard deviations


class OwnVariation:
    """The own times of a rank's last STEPS steps (those with phases), in a ring."""

    __slots__ = ("_next", "_pending", "_times")

    def __init__(self) -> None:
        self._times = array("d")
        self._next = 0
        self._pending = 0.0  # own seconds since the last step

    def phase(self, name: str, seconds: float) -> None:
        if DEPRECATED_PHASES.get(name, name) != WAIT_PHASE:
            self._pending += seconds

    def step(self) -> None:
        """A step ended: its own time joins the ring (a step with no own phase reported is left out)."""
        own, self._pending = self._pending, 0.0
        if own <= 0.0:
            return
        if len(self._times) < STEPS:
            self._times.append(own)
        else:
            self._times[self._next] = own
            self._next = (self._next + 1) % STEPS

    def restart(self) -> None:
        """A new process: what it had pending belongs to no step."""
        self._pending = 0.0

    def value(self) -> float | None:
        """The robust coefficient of variation of the kept own times; None below MIN_STEPS of them."""
        if len(self._times) < MIN_STEPS:
            return None
        q1, median, q3 = statistics.quantiles(self._times, n=4)
        return (q3 - q1) / IQR_PER_SIGMA / median if median > 0 else None
