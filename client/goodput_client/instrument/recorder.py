"""The process's automatic reporter: what the probes measured, turned into the client's events.

Time is cut into windows, one per optimizer step: from the end of one step (or the start of training) to the end of
the next. The probes report phases as they end (data_wait, comm_wait, checkpoint_save, checkpoint_restore, compile,
eval); at the end of a window its step is sent, and "compute" is the rest of the window, the time no other phase
covers. Only the outermost phase counts: a torch.save inside a Trainer's checkpoint, a DataLoader wait inside an
evaluation, are its outer phase's time. So the phases never overlap, and with the "startup" phase (interpreter start
to the start of training) and the untracked rest (after the last step) they add up to the process's elapsed time.

Training starts (the reporter activates) when the process builds its first optimizer, or a Trainer starts: a
process that never does (pip, a DataLoader worker, a tokenizer helper, `python -c`) never opens the socket. What the
probes saw before (a checkpoint loaded, a model compiled) is sent then. Only the thread that started training is
measured.

An explicit `Telemetry` made in the process takes precedence: events go into it rather than into a second reporter,
and only for what it does not report itself (steps, or a phase by name, once it was asked for them), and never
while one of its phase blocks is open. One made after training started takes over from the automatic reporter.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import weakref

from ..contract import DEFAULT_SOCKET, SOCKET_ENV
from ..telemetry import Telemetry
from .probes.base import LOGGER

TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging
    from collections.abc import Callable

    from .probes.base import Probe
    from .settings import Settings

_perf = time.perf_counter
# the unpatched method (watch_explicit wraps it to learn what an explicit Telemetry reports)
_record_step = Telemetry.record_step
NOT_STEP = frozenset({"eval", "checkpoint_save", "checkpoint_restore", "compile", "startup"})  # outside the step


def _log() -> logging.Logger:
    import logging  # on demand: most interpreters never log

    return logging.getLogger(LOGGER)


class Recorder:
    """One per process (made by the bootstrap). Hot-path methods check `self.live` first."""

    def __init__(self, settings: Settings, boot: float) -> None:
        self.settings = settings
        self.boot = boot  # perf_counter at interpreter start (the sitecustomize)
        self.state = "waiting"  # waiting: no training seen yet; active; off
        self.thread = threading.main_thread().ident  # the measured thread
        self.telemetry: Telemetry | None = None  # where events go: the automatic reporter, or the explicit one
        self.own = False  # whether self.telemetry is the automatic one
        self.explicit: Telemetry | None = None
        self.explicit_kinds: set[str] = set()
        # into an explicit reporter, phases wait for the first optimizer step: by then the loop has called whatever
        # the explicit one reports itself (its step block, its phases), and those kinds are left to it
        self.deferred: dict[str, float] | None = None
        self.probes: list = []  # type: ignore[type-arg]
        self.depth = 0  # phases open now (only the outermost counts)
        self.reported = 0.0  # seconds of every phase reported so far (never reset: probes compare two readings)
        self.held: list[tuple[str, float]] | None = None  # phases inside a block that may turn out to be eval
        self.grad_off = 0  # no_grad / inference_mode blocks open now
        self.pre: dict[str, float] = {}  # phases seen before training started: seconds by name
        self.making = False  # the automatic Telemetry is being made (it is not an explicit one)
        self.window_start = 0.0
        self.window_other = 0.0  # seconds of the window's phases other than compute
        self.window_excluded = 0.0  # of which outside the step (eval, checkpoints, compile)
        self.samples = self.tokens = 0
        self.held_samples = self.held_tokens = 0
        self.stepping: object = None  # the optimizer whose step is running (the outermost one)
        self.primary: Callable[[], object] | None = None  # the optimizer whose steps are counted (a weak reference)
        # another optimizer's step in a row, held: (its id, when it ended, the window's other, excluded, samples,
        # tokens then)
        self.rival: tuple[int, float, float, float, int, int] | None = None
        self.steps = 0
        self.flops_source: Callable[[], float | None] | None = None  # a step's model FLOPs, when known
        self.flops_provider: Probe | None = None  # the probe whose flops_source it is
        self.next_number: int | None = None  # the number of the next step, where a Trainer resumed
        self.loaded_step: int | None = None  # the step a restarted process's checkpoint holds, loaded before training
        self.forked = self.fork_told = False  # this process was forked from an instrumented one; it said so
        self.role_told: tuple[int, int] | None = None  # the rank's role (pipeline stage, replica), as a probe saw it
        self.target_told: tuple[int, int] | None = None  # the job's last step and who told it (telemetry.TARGET_*)

    @property
    def live(self) -> bool:
        return self.state != "off" and threading.get_ident() == self.thread

    # --- activation ----------------------------------------------------------------------------------

    def activate(self, why: str) -> None:
        """Training starts in this process (its first optimizer, or a Trainer's start)."""
        if self.state != "waiting" or threading.get_ident() != self.thread:
            return
        data = sys.modules.get("torch.utils.data")
        if data is not None and data.get_worker_info() is not None:  # a DataLoader worker (spawned), not a rank
            self.turn_off(None)
            return
        if self.explicit is not None:
            self.telemetry, self.own = self.explicit, False
            self.deferred = {}
        else:
            telemetry = self._reporter(self.loaded_step)
            if telemetry is None:
                return
            self.telemetry, self.own = telemetry, True
            for name, seconds in self.pre.items():
                _put_phase(telemetry, name, seconds, elapsed=False)
            # the rest of the time since the interpreter started, and with it the elapsed time so far
            _put_phase(telemetry, "startup", max(0.0, _perf() - self.boot - sum(self.pre.values())), elapsed=True)
        self.pre.clear()
        if self.role_told is not None:
            self.telemetry.role(*self.role_told)
        if self.target_told is not None:
            self.telemetry._declare_target(self.target_told[0], None, self.target_told[1])
        self.state = "active"
        self.window_start = _perf()
        self.window_other = self.window_excluded = 0.0
        _log().debug("goodput-instrument: training started (%s) as %s/%s", why, self.telemetry.workload,
                     self.telemetry.rank)

    def _reporter(self, resumed: int | None = None) -> Telemetry | None:
        path = os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET
        if not os.path.exists(path):
            _log().warning("goodput-instrument: no goodput-exporter socket at %s; this process is not instrumented",
                           path)
            self.turn_off(None)
            return None
        workload, rank = self.identity()
        self.making = True
        try:
            telemetry = Telemetry(workload, rank, socket_path=path, since=self.boot, dtype=self._dtype(),
                                  resumed_from_step=resumed)
        finally:
            self.making = False
        directory = self.settings.flight_dir
        if os.path.isdir(directory) and "flight" not in self.settings.probes_off:
            telemetry.dump_flight_recorder(directory, self.settings.flight_interval)
        return telemetry

    def _dtype(self) -> str:
        from ..contract import FLOPS_DTYPES

        return self.settings.flops_dtype if self.settings.flops_dtype in FLOPS_DTYPES else "bf16"

    def identity(self) -> tuple[str | None, int | None]:
        """The launcher's (as the explicit client names it), else GOODPUT_WORKLOAD / GOODPUT_RANK, else the process
        group's rank and the host and script."""
        from ..launcher import rank_from, workload_from

        workload = workload_from(os.environ) or self.settings.workload
        rank = rank_from(os.environ)
        if rank is None:
            rank = self.settings.rank
        if rank is None:
            dist = sys.modules.get("torch.distributed")
            with contextlib.suppress(Exception):  # no process group: rank 0
                if dist is not None and dist.is_available() and dist.is_initialized():
                    rank = int(dist.get_rank())
        if workload is None:
            import socket

            script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
            from ..launcher import valid_workload

            name = f"{socket.gethostname().partition('.')[0]}/{script}"
            workload = name if valid_workload(name) else None
        return workload, rank

    def turn_off(self, why: str | None) -> None:
        """This process is not measured: every probe removed, so the job runs as without them."""
        self.state = "off"
        if why:
            _log().warning("goodput-instrument: %s", why)
        for probe in self.probes:
            with contextlib.suppress(Exception):  # best effort: a probe left on checks the state
                probe.uninstrument()

    def after_fork(self) -> None:
        """In a forked child (a DataLoader worker, a rank of Lightning's ddp_fork): nothing of the parent's reporter,
        nothing measured. One that goes on to train says so once (`forked_trains`)."""
        self.state = "off"
        self.telemetry = None
        self.forked = True

    def forked_trains(self) -> None:
        """A forked child builds an optimizer: a rank started by fork, not measured; one log line."""
        if not self.forked or self.fork_told:
            return
        self.fork_told = True
        data = sys.modules.get("torch.utils.data")
        if data is not None and data.get_worker_info() is not None:
            return  # a DataLoader worker: silent
        _log().warning("goodput-instrument: this process was started by fork (Lightning's ddp_fork, multiprocessing's "
                       "fork start method) and is not measured; start ranks with torchrun or spawn to measure them")

    # --- the explicit client ---------------------------------------------------------------------------

    def explicit_made(self, telemetry: Telemetry) -> None:
        if self.explicit is not None:
            return
        self.explicit = telemetry
        put = telemetry._put
        recorder = self

        def _put(event: tuple) -> None:  # type: ignore[type-arg]
            put(event)
            if event[0] == "phase":
                with contextlib.suppress(Exception):  # never into the job
                    recorder.explicit_phase(event[1], event[2])

        telemetry._put = _put  # type: ignore[method-assign]  # this instance only; ours bypass it (_put_phase)
        if self.state == "active" and self.own and threading.get_ident() == self.thread:
            own, self.telemetry, self.own = self.telemetry, telemetry, False
            self.deferred = {}
            if self.target_told is not None:
                telemetry._declare_target(self.target_told[0], None, self.target_told[1])
            with contextlib.suppress(Exception):  # the job's own reporter goes on regardless
                own.close()  # type: ignore[union-attr]

    def explicit_phase(self, name: str, seconds: float) -> None:
        """The explicit reporter sent a phase: its seconds are the window's, not its automatic compute's (the
        probes' phases it covers are not counted in the window: `phase`)."""
        if self.state == "active" and not self.own and threading.get_ident() == self.thread:
            self.window_other += seconds
            if name in NOT_STEP:
                self.window_excluded += seconds

    def _sink(self, kind: str) -> Telemetry | None:
        telemetry = self.telemetry
        if telemetry is None or self.state != "active":
            return None
        if not self.own and (kind in self.explicit_kinds or telemetry._open):
            return None  # the explicit reporter has it, or its open phase covers this time
        return telemetry

    # --- phases ----------------------------------------------------------------------------------------

    def begin(self) -> float | None:
        """A phase starts: its start time, or None when not measured (the matching `end` then does nothing)."""
        if self.state == "off" or threading.get_ident() != self.thread:
            return None
        self.depth += 1
        return _perf()

    def end(self, name: str, started: float | None) -> None:
        if started is None:
            return
        seconds = _perf() - started
        self.depth -= 1
        if self.depth > 0:
            return
        if self.depth < 0:
            self.depth = 0
        if self.held is not None:
            self.held.append((name, seconds))
        else:
            self.phase(name, seconds)

    def phase(self, name: str, seconds: float) -> None:
        """A phase that ended now, outside any other."""
        self.reported += seconds
        if self.state == "waiting":
            self.pre[name] = self.pre.get(name, 0.0) + seconds
            return
        telemetry = self._sink(name)
        if telemetry is None and not self.own and self.telemetry is not None:
            return  # the explicit reporter's time (a phase it reports, or inside its open phase block)
        self.window_other += seconds
        if name in NOT_STEP:
            self.window_excluded += seconds
        if telemetry is None:
            return
        if self.deferred is not None:
            self.deferred[name] = self.deferred.get(name, 0.0) + seconds
        else:
            _put_phase(telemetry, name, seconds, elapsed=False)

    def batch(self, samples: int, tokens: int) -> None:
        if self.held is not None:
            self.held_samples += samples
            self.held_tokens += tokens
        else:
            self.samples += samples
            self.tokens += tokens

    # --- evaluation in plain loops: no_grad / inference_mode blocks that run a forward pass --------------

    def grad_off_enter(self, grad_was_on: bool = True) -> bool:
        """A no_grad or inference_mode block opens; True when it is a candidate evaluation (the outermost such
        block, opened with gradients on, outside any phase and any optimizer step, in a training process)."""
        self.grad_off += 1
        if (self.grad_off == 1 and grad_was_on and self.depth == 0 and self.held is None and self.stepping is None
                and self.state == "active" and threading.get_ident() == self.thread):
            self.held = []
            self.held_samples = self.held_tokens = 0
            return True
        return False

    def grad_off_exit(self, candidate: bool, seconds: float, forward: bool) -> None:
        self.grad_off = max(0, self.grad_off - 1)
        if not candidate:
            return
        held, self.held = self.held or [], None
        if forward and not any(name == "eval" for name, _ in held):
            # an evaluation: its whole block, the waits for its batches included (unless a framework's own hooks
            # timed the evaluation inside it, exactly)
            self.phase("eval", seconds)
            return
        for name, inner in held:
            self.phase(name, inner)
        self.samples += self.held_samples
        self.tokens += self.held_tokens

    # --- steps -----------------------------------------------------------------------------------------

    def step_begins(self, optimizer: object) -> None:
        if self.stepping is None:
            self.stepping = optimizer

    def step_ends(self, optimizer: object) -> None:
        if self.stepping is not optimizer:
            return  # an optimizer stepped inside another's step (a wrapper's inner one)
        self.stepping = None
        if self.state != "active" or threading.get_ident() != self.thread:
            return
        now = _perf()
        if not self._counts(optimizer, now):
            return
        self._close(now, self.window_other, self.window_excluded, self.samples, self.tokens)

    def _counts(self, optimizer: object, now: float) -> bool:
        """Whether this optimizer's step is a step of the job. The first optimizer to step is counted; another is
        adopted in its place once the first is gone (garbage collected) or once it steps twice with no step of the
        first in between (the first was replaced and is still referenced: Lightning's lr_find then fit, Hugging
        Face's auto_find_batch_size, a staged fine-tuning). A second optimizer that alternates with the first (a
        GAN's discriminator) is never counted. On adoption its first step, held until then, is counted too."""
        primary = self.primary() if self.primary is not None else None
        if primary is optimizer:
            self.rival = None
            return True
        if primary is not None:
            rival = self.rival
            if rival is None or rival[0] != id(optimizer):
                # its first step in a row: held, as the window's figures at its end
                self.rival = (id(optimizer), now, self.window_other, self.window_excluded, self.samples, self.tokens)
                return False
            # the second: the replaced optimizer's window ended at its first step
            _, then, other, excluded, samples, tokens = rival
            self._close(then, other, excluded, samples, tokens, start_at=then)
            self.window_other -= other
            self.window_excluded -= excluded
            self.samples -= samples
            self.tokens -= tokens
        self.rival = None
        try:
            self.primary = weakref.ref(optimizer)
        except TypeError:  # an optimizer class with __slots__ and no __weakref__: held, then
            self.primary = lambda: optimizer
        return True

    def _close(self, now: float, other: float, excluded: float, samples: int, tokens: int,
               start_at: float | None = None) -> None:
        """A step ends at `now`: its window's compute and the step sent; the next window starts (at `start_at`,
        with the figures left after this one's, when a held step is sent late)."""
        window = now - self.window_start
        compute = window - other
        duration = window - excluded
        if start_at is None:
            self.window_start, self.window_other, self.window_excluded = now, 0.0, 0.0
            self.samples = self.tokens = 0
        else:
            self.window_start = start_at
        self.steps += 1
        if self.deferred is not None:  # the explicit reporter's kinds are known now
            deferred, self.deferred = self.deferred, None
            for name, seconds in deferred.items():
                sink = self._sink(name)
                if sink is not None:
                    _put_phase(sink, name, seconds, elapsed=False)
        flops = None
        if self.flops_source is not None:
            try:
                flops = self.flops_source()
            except Exception as exc:  # the FLOPs provider only is off: the step is counted all the same
                self.flops_source = None
                provider = self.flops_provider
                if provider is not None:
                    provider.failed(exc)
        telemetry = self._sink("compute")
        if telemetry is not None:
            _put_phase(telemetry, "compute", max(0.0, compute), elapsed=True)
        telemetry = self._sink("step")
        if telemetry is not None:
            number, self.next_number = self.next_number, None
            _record_step(telemetry, duration, tokens, samples, step=number, flops=flops)

    def role(self, pipeline_stage: int, replica: int) -> None:
        """A probe learned the rank's role: sent now, or once training starts."""
        self.role_told = (pipeline_stage, replica)
        if self.state == "active" and self.telemetry is not None:
            self.telemetry.role(pipeline_stage, replica)

    def target(self, steps: int, by: int) -> None:
        """A probe learned the job's last step (a framework's max_steps: by=TARGET_FRAMEWORK; an LR schedule's horizon:
        TARGET_SCHEDULE): sent now, or once training starts, unless something of a higher precedence told it."""
        if steps <= 0 or (self.target_told is not None and by < self.target_told[1]):
            return
        self.target_told = (int(steps), by)
        if self.state == "active" and self.telemetry is not None:
            self.telemetry._declare_target(int(steps), None, by)

    def checkpoint_loaded(self, step: int) -> None:
        """A process the launcher restarted, or a new run of a job named across its runs (GOODPUT_JOB), loaded a
        checkpoint that says it holds the state after step `step`, before its first step: where it resumed from (for
        the steps it redoes). Elsewhere a loaded step is a starting point (fine-tuning from a checkpoint), not a
        resumption."""
        if self.steps or threading.get_ident() != self.thread:
            return
        from ..launcher import job_from, restart_count

        if restart_count(os.environ) == 0 and job_from(os.environ) is None:
            return
        if self.state == "waiting":
            self.loaded_step = step
        else:
            self.resumed(step)

    def resumed(self, step: int) -> None:
        """A Trainer resumed training after its global step `step`: the steps count on from there. The next step
        carries its number, step+1 (the daemon takes a number at or below the last it saw, after a restart, as the
        point the rank went back to); no lifecycle event, which the daemon would count as one more restart."""
        if step > 0:
            self.next_number = step + 1


def _put_phase(telemetry: Telemetry, name: str, seconds: float, *, elapsed: bool) -> None:
    """Queue a phase event. Only the events that end a window (the step's compute, the start-up) carry the elapsed
    time: the daemon counts elapsed time no phase covers as untracked at once, and a phase reported inside a window
    whose compute is not sent yet would leave that compute untracked as well as computed."""
    Telemetry._put(telemetry, ("phase", name, seconds, _perf() - telemetry._t0 if elapsed else None))


def watch_explicit(recorder: Recorder) -> None:
    """Patch Telemetry so that an explicit one in the process is known, with what it reports."""
    original_init = Telemetry.__init__

    def __init__(self: Telemetry, *args: object, **kwargs: object) -> None:
        original_init(self, *args, **kwargs)  # type: ignore[arg-type]
        if recorder.making or (recorder.own and self is recorder.telemetry):
            return
        with contextlib.suppress(Exception):  # never into the job
            recorder.explicit_made(self)

    def marking(kind: str | None, method: Callable) -> Callable:  # type: ignore[type-arg]
        def wrapper(self: Telemetry, *args: object, **kwargs: object) -> object:
            if self is recorder.explicit:
                recorder.explicit_kinds.add(kind if kind is not None else str(args[0] if args else
                                                                               kwargs.get("name", "")))
            return method(self, *args, **kwargs)
        wrapper.__wrapped__ = method  # type: ignore[attr-defined]
        wrapper.__doc__ = method.__doc__
        return wrapper

    __init__.__doc__ = original_init.__doc__
    __init__.__wrapped__ = original_init  # type: ignore[attr-defined]  # inspect.signature follows it
    Telemetry.__init__ = __init__  # type: ignore[method-assign]
    for attribute, kind in (("step", "step"), ("record_step", "step"), ("phase", None), ("record_phase", None),
                            ("data_wait", "data_wait")):
        setattr(Telemetry, attribute, marking(kind, getattr(Telemetry, attribute)))
