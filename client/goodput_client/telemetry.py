"""Telemetry: the per-rank reporter a training loop calls.

Never raises into the loop and never blocks it: the loop only appends to a bounded in-process queue,
which a background thread sends in batches. When the daemon is absent or slow, events are dropped and
counted (`Telemetry.dropped`); the loop does not notice.

Imports only what `import goodput_client` must: the launcher variables, the HTTP transport, JSON and
logging are imported when a Telemetry is created or first needs them.
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
import time

from .contract import (
    DEFAULT_SOCKET,
    EVENTS_PATH,
    FALLBACK_PHASE,
    FLIGHT_DUMP_PREFIX,
    LIFECYCLE_EVENTS,
    PHASES,
    SOCKET_ENV,
    batch_body,
    encode,
    lifecycle_event,
    phase_event,
    step_event,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time
    import logging
    from collections.abc import Iterable, Iterator
    from types import TracebackType
    from typing import TypeVar

    from .transport import Transport

    T = TypeVar("T")

LOGGER = "goodput_client"
_perf = time.perf_counter
_KNOWN_PHASES = frozenset(PHASES)


def _log() -> logging.Logger:
    import logging

    return logging.getLogger(LOGGER)


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


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
    __slots__ = ("_name", "_started", "_telemetry")

    def __init__(self, telemetry: Telemetry, name: str) -> None:
        self._telemetry = telemetry
        self._name = name
        self._started = 0.0

    def __enter__(self) -> _Phase:
        self._started = _perf()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._telemetry._put(("phase", self._name, _perf() - self._started))


class _Step:
    """One training step; `tokens` and `samples` may be set inside the block, once the batch is known."""

    __slots__ = ("_started", "_telemetry", "samples", "tokens")

    def __init__(self, telemetry: Telemetry, tokens: int, samples: int) -> None:
        self._telemetry = telemetry
        self.tokens = tokens
        self.samples = samples
        self._started = 0.0

    def __enter__(self) -> _Step:
        self._started = _perf()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:  # a step that raised did not complete
            self._telemetry._put(("step", _perf() - self._started, self.tokens, self.samples))


class Telemetry:
    """A per-process reporter. Create one per rank; it is thread-safe.

    `workload` and `rank` default to what the launcher's variables name (TORCHELASTIC_RUN_ID, SLURM_JOB_ID
    or MASTER_ADDR:MASTER_PORT; RANK or SLURM_PROCID), else "default" and 0. Events go to `url` when
    given, else to the Unix socket `socket_path`, else $GOODPUT_INGEST_SOCKET_PATH, else DEFAULT_SOCKET.
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
    ) -> None:
        from .transport import Transport

        self.workload, self.rank = _identity(workload, rank)
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.flush_interval = flush_interval
        self.sent = 0  # events the daemon accepted
        self.dropped = 0  # events lost: queue full, daemon absent or slow, or rejected
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
        if url:
            self._transport: Transport = Transport(url=url, token=token, timeout=timeout)
        else:
            path = socket_path or _from_env(SOCKET_ENV) or DEFAULT_SOCKET
            self._transport = Transport(socket_path=path, token=token, timeout=timeout)
        self._thread = threading.Thread(target=self._run, name="goodput-telemetry", daemon=True)
        self._thread.start()
        atexit.register(self.close)
        self.lifecycle("start")

    # --- the hot path: called from the training loop ----------------------------------------------

    def _put(self, event: tuple) -> None:  # type: ignore[type-arg]
        if len(self._queue) >= self.max_queue:
            self.dropped += 1
            return
        self._queue.append(event)

    def _warn_once(self, key: str, message: str, value: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _log().warning(message, value)

    def phase(self, name: str) -> _Phase:
        """`with telemetry.phase("data_wait"):` — one of compute, data_wait, comm_wait, checkpoint,
        startup, other. An unknown name is recorded as "other" (and logged once), never raised."""
        if name not in _KNOWN_PHASES:
            self._warn_once("phase", "goodput telemetry: unknown phase %r recorded as 'other'", name)
            name = FALLBACK_PHASE
        return _Phase(self, name)

    def step(self, tokens: int = 0, samples: int = 0) -> _Step:
        """`with telemetry.step(tokens=..., samples=...):` around one training step."""
        return _Step(self, tokens, samples)

    def record_phase(self, name: str, seconds: float) -> None:
        self._put(("phase", name if name in _KNOWN_PHASES else FALLBACK_PHASE, float(seconds)))

    def record_step(self, duration_seconds: float, tokens: int = 0, samples: int = 0) -> None:
        self._put(("step", float(duration_seconds), tokens, samples))

    def lifecycle(self, event: str) -> None:
        """"start", "restart" or "end". Another name is dropped (counted, logged once): the daemon would
        reject the whole batch it travelled in."""
        if event not in LIFECYCLE_EVENTS:
            self.dropped += 1
            self._warn_once("lifecycle", "goodput telemetry: unknown lifecycle event %r dropped", event)
            return
        self._put(("lifecycle", event))

    def data_wait(self, iterable: Iterable[T]) -> Iterator[T]:
        """Yield from `iterable` (e.g. a PyTorch DataLoader), timing each wait as data_wait."""
        iterator = iter(iterable)
        while True:
            started = _perf()
            try:
                item = next(iterator)
            except StopIteration:
                return
            self._put(("phase", "data_wait", _perf() - started))
            yield item

    def dump_flight_recorder(self, directory: str, interval: float = 60.0) -> None:
        """Every `interval` seconds (and once more on close), write this rank's PyTorch flight-recorder
        buffer (the pickle of `_dump_fr_trace`) to `directory/<workload>/comm_lib_trace_rank_<rank>`,
        replacing the previous dump atomically, for the daemon's flight source (`flight.dir`) to read.

        That is PyTorch's own default file name: with TORCH_FR_DUMP_TEMP_FILE set to
        `directory/<workload>/comm_lib_trace_rank_`, NCCL's dump on a timeout replaces the last periodic
        one with the state at the hang. Failures are counted in `dump_errors`."""
        folder = _safe(self.workload)
        if folder.startswith("."):  # never a hidden folder, never "..": the daemon skips those
            folder = "_" + folder
        self._fr_target = os.path.join(directory, folder, f"{FLIGHT_DUMP_PREFIX}{self.rank}")
        self._fr_thread = threading.Thread(target=self._dump_loop, args=(interval,), name="goodput-fr-dump",
                                           daemon=True)
        self._fr_thread.start()

    def _dump_loop(self, interval: float) -> None:
        while not self._closed.wait(interval):
            self._dump_once()

    def _dump_once(self) -> None:
        target = self._fr_target
        if target is None:
            return
        try:
            from torch._C._distributed_c10d import _dump_fr_trace

            data = _dump_fr_trace(True, False, False)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            partial = target + ".partial"
            with open(partial, "wb") as out:
                out.write(data)
            os.replace(partial, target)
            self.dumps += 1
        except Exception as exc:  # no torch, no process group, a full disk: never into the loop
            self.dump_errors += 1
            _log().debug("goodput telemetry: flight-recorder dump failed: %s", exc)

    # --- the background sender --------------------------------------------------------------------

    def _encode(self, event: tuple) -> dict[str, object]:  # type: ignore[type-arg]
        kind = event[0]
        if kind == "phase":
            return phase_event(self.workload, self.rank, event[1], event[2])
        if kind == "step":
            return step_event(self.workload, self.rank, event[1], event[2], event[3])
        return lifecycle_event(self.workload, self.rank, event[1])

    def _send(self, batch: list[tuple]) -> str | None:  # type: ignore[type-arg]
        """Post one batch; None when the daemon accepted it, else what went wrong."""
        try:
            status, text = self._transport.post(EVENTS_PATH, encode(batch_body([self._encode(e) for e in batch])))
        except Exception as exc:  # absent, slow, or anything else: never into the training loop
            return f"{exc.__class__.__name__}: {exc}"
        return None if status == 200 else f"daemon answered {status}: {text[:200]}"

    def _send_pending(self) -> None:
        while self._queue:
            batch = []
            while self._queue and len(batch) < self.max_batch:
                batch.append(self._queue.popleft())
            problem = self._send(batch)
            if problem is None:
                self.sent += len(batch)
            else:
                self.dropped += len(batch)
                _log().debug("goodput telemetry: %d events dropped (%s)", len(batch), problem)

    def _run(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            self._idle.clear()
            try:
                self._send_pending()
            finally:
                self._idle.set()
        self._send_pending()

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
        self.lifecycle("end")
        self.flush(timeout)
        self._closed.set()
        if self._fr_thread is not None:
            self._fr_thread.join(timeout)
            self._dump_once()  # the buffer as the job ends
        self._wake.set()
        self._thread.join(timeout)
        if not self._thread.is_alive():  # a sender still stuck in a request owns the connection
            self._transport.close()
