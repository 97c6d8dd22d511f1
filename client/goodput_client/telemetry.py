"""Telemetry: the per-rank reporter a training loop (or an inference server) calls.

Never raises into the loop and never blocks it: the loop only appends to a bounded in-process queue,
which a background thread sends in batches. When the daemon is absent, events are dropped and counted
(`Telemetry.dropped`); when it takes longer than `timeout` to answer a batch that went out whole, the batch's events
are counted in `Telemetry.unknown` (the daemon may have applied them). The loop notices neither.

Every event carries the process's elapsed time since its Telemetry started (`elapsed_seconds`), so the
daemon can account for every second of the rank: the seconds no phase covers are its "untracked" phase.

The daemon's answers may ask this rank for a capture (a flight-recorder dump, a profiler trace of its next
steps: `goodput_client.capture`); the sender thread reads them, and polls for them while it has nothing to send.

Imports only what `import goodput_client` must: the launcher variables, the HTTP transport, JSON and
logging are imported when a Telemetry is created or first needs them.
"""

from __future__ import annotations

import atexit
import collections
import operator
import os
import sys
import threading
import time
from bisect import bisect_left

from .contract import (
    CAPTURE_POLL_SECONDS,
    CAPTURES_ENV,
    DATA_PARALLEL_RANK_ENV,
    DEADLINE_ENV,
    DEFAULT_FLOPS_DTYPE,
    DEFAULT_SOCKET,
    DEFAULT_TPOT_OBJECTIVE,
    DEFAULT_TTFT_OBJECTIVE,
    DEPRECATED_PHASES,
    EVENTS_PATH,
    FALLBACK_FINISH_REASON,
    FALLBACK_PHASE,
    FINISH_REASONS,
    FLIGHT_DUMP_PREFIX,
    FLOPS_DTYPES,
    ITL_BUCKETS,
    LIFECYCLE_EVENTS,
    MAX_COUNT,
    MAX_DEADLINE,
    MAX_FLOPS,
    MAX_ROLE_INDEX,
    MAX_SECONDS,
    MODEL_PATTERN,
    PHASES,
    PIPELINE_STAGE_ENV,
    RESEND_SECONDS,
    SOCKET_ENV,
    TARGET_STEPS_ENV,
    batch_body,
    capture_event,
    encode,
    lifecycle_event,
    phase_event,
    poll_path,
    request_event,
    role_event,
    step_event,
    target_event,
    workload_folder,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time
    import logging
    from collections.abc import Iterable, Iterator
    from types import TracebackType
    from typing import TypeVar

    from .capture import Answer, Profile
    from .transport import Transport

    T = TypeVar("T")

LOGGER = "goodput_client"
_perf = time.perf_counter
_KNOWN_PHASES = frozenset(PHASES)
_KNOWN_REASONS = frozenset(FINISH_REASONS)
_ITL_SLOTS = len(ITL_BUCKETS) + 1
_MODELS_REMEMBERED = 4096  # model names whose validity a Telemetry caches
_INF = float("inf")
# who told a job's target (its last step) or deadline, lowest precedence first: an LR schedule's horizon, a framework's
# max_steps (goodput-instrument's probes), the environment (GOODPUT_TARGET_STEPS, GOODPUT_DEADLINE), Telemetry.target
TARGET_SCHEDULE, TARGET_FRAMEWORK, TARGET_ENV, TARGET_EXPLICIT = range(4)
# a phase block open this long reports its time so far (and again each time as long after), so that a block that
# never returns accrues its time: a hung rank's goodput falls while it hangs
OPEN_PHASE_SECONDS = 5.0
_OFF = frozenset({"0", "false", "no", "off"})  # GOODPUT_CAPTURES values that turn captures off
UNANSWERED = "no answer"  # how _send's problem starts when a batch went out whole and no answer came


def _log() -> logging.Logger:
    import logging

    return logging.getLogger(LOGGER)


def _from_env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _identity(workload: str | None, rank: int | None) -> tuple[str, int]:
    """The arguments, else what the launcher's variables name (as the daemon reads them), else default/0."""
    if workload and rank is not None:
        return workload, rank
    from .launcher import rank_from, workload_from

    if rank is None:
        rank = rank_from(os.environ)
    return workload or workload_from(os.environ) or "default", rank if rank is not None else 0


class _Phase:
    __slots__ = ("_name", "_open", "_telemetry")

    def __init__(self, telemetry: Telemetry, name: str) -> None:
        self._telemetry = telemetry
        self._name = name
        self._open: list | None = None  # type: ignore[type-arg]

    def __enter__(self) -> _Phase:
        self._open = self._telemetry._enter_phase(self._name)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._open is not None:  # else left without being entered: nothing to close, nothing to raise
            self._telemetry._leave_phase(self._open)


class _Step:
    """One training step; `tokens`, `samples`, `flops` (and `step`, its global number) may be set inside
    the block, once the batch is known."""

    __slots__ = ("_started", "_telemetry", "flops", "samples", "step", "tokens")

    def __init__(self, telemetry: Telemetry, tokens: int, samples: int, step: int | None,
                 flops: float | None) -> None:
        self._telemetry = telemetry
        self.tokens = tokens
        self.samples = samples
        self.step = step
        self.flops = flops
        self._started = 0.0

    def __enter__(self) -> _Step:
        self._started = _perf()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:  # a step that raised did not complete
            now = _perf()
            self._telemetry._put_step(now, now - self._started, self.tokens, self.samples, self.step, self.flops)


class _Invalid(ValueError):
    """A request that the daemon would refuse: dropped (and counted) here, so it spoils no batch."""


def _time(value: float | None, name: str) -> float | None:
    """A time as sent: None stays None, negative is 0; ValueError past MAX_SECONDS or not finite."""
    if value is None:
        return None
    value = float(value)
    if not -_INF < value <= MAX_SECONDS:  # NaN and infinities too
        raise _Invalid(f"{name}={value!r} is not a number of seconds up to {MAX_SECONDS}")
    return 0.0 if value < 0.0 else value


def _required_time(value: float | None, name: str) -> float:
    """A time the wire format requires (not null)."""
    checked = _time(value, name)
    if checked is None:
        raise _Invalid(f"{name} is required")
    return checked


def _count(value: int, name: str) -> int:
    if isinstance(value, float) and not value.is_integer():  # type: ignore[attr-defined]  # a float, not an int
        raise _Invalid(f"{name}={value!r} is not a whole number")
    value = int(value)
    if not 0 <= value <= MAX_COUNT:
        raise _Invalid(f"{name}={value!r} is not within [0, {MAX_COUNT}]")
    return value


def _valid_objective(value: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 < value <= MAX_SECONDS


def _whole(value: object, low: int) -> int | None:
    """An int (or anything with __index__, a numpy integer) within [low, MAX_COUNT], else None; bool is not."""
    if isinstance(value, bool):
        return None
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None
    return number if low <= number <= MAX_COUNT else None


def _env_int(text: str) -> int | str:
    """An environment variable's whole number, or its text as it is (for the warning that refuses it)."""
    return int(text.strip()) if text.strip().isdigit() else text


def _deadline(value: object) -> float | None:
    """A Unix time as sent: a number within (0, MAX_DEADLINE] (NaN and infinities fail the bounds), else None."""
    if isinstance(value, (bool, str, bytes)):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return number if 0.0 < number <= MAX_DEADLINE else None


def _flops(value: object) -> float | None:
    """A number of FLOPs as sent: finite, within [0, MAX_FLOPS] (NaN fails both bounds), else None. A number
    is anything float() takes (a 0-d tensor too) but a string or a bool."""
    if isinstance(value, (bool, str, bytes)):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return number if 0.0 <= number <= MAX_FLOPS else None


def judge(ttft_seconds: float | None, tpot_seconds: float | None, ttft_objective_seconds: float,
          tpot_objective_seconds: float) -> tuple[bool | None, bool | None, bool | None]:
    """(ttft met, tpot met, both met) as the daemon counts them: None where not judged (no first token;
    fewer than two tokens). Both: TTFT met, and TPOT met or not judged; None when TTFT was not judged."""
    ttft_met = None if ttft_seconds is None else ttft_seconds <= ttft_objective_seconds
    tpot_met = None if tpot_seconds is None else tpot_seconds <= tpot_objective_seconds
    both = None if ttft_met is None else ttft_met and tpot_met is not False
    return ttft_met, tpot_met, both


def _cancelled(kind: type[BaseException]) -> bool:
    """A request whose block was cancelled (the client went away) rather than failed."""
    if issubclass(kind, GeneratorExit):
        return True
    asyncio = sys.modules.get("asyncio")  # never imported here: if it is not loaded, nothing was cancelled by it
    return asyncio is not None and issubclass(kind, asyncio.CancelledError)


class _Request:
    """One request of an inference server, timed from the block's entry. Inside the block: `token(n)` as
    output tokens arrive, `queued()` when it leaves the queue, `finish_reason = ...`. After it, the
    measurements and their judgment are readable (None where there was nothing to measure or judge)."""

    __slots__ = ("_first", "_itl", "_last", "_queued", "_reason", "_started", "_telemetry", "e2e_seconds",
                 "itl_sum", "met", "model", "output_tokens", "prompt_tokens", "queue_seconds", "tpot_met",
                 "tpot_objective_seconds", "tpot_seconds", "ttft_met", "ttft_objective_seconds",
                 "ttft_seconds")

    def __init__(self, telemetry: Telemetry, model: str, prompt_tokens: int, ttft_objective_seconds: float,
                 tpot_objective_seconds: float) -> None:
        self._telemetry = telemetry
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.ttft_objective_seconds = ttft_objective_seconds
        self.tpot_objective_seconds = tpot_objective_seconds
        self.output_tokens = 0
        self.itl_sum = 0.0
        self._itl = [0] * _ITL_SLOTS
        self._started = 0.0
        self._first: float | None = None
        self._last = 0.0
        self._queued: float | None = None
        self._reason: str | None = None
        self.ttft_seconds: float | None = None
        self.tpot_seconds: float | None = None
        self.e2e_seconds: float | None = None
        self.queue_seconds: float | None = None
        self.ttft_met: bool | None = None
        self.tpot_met: bool | None = None
        self.met: bool | None = None

    @property
    def finish_reason(self) -> str:
        """stop (the default), length, abort or error; see Telemetry.request for how it is decided."""
        return self._reason or "stop"

    @finish_reason.setter
    def finish_reason(self, reason: str) -> None:
        self._reason = reason

    def __enter__(self) -> _Request:
        self._started = _perf()
        return self

    def queued(self) -> None:
        """The request leaves the queue now (optional): queue_seconds is the time from arrival to here."""
        self._queued = _perf()

    def token(self, n: int = 1) -> None:
        """`n` output tokens arrived now (more than one: they came together). The first call fixes TTFT;
        each later one is one inter-token gap."""
        now = _perf()
        try:
            self.output_tokens += n
        except TypeError:  # not a number: nothing recorded, nothing raised
            return
        if self._first is None:
            self._first = now
        else:
            gap = now - self._last
            self._itl[bisect_left(ITL_BUCKETS, gap)] += 1
            self.itl_sum += gap
        self._last = now

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        ended = _perf()
        reason = self._reason
        if kind is not None and reason is None:
            reason = "abort" if _cancelled(kind) else "error"
            _log().debug("goodput telemetry: a request of %r ended by %s, recorded as %r", self.model,
                         kind.__name__, reason)
        try:
            start, first = self._started, self._first
            self.e2e_seconds = ended - start
            if first is not None:
                self.ttft_seconds = first - start
                if self.output_tokens >= 2:
                    self.tpot_seconds = (self._last - first) / (self.output_tokens - 1)
            if self._queued is not None:
                self.queue_seconds = self._queued - start
            self._reason = self._telemetry._submit_request(self, reason or "stop")
        except Exception as problem:  # never into the server; the block's own exception goes on unchanged
            self._telemetry._drop_request(self.model, problem)


class Telemetry:
    """A per-process reporter. Create one per rank; it is thread-safe.

    `workload` and `rank` default to what the launcher's variables name (TORCHELASTIC_RUN_ID, SLURM_JOB_ID
    or MASTER_ADDR:MASTER_PORT; RANK or SLURM_PROCID), else "default" and 0. Events go to `url` when
    given, else to the Unix socket `socket_path`, else $GOODPUT_INGEST_SOCKET_PATH, else DEFAULT_SOCKET.

    Elapsed time starts at construction (`started_at`, Unix time, is its wall clock; the first event
    carries both): each event carries the process's seconds since then, at the end of its span, so the
    daemon counts every second of the rank, those no phase covers as "untracked". The first event is
    "restart" when this process was started again after a failure (`resumed_from_step` above 0, or the
    launcher's restart count, TORCHELASTIC_RESTART_COUNT or SLURM_RESTART_COUNT, above 0): the daemon then
    charges the time since the rank's previous process's last event as downtime. Otherwise it is "start",
    a new run. A process the launcher restarted without `resumed_from_step` numbers no steps by itself
    (where it went back to is not known), only those given with `step=`.

    Steps are numbered globally, 1, 2, ... across restarts: `resumed_from_step=R` (an int >= 0) says the
    checkpoint this process resumed from holds the state after step R, so its first step is R+1; the daemon
    counts steps it saw before numbered above R as wasted progress. A step may name its number (`step=`),
    which the next ones count on from.

    Model FLOPs, for model FLOPs utilization: `flops_per_step`, or `flops_per_token` (times each step's
    tokens; see `goodput_client.flops.decoder_flops_per_token`), not both; a step's own `flops=` wins.
    `dtype` is the data type they run in, one of FLOPS_DTYPES ("bf16" by default), which the daemon
    compares against the GPU's peak for that type.

    An inference server reports its requests with `request()` or `record_request()`, judged against
    `ttft_objective_seconds` and `tpot_objective_seconds` unless a request names its own.

    ValueError here, a configuration error found at startup, for: an objective not within
    (0, MAX_SECONDS]; `resumed_from_step` not an int within [0, MAX_COUNT]; a FLOPs figure that is not a
    finite number within [0, MAX_FLOPS], or both of them; a `dtype` not in FLOPS_DTYPES.

    Captures: when the daemon asks (on a step-time shift, a hang, a missing rank, for workloads that opted in
    there), this rank writes a flight-recorder dump at once and a torch.profiler trace of its next steps into
    the directory the daemon names, and answers with what it wrote or why it did not. `captures=False` (or
    GOODPUT_CAPTURES=0 when `captures` is None) answers every request "disabled". With captures on, the sender
    also polls the daemon after CAPTURE_POLL_SECONDS with nothing to send, so that a hung loop is still asked.
    A job that is never asked pays one attribute check per step.

    `since`: a time.perf_counter() reading before now at which elapsed time starts (default: now).
    """

    def __init__(
        self,
        workload: str | None = None,
        rank: int | None = None,
        *,
        socket_path: str | None = None,
        url: str | None = None,
        token: str | None = None,
        flush_interval: float = 0.5,
        max_queue: int = 100_000,
        max_batch: int = 5_000,
        timeout: float = 2.0,
        ttft_objective_seconds: float = DEFAULT_TTFT_OBJECTIVE,
        tpot_objective_seconds: float = DEFAULT_TPOT_OBJECTIVE,
        resumed_from_step: int | None = None,
        flops_per_step: float | None = None,
        flops_per_token: float | None = None,
        dtype: str = DEFAULT_FLOPS_DTYPE,
        captures: bool | None = None,
        since: float | None = None,
    ) -> None:
        from .transport import Transport

        for name, objective in (("ttft_objective_seconds", ttft_objective_seconds),
                                ("tpot_objective_seconds", tpot_objective_seconds)):
            if not _valid_objective(objective):
                raise ValueError(f"{name}={objective!r}: expected seconds within (0, {MAX_SECONDS}]")
        resumed = None if resumed_from_step is None else _whole(resumed_from_step, 0)
        if resumed_from_step is not None and resumed is None:
            raise ValueError(f"resumed_from_step={resumed_from_step!r}: expected an int within [0, {MAX_COUNT}]")
        if flops_per_step is not None and flops_per_token is not None:
            raise ValueError("flops_per_step and flops_per_token: give one or neither")
        for name, figure in (("flops_per_step", flops_per_step), ("flops_per_token", flops_per_token)):
            if figure is not None and _flops(figure) is None:
                raise ValueError(f"{name}={figure!r}: expected a finite number within [0, {MAX_FLOPS:g}]")
        if dtype not in FLOPS_DTYPES:
            raise ValueError(f"dtype={dtype!r}: expected one of {', '.join(FLOPS_DTYPES)}")
        self.resumed_from_step = resumed
        self.flops_per_step = None if flops_per_step is None else float(flops_per_step)
        self.flops_per_token = None if flops_per_token is None else float(flops_per_token)
        self.dtype = dtype
        # a process started again after a failure, or one resuming from a checkpoint after step N > 0: the daemon
        # charges the gap since the rank's last event as downtime, and the steps after `resumed` it had seen as
        # redone; otherwise a "start", a new run (resumed_from_step=0 included: nothing to go back from)
        from .launcher import restart_count

        launcher_restarted = restart_count(os.environ) > 0
        self._restarted = launcher_restarted or bool(resumed)
        # the number of the last step completed, the next counting on from it; None: not known (restarted by the
        # launcher without resumed_from_step: numbering from 1 would charge every earlier step as redone), so steps
        # carry only the numbers given with step=
        self._last_step: int | None = None if launcher_restarted and resumed is None else resumed or 0
        self._steps_lock = threading.Lock()
        # one [name, start] per phase block (or data_wait wait) open now; the sender reports the time so far of one
        # open over `open_phase_interval`, and moves its start on (under _phase_lock), so a block that never returns
        # (a collective that hangs) still accrues its time
        self._open: list[list] = []  # type: ignore[type-arg]
        self._phase_lock = threading.Lock()
        self.open_phase_interval = OPEN_PHASE_SECONDS
        self.ttft_objective_seconds = float(ttft_objective_seconds)
        self.tpot_objective_seconds = float(tpot_objective_seconds)
        self._models: dict[str, bool] = {}  # model name -> whether it matches MODEL_PATTERN
        self.workload, self.rank = _identity(workload, rank)
        # the launch this process belongs to, where the workload names more than one (GOODPUT_JOB, or an explicit
        # workload): sent with the first event, so that the daemon takes a new run of the job as a resubmission
        from .launcher import run_from

        launch = run_from(os.environ)
        self.run = launch if launch != self.workload else None
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.flush_interval = flush_interval
        self.sent = 0  # events the daemon accepted
        self.dropped = 0  # events lost: queue full, daemon absent, or rejected
        # events sent whole whose answer never came (the daemon too slow to answer within `timeout`): it may have
        # applied them, so they are neither sent nor dropped
        self.unknown = 0
        self.dumps = 0  # flight-recorder dumps written
        self.dump_errors = 0
        self._queue: collections.deque[tuple] = collections.deque()  # type: ignore[type-arg]
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._warned: set[str] = set()
        self._fr_target: str | None = None
        self._fr_thread: threading.Thread | None = None
        self._fr_stop = threading.Event()  # set by close(), which writes the last dump itself, before the `end`
        # captures: whether this process takes them, and why not; the profile capture asked for or running (set
        # by the sender thread, cleared by the thread that ran it: one attribute check per step while None)
        if captures is None:
            self.captures = (os.environ.get(CAPTURES_ENV) or "1").strip().lower() not in _OFF
            self._captures_off = f"captures are off in this process ({CAPTURES_ENV}=0)"
        else:
            self.captures = bool(captures)
            self._captures_off = "captures are off in this process (Telemetry(captures=False))"
        self._profile: Profile | None = None
        self.poll_interval = CAPTURE_POLL_SECONDS  # idle seconds before the sender polls for capture requests
        self.poll_errors = 0  # polls that failed: no event is lost by one, so they are not `dropped`
        self._polling = self.captures  # off for good once the daemon refuses a poll (an older one)
        self._last_post = time.monotonic()
        self._closing = False
        # the rank's role in the job's parallelism (pipeline stage, data-parallel rank), and where the job's training
        # ends (its last step's number) and its deadline, each with the precedence of who told it
        # (TARGET_FRAMEWORK...TARGET_EXPLICIT): each sent once told, and both again every RESEND_SECONDS by the sender
        self._role: tuple[int, int] | None = None
        self._target: list = [None, None]  # type: ignore[type-arg]
        self._target_by = [-1, -1]
        self._resent = time.monotonic()
        if url:
            self._transport: Transport = Transport(url=url, token=token, timeout=timeout)
        else:
            path = socket_path or _from_env(SOCKET_ENV) or DEFAULT_SOCKET
            self._transport = Transport(socket_path=path, token=token, timeout=timeout)
        self._thread = threading.Thread(target=self._run, name="goodput-telemetry", daemon=True)
        self._thread.start()
        atexit.register(self.close)
        # elapsed 0: every event's elapsed_seconds counts from here (`since`, an earlier time.perf_counter() reading:
        # the process's start, for a reporter made after it, as goodput-instrument's is)
        now = _perf()
        self._t0 = now if since is None or not since <= now else since
        self.started_at = time.time() - (now - self._t0)  # the same instant on the wall clock
        self._put(("lifecycle", "restart" if self._restarted else "start", 0.0, resumed, self.started_at, self.run))
        self._target_from_env()
        stage = _from_env(PIPELINE_STAGE_ENV)
        if stage is not None:
            self.role(_env_int(stage), _env_int(_from_env(DATA_PARALLEL_RANK_ENV) or "0"))  # type: ignore[arg-type]

    # --- the hot path: called from the training loop ----------------------------------------------

    def _put(self, event: tuple) -> None:  # type: ignore[type-arg]
        if len(self._queue) >= self.max_queue:
            self.dropped += 1
            return
        self._queue.append(event)

    def _warn_once(self, key: str, message: str, *values: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _log().warning(message, *values)

    def _phase_name(self, name: str) -> str:
        """The name recorded for a phase name not in PHASES: a deprecated one's replacement, else "other"."""
        try:
            replacement = DEPRECATED_PHASES.get(name)
        except TypeError:  # unhashable
            replacement = None
        if replacement is not None:
            self._warn_once(f"phase-{name}", "goodput telemetry: phase %r is deprecated and recorded as %r; "
                            "use %r instead", name, replacement, replacement)
            return replacement
        self._warn_once("phase", "goodput telemetry: unknown phase %r recorded as 'other'", name)
        return FALLBACK_PHASE

    def phase(self, name: str) -> _Phase:
        """`with telemetry.phase("data_wait"):` — one of PHASES: compute, data_wait, comm_wait,
        checkpoint_save, checkpoint_restore, compile, startup, eval, other. The deprecated "checkpoint" is
        recorded as "checkpoint_save", another name as "other" (each logged once), never raised.

        The phase event carries the elapsed time at the block's end. While a phase block is open, a step
        that ends carries none: the enclosing phase will account for those seconds when it ends. A block open
        longer than `open_phase_interval` (5 s) reports its time so far, and again each interval, so a block
        that never returns (a hung collective) still accrues its time; the parts add up to the block."""
        if name not in _KNOWN_PHASES:
            name = self._phase_name(name)
        return _Phase(self, name)

    def step(self, tokens: int = 0, samples: int = 0, step: int | None = None,
             flops: float | None = None) -> _Step:
        """`with telemetry.step(tokens=..., samples=...):` around one training step (a step that raises is
        not recorded). `step`: its global number (else the last one's plus one; see the class); `flops`: its
        model FLOPs (else the Telemetry's flops_per_step, or flops_per_token times `tokens`). All four may
        also be set on the block's object inside it. A number not an int within [1, MAX_COUNT], or FLOPs
        not a finite number within [0, MAX_FLOPS], are not sent (the step is; logged once)."""
        return _Step(self, tokens, samples, step, flops)

    def record_phase(self, name: str, seconds: float) -> None:
        """A phase of `seconds` that ends now (as `phase()` names it)."""
        now = _perf()
        if name not in _KNOWN_PHASES:
            name = self._phase_name(name)
        self._put(("phase", name, float(seconds), now - self._t0))

    def record_step(self, duration_seconds: float, tokens: int = 0, samples: int = 0, step: int | None = None,
                    flops: float | None = None) -> None:
        """A step of `duration_seconds` that ends now (the arguments as `step()` takes them)."""
        self._put_step(_perf(), float(duration_seconds), tokens, samples, step, flops)

    def _put_step(self, now: float, duration: float, tokens: int, samples: int, step: int | None,
                  flops: float | None) -> None:
        """A step that ended at `now`: its elapsed time only when no phase block is open (the enclosing phase
        accounts for those seconds)."""
        self._put(("step", duration, tokens, samples, self._step_number(step), self._step_flops(flops, tokens),
                   None if self._open else now - self._t0))
        if self._profile is not None:  # a capture asked for: the hot path's only cost of captures
            self._profile_step()

    def _profile_step(self) -> None:
        profile = self._profile
        if profile is not None and profile.step():
            self._profile = None

    def _step_number(self, step: object) -> int | None:
        """The number sent with a completed step, None for none; an explicit one resets the count."""
        explicit = None if step is None else _whole(step, 1)
        with self._steps_lock:
            if explicit is None and self._last_step is None:
                return None  # where a restarted process went back to is not known: no number
            number = self._last_step = self._last_step + 1 if explicit is None else explicit  # type: ignore[operator]
        # not sent: a number given that is no such int (the count goes on as for a step without one), or a count
        # past MAX_COUNT
        refused = step if step is not None and explicit is None else number if number > MAX_COUNT else None
        if refused is not None:
            self._warn_once("step", "goodput telemetry: step number %s not sent: expected an int within "
                            "[1, %d]", repr(refused), MAX_COUNT)
            return None
        return number

    def _step_flops(self, flops: object, tokens: object) -> float | None:
        if flops is None:
            if self.flops_per_step is not None:
                return self.flops_per_step
            if self.flops_per_token is None:
                return None
            try:
                flops = self.flops_per_token * tokens  # type: ignore[operator]
            except Exception:  # tokens not a number: the step itself will be refused for it
                flops = None
        checked = _flops(flops)
        if checked is None:
            self._warn_once("flops", "goodput telemetry: flops %s not sent: expected a finite number within "
                            "[0, %g]", repr(flops), MAX_FLOPS)
        return checked

    def lifecycle(self, event: str, *, resumed_from_step: int | None = None) -> None:
        """"start", "restart" or "end", with the elapsed time now. Another name is dropped (counted, logged
        once): the daemon would reject the whole batch it travelled in.

        `lifecycle("restart", resumed_from_step=N)`: this process reloaded the checkpoint holding the state
        after step N (an int within [0, MAX_COUNT]); the next step is numbered N+1. With "end", or not such
        an int, it is not sent (logged once) and the numbering goes on."""
        now = _perf()
        if event not in LIFECYCLE_EVENTS:
            self.dropped += 1
            self._warn_once("lifecycle", "goodput telemetry: unknown lifecycle event %r dropped", event)
            return
        resumed = None
        if resumed_from_step is not None:
            resumed = None if event == "end" else _whole(resumed_from_step, 0)
            if resumed is None:
                self._warn_once("resumed_from_step", "goodput telemetry: resumed_from_step=%s not sent with "
                                "%r: expected an int within [0, %d], with 'start' or 'restart'",
                                repr(resumed_from_step), event, MAX_COUNT)
            else:
                with self._steps_lock:
                    self._last_step = resumed
        # started_at and run: the constructor's event only
        self._put(("lifecycle", event, now - self._t0, resumed, None, None))

    def role(self, pipeline_stage: int, data_parallel_rank: int = 0) -> None:
        """Where this rank sits in the job's parallelism: its pipeline stage (0 for the first; 0 without pipeline
        parallelism) and the index of its pipeline, its model replica. The straggler rules compare a rank with the
        ranks of its own stage (a last stage that is slower by construction is not a straggler). Values that are
        not ints within [0, MAX_ROLE_INDEX) are not sent (logged once). goodput-instrument sets it for jobs built
        on torch.distributed.pipelining; GOODPUT_PIPELINE_STAGE and GOODPUT_DATA_PARALLEL_RANK set it for the rest."""
        stage, replica = _whole(pipeline_stage, 0), _whole(data_parallel_rank, 0)
        if stage is None or replica is None or stage >= MAX_ROLE_INDEX or replica >= MAX_ROLE_INDEX:
            self._warn_once("role", "goodput telemetry: role not sent: pipeline_stage=%s, data_parallel_rank=%s: "
                            "expected ints within [0, %d)", repr(pipeline_stage), repr(data_parallel_rank),
                            MAX_ROLE_INDEX)
            return
        if self._role == (stage, replica):
            return
        self._role = (stage, replica)
        self._put(("role", stage, replica))

    def target(self, steps: int | None = None, *, deadline: float | None = None) -> None:
        """Where the job's training ends: `steps`, the global number of its last optimizer step (its max_steps: the
        job is done when its steps, numbered 1, 2, ... across restarts, reach it), and `deadline`, the Unix time by
        which its owner needs it finished. Either may be left out (None: left as it was). For the forecast of when
        the job finishes (the daemon exports them as goodput_target_step_number, goodput_deadline_timestamp_seconds).
        What is given here wins over GOODPUT_TARGET_STEPS / GOODPUT_DEADLINE and over what goodput-instrument's
        probes read from a framework. A value that is not an int within [1, MAX_COUNT], or not a Unix time, is not
        sent (logged once)."""
        self._declare_target(steps, deadline, TARGET_EXPLICIT)

    def _target_from_env(self) -> None:
        from .contract import parse_deadline

        steps, deadline = _from_env(TARGET_STEPS_ENV), _from_env(DEADLINE_ENV)
        number = None if steps is None else _whole(_env_int(steps), 1)
        if steps is not None and number is None:
            self._warn_once("target", "goodput telemetry: %s=%r ignored: expected an int within [1, %d]",
                            TARGET_STEPS_ENV, steps, MAX_COUNT)
        when = None if deadline is None else parse_deadline(deadline)
        if deadline is not None and when is None:
            self._warn_once("deadline", "goodput telemetry: %s=%r ignored: expected Unix seconds or an ISO 8601 date "
                            "and time with its UTC offset (2026-01-01T00:00:00Z)", DEADLINE_ENV, deadline)
        self._declare_target(number, when, TARGET_ENV)

    def _declare_target(self, steps: object, deadline: object, by: int) -> None:
        """A target (and/or deadline) told with precedence `by`: kept where nothing of a higher precedence told it."""
        changed = False
        if steps is not None:
            number = _whole(steps, 1)
            if number is None:
                self._warn_once("target", "goodput telemetry: target steps %s not sent: expected an int within "
                                "[1, %d]", repr(steps), MAX_COUNT)
            elif by >= self._target_by[0]:
                changed |= self._target[0] != number
                self._target[0], self._target_by[0] = number, by
        if deadline is not None:
            when = _deadline(deadline)
            if when is None:
                self._warn_once("deadline", "goodput telemetry: deadline %s not sent: expected a Unix time",
                                repr(deadline))
            elif by >= self._target_by[1]:
                changed |= self._target[1] != when
                self._target[1], self._target_by[1] = when, by
        if changed:
            self._put(("target", *self._target))

    # --- inference requests ----------------------------------------------------------------------------

    def request(self, model: str, prompt_tokens: int = 0, ttft_objective_seconds: float | None = None,
                tpot_objective_seconds: float | None = None) -> _Request:
        """`with telemetry.request(model="llama-3-8b", prompt_tokens=n) as r:` around one request, from its
        arrival to its last byte; `r.token()` as each output token (`r.token(n)`: n tokens at once) is
        sent, `r.queued()` when it leaves the queue, if the server knows.

        `r.finish_reason` is "stop" unless set to "length", "abort" or "error" in the block; when the block
        raises and it was not set, "error" ("abort" for GeneratorExit and asyncio.CancelledError, a client
        gone away). The exception goes on unchanged. Another reason is recorded as "stop" (logged once).
        After the block: `r.ttft_seconds`, `r.tpot_seconds`, `r.e2e_seconds`, `r.queue_seconds`, and
        `r.ttft_met`, `r.tpot_met`, `r.met` (TTFT met and TPOT met or not judged), None where not judged.
        An objective not within (0, MAX_SECONDS] is replaced by the Telemetry's (logged once)."""
        return _Request(self, model, prompt_tokens,
                        self._objective(ttft_objective_seconds, self.ttft_objective_seconds, "ttft"),
                        self._objective(tpot_objective_seconds, self.tpot_objective_seconds, "tpot"))

    def record_request(self, model: str, ttft_seconds: float | None, tpot_seconds: float | None,
                       e2e_seconds: float, output_tokens: int, prompt_tokens: int = 0,
                       inter_token_seconds: Iterable[float] = (), queue_seconds: float | None = None,
                       finish_reason: str = "stop", ttft_objective_seconds: float | None = None,
                       tpot_objective_seconds: float | None = None) -> None:
        """One finished request that the server measured itself (see the wire contract for each value;
        `inter_token_seconds`: the gaps between its output tokens). A request with a value the daemon
        would refuse (not finite, over MAX_SECONDS or MAX_COUNT, a model name not matching MODEL_PATTERN)
        is dropped and counted in `dropped`, logged once; a negative time is sent as 0."""
        try:
            request = _Request(self, model, prompt_tokens,
                               self._objective(ttft_objective_seconds, self.ttft_objective_seconds, "ttft"),
                               self._objective(tpot_objective_seconds, self.tpot_objective_seconds, "tpot"))
            request.ttft_seconds, request.tpot_seconds = ttft_seconds, tpot_seconds
            request.e2e_seconds, request.queue_seconds = e2e_seconds, queue_seconds
            request.output_tokens = output_tokens
            itl = request._itl
            for gap in inter_token_seconds:
                gap = _time(gap, "inter_token_seconds")  # type: ignore[assignment]  # not None: gap is not
                itl[bisect_left(ITL_BUCKETS, gap)] += 1
                request.itl_sum += gap
            self._submit_request(request, finish_reason)
        except Exception as problem:  # never into the server
            self._drop_request(model, problem)

    def _objective(self, value: float | None, default: float, name: str) -> float:
        if value is None:
            return default
        if _valid_objective(value):
            return float(value)
        self._warn_once(f"objective-{name}", f"goodput telemetry: {name} objective %s replaced by the default",
                        repr(value))
        return default

    def _valid_model(self, model: str) -> bool:
        known = self._models.get(model)
        if known is None:
            import re  # here, not at import time

            if len(self._models) >= _MODELS_REMEMBERED:
                self._models.clear()
            known = self._models[model] = isinstance(model, str) and re.match(MODEL_PATTERN, model) is not None
        return known

    def _submit_request(self, r: _Request, reason: str) -> str:
        """Check, judge and queue a finished request; returns the finish reason recorded. Raises _Invalid
        (or ValueError, TypeError) for a request the daemon would refuse."""
        if reason not in _KNOWN_REASONS:
            self._warn_once("finish_reason", "goodput telemetry: unknown finish reason %s recorded as 'stop'",
                            repr(reason))
            reason = FALLBACK_FINISH_REASON
        if not self._valid_model(r.model):
            raise _Invalid(f"the model name does not match {MODEL_PATTERN}")
        ttft = r.ttft_seconds = _time(r.ttft_seconds, "ttft_seconds")
        tpot = r.tpot_seconds = _time(r.tpot_seconds, "tpot_seconds")
        e2e = r.e2e_seconds = _required_time(r.e2e_seconds, "e2e_seconds")
        queue = r.queue_seconds = _time(r.queue_seconds, "queue_seconds")
        itl_sum = _required_time(r.itl_sum, "itl_sum")
        prompt = _count(r.prompt_tokens, "prompt_tokens")
        output = r.output_tokens = _count(r.output_tokens, "output_tokens")
        if max(r._itl) > MAX_COUNT:
            raise _Invalid("more inter-token gaps than MAX_COUNT")
        r.ttft_met, r.tpot_met, r.met = judge(ttft, tpot, r.ttft_objective_seconds, r.tpot_objective_seconds)
        self._put(("request", r.model, ttft, tpot, e2e, queue, prompt, output, r._itl, itl_sum, reason,
                   r.ttft_objective_seconds, r.tpot_objective_seconds))
        return reason

    def _drop_request(self, model: object, problem: Exception) -> None:
        self.dropped += 1
        self._warn_once("request", "goodput telemetry: a request dropped (%s)", f"model {model!r}: {problem}")

    def data_wait(self, iterable: Iterable[T]) -> Iterator[T]:
        """Yield from `iterable` (e.g. a PyTorch DataLoader), timing each wait as data_wait. Each wait is
        an open phase block, as in `phase()`: a step that ends during one carries no elapsed time."""
        iterator = iter(iterable)
        while True:
            block = self._enter_phase("data_wait")
            try:
                item = next(iterator)
            except StopIteration:  # the end of the iterable: its last wait is not reported
                self._leave_phase(block, report=False)
                return
            except BaseException:
                self._leave_phase(block, report=False)
                raise
            self._leave_phase(block)
            yield item

    def _enter_phase(self, name: str) -> list:  # type: ignore[type-arg]
        block = [name, _perf()]
        self._open.append(block)  # list.append and remove: atomic
        return block

    def _leave_phase(self, block: list, report: bool = True) -> None:  # type: ignore[type-arg]
        """The phase's end: its length (since its start, or since the part of it already reported) and its
        elapsed time from the same reading."""
        with self._phase_lock:
            now = _perf()
            try:
                self._open.remove(block)
            except ValueError:  # left twice: reported already
                return
            if report and not self._closing:  # a block left after close() began: its time went before the `end`
                self._put(("phase", block[0], now - block[1], now - self._t0))

    def _report_open_phases(self) -> None:
        """On the sender thread: each phase open over `open_phase_interval` reports its time so far as a phase that
        ends now, and goes on from now, so a rank stuck in a block (a hung collective) still accrues its time."""
        if not self._open:
            return
        with self._phase_lock:
            if self._closing:  # nothing after the `end`: close() reported the open phases before it
                return
            now = _perf()
            for block in self._open:
                if now - block[1] >= self.open_phase_interval:
                    self._put(("phase", block[0], now - block[1], now - self._t0))
                    block[1] = now

    def dump_flight_recorder(self, directory: str, interval: float = 60.0) -> None:
        """Every `interval` seconds (and once more on close), write this rank's PyTorch flight-recorder
        buffer (the pickle of `_dump_fr_trace`) to `directory/<workload>/comm_lib_trace_rank_<rank>`,
        replacing the previous dump atomically, for the daemon's flight source (`flight.dir`) to read. The
        folder is `workload_folder(workload)`: the name, with characters other than letters, digits and `_.-`
        as %XX, which the daemon reads back as the same name.

        That is PyTorch's own default file name: with TORCH_FR_DUMP_TEMP_FILE set to
        `directory/<workload>/comm_lib_trace_rank_`, NCCL's dump on a timeout replaces the last periodic
        one with the state at the hang. Failures are counted in `dump_errors`."""
        # the workload's name, reversibly: the daemon reads the folder back as the same `workload`
        self._fr_target = os.path.join(directory, workload_folder(self.workload), f"{FLIGHT_DUMP_PREFIX}{self.rank}")
        self._fr_thread = threading.Thread(target=self._dump_loop, args=(interval,), name="goodput-fr-dump",
                                           daemon=True)
        self._fr_thread.start()

    def _dump_loop(self, interval: float) -> None:
        while not self._fr_stop.wait(interval):
            self._dump_once()

    def _dump_once(self) -> None:
        target = self._fr_target
        if target is None:
            return
        try:
            from .capture import dump_flight

            dump_flight(target)
            self.dumps += 1
        except Exception as exc:  # no torch, no process group, a full disk: never into the loop
            self.dump_errors += 1
            _log().debug("goodput telemetry: flight-recorder dump failed: %s", exc)

    # --- the background sender --------------------------------------------------------------------

    def _encode(self, event: tuple) -> dict[str, object]:  # type: ignore[type-arg]
        """The wire event of a queued tuple:
            ("phase", name, seconds, elapsed)
            ("step", duration, tokens, samples, number|None, flops|None, elapsed|None)
            ("lifecycle", event, elapsed, resumed_from_step|None, started_at|None, run|None)
            ("request", ...)
            ("capture", id, kind, result, path, bytes, message)
            ("role", pipeline_stage, data_parallel_rank)
            ("target", target_steps|None, deadline|None)"""
        kind = event[0]
        if kind == "role":
            return role_event(self.workload, self.rank, event[1], event[2])
        if kind == "target":
            return target_event(self.workload, self.rank, event[1], event[2])
        if kind == "phase":
            return phase_event(self.workload, self.rank, event[1], event[2], elapsed_seconds=event[3])
        if kind == "step":
            _, duration, tokens, samples, number, flops, elapsed = event
            return step_event(self.workload, self.rank, duration, tokens, samples, step=number, flops=flops,
                              dtype=self.dtype, elapsed_seconds=elapsed)
        if kind == "request":
            (_, model, ttft, tpot, e2e, queue, prompt, output, itl, itl_sum, reason, ttft_objective,
             tpot_objective) = event
            return request_event(self.workload, self.rank, model, ttft_seconds=ttft, tpot_seconds=tpot,
                                 e2e_seconds=e2e, queue_seconds=queue, prompt_tokens=prompt,
                                 output_tokens=output, itl_counts=itl, itl_sum=itl_sum, finish_reason=reason,
                                 ttft_objective_seconds=ttft_objective, tpot_objective_seconds=tpot_objective)
        if kind == "capture":
            _, capture_id, capture_kind, result, path, size, message = event
            return capture_event(self.workload, self.rank, capture_id, capture_kind, result, path=path, size=size,
                                 message=message)
        _, name, elapsed, resumed, started_at, run = event
        return lifecycle_event(self.workload, self.rank, name, elapsed_seconds=elapsed, started_at=started_at,
                               resumed_from_step=resumed, run=run)

    def _send(self, batch: list[tuple], path: str = EVENTS_PATH) -> str | None:  # type: ignore[type-arg]
        """Post one batch; None when the daemon accepted it (and the capture requests of its answer are taken
        up), else what went wrong: starting with UNANSWERED when it went out whole and no answer came."""
        from .transport import NoAnswer  # loaded with Transport when this Telemetry was made

        self._last_post = time.monotonic()
        try:
            status, text = self._transport.post(path, encode(batch_body([self._encode(e) for e in batch])))
        except NoAnswer as exc:
            return f"{UNANSWERED}: {exc}"
        except Exception as exc:  # absent, slow, or anything else: never into the training loop
            return f"{exc.__class__.__name__}: {exc}"
        if status != 200:
            return f"daemon answered {status}: {text[:200]}"
        if '"captures"' in text:  # the common answer, {"accepted": N}, is not parsed
            self._take_captures(text)
        return None

    def _poll(self) -> None:
        """Ask the daemon for this rank's capture requests with an empty batch. A failed poll loses no event:
        counted in `poll_errors`, logged at debug level; one the daemon refuses (a daemon older than polls,
        answering 4xx) is not sent again."""
        problem = self._send([], poll_path(self.workload, self.rank))
        if problem is not None:
            self.poll_errors += 1
            if problem.startswith("daemon answered 4"):
                self._polling = False
            _log().debug("goodput telemetry: capture poll failed (%s)%s", problem,
                         "" if self._polling else "; not polling again")

    def _take_captures(self, text: str) -> None:
        """Take up the capture requests of a response (on the sender thread): a flight-recorder dump at once,
        a profile handed to the training thread's next step boundary; each answered with a capture event."""
        try:
            from .capture import Profile, flight, profile_problem, requests_in

            requests, problems = requests_in(text, self.workload, self.rank)
            for problem in problems:
                self._warn_once("capture-request", "goodput telemetry: capture request ignored: %s", problem)
            for request in requests:
                for kind in request.kinds:
                    if not self.captures:
                        self._answer((request.id, kind, "disabled", "", 0, self._captures_off))
                    elif kind == "flight":
                        self._answer(flight(request, self.rank))
                    else:
                        refusal = profile_problem(request)
                        if refusal is None and self._profile is not None:
                            refusal = ("failed", "busy: another profile capture is running in this process")
                        if refusal is None and self._closing:
                            refusal = ("failed", "the process is ending")
                        if refusal is not None:
                            self._answer((request.id, kind, refusal[0], "", 0, refusal[1]))
                            continue
                        # the training thread starts it at its next step boundary
                        self._profile = Profile(request, self.rank, self._answer)
        except Exception as exc:  # never into the sender loop
            self._warn_once("capture", "goodput telemetry: capture requests not taken up: %s", exc)

    def _answer(self, answer: Answer) -> None:
        self._put(("capture", *answer))
        self._wake.set()  # sent with the next batch, without waiting for the flush interval

    def _send_pending(self) -> None:
        while self._queue:
            batch: list[tuple] = []  # type: ignore[type-arg]
            while self._queue and len(batch) < self.max_batch:
                batch.append(self._queue.popleft())
            problem = self._send(batch)
            if problem is None:
                self.sent += len(batch)
            elif problem.startswith(UNANSWERED):
                self.unknown += len(batch)
                _log().debug("goodput telemetry: %d events sent, no answer (%s)", len(batch), problem)
            else:
                self.dropped += len(batch)
                _log().debug("goodput telemetry: %d events dropped (%s)", len(batch), problem)

    def _run(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            self._idle.clear()
            try:
                self._report_open_phases()
                if time.monotonic() - self._resent >= RESEND_SECONDS:
                    self._resend_declarations()
                self._send_pending()
                if self._polling and time.monotonic() - self._last_post >= self.poll_interval:
                    self._poll()
            finally:
                self._idle.set()
        self._send_pending()

    def _resend_declarations(self) -> None:
        """The rank's role and target again, as last told (on the sender thread): a daemon that restarted since has
        forgotten them."""
        self._resent = time.monotonic()
        role = self._role
        if role is not None:
            self._put(("role", *role))
        if self._target != [None, None]:
            self._put(("target", *self._target))

    def _end_profile(self, timeout: float) -> None:
        """A profile capture asked for or running as the process ends: stopped and answered, never left hanging.
        One running on another thread is answered and kept, for that thread's next step to stop."""
        profile = self._profile
        if profile is not None and profile.close(timeout):
            self._profile = None

    def flush(self, timeout: float = 5.0) -> bool:
        """Send what is queued now; True when the queue was emptied within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._queue and self._idle.is_set():
                return True
            self._wake.set()
            time.sleep(0.005)
        return not self._queue

    def close(self, timeout: float = 5.0) -> None:
        """Report the end of this rank, send what is left, stop the sender."""
        if self._closed.is_set():
            return
        atexit.unregister(self.close)  # a closed Telemetry is not kept alive until the process exits
        with self._phase_lock:  # each phase still open (close() inside a `with`) reports its time so far, then stops
            now = _perf()
            for block in self._open:
                self._put(("phase", block[0], now - block[1], now - self._t0))
                block[1] = now
            self._closing = True  # from now on a profile request is answered "failed", not started
        self._end_profile(timeout)
        if self._fr_thread is not None:  # the last dump before the `end`: the daemon ends the rank's dumps at its end
            self._fr_stop.set()
            self._fr_thread.join(timeout)
            self._dump_once()  # the buffer as the job ends
        self.lifecycle("end")
        self.flush(timeout)
        if self._profile is not None:  # asked for by an answer the sender was reading as we began closing
            self._end_profile(timeout)
            self.flush(timeout)
        self._closed.set()
        self._wake.set()
        self._thread.join(timeout)
        if not self._thread.is_alive():  # a sender still stuck in a request owns the connection
            self._transport.close()
