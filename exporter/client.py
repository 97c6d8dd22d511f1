"""Report training steps and phases to the node's goodput-exporter, from any training loop.

    from exporter.client import Telemetry

    telemetry = Telemetry()                      # workload and rank from the launcher's environment
    for batch in telemetry.data_wait(loader):    # time spent waiting on the loader -> data_wait
        with telemetry.step(tokens=batch_tokens, samples=len(batch)):
            with telemetry.phase("compute"):
                loss = model(batch).sum(); loss.backward(); optimizer.step()

Never raises into the loop and never blocks it: events go to a bounded in-process queue that a
background thread sends in batches. When the daemon is absent or slow, events are dropped and counted
(`Telemetry.dropped`); the loop does not notice.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import httpx

from .catalog import PHASES
from .launcher import rank_from, workload_from

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_SOCKET = "/run/goodput-exporter/ingest.sock"
_perf = time.perf_counter


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def _from_env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


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
    """A per-process reporter. Create one per rank; it is thread-safe."""

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
        # the same derivation the daemon applies to GPU processes that declare nothing (exporter.launcher)
        self.workload = workload or workload_from(os.environ) or "default"
        if rank is None:
            rank = rank_from(os.environ)
        self.rank = rank if rank is not None else 0
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.flush_interval = flush_interval
        self.sent = 0  # events the daemon accepted
        self.dropped = 0  # events lost: queue full, daemon absent or slow, or rejected
        self._queue: collections.deque[tuple] = collections.deque()  # type: ignore[type-arg]
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._warned = False
        self._fr_target: Path | None = None
        self._fr_thread: threading.Thread | None = None
        self.dumps = 0
        self.dump_errors = 0
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if url:
            self._http = httpx.Client(base_url=url, headers=headers, timeout=timeout)
        else:
            path = socket_path or _from_env("GOODPUT_INGEST_SOCKET_PATH") or DEFAULT_SOCKET
            self._http = httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://goodput",
                                      headers=headers, timeout=timeout)
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

    def phase(self, name: str) -> _Phase:
        """`with telemetry.phase("data_wait"):` — one of compute, data_wait, comm_wait, checkpoint,
        startup, other. An unknown name is recorded as "other" (and logged once), never raised."""
        if name not in PHASES:
            if not self._warned:
                log.warning("goodput telemetry: unknown phase %r recorded as 'other'", name)
                self._warned = True
            name = "other"
        return _Phase(self, name)

    def step(self, tokens: int = 0, samples: int = 0) -> _Step:
        """`with telemetry.step(tokens=..., samples=...):` around one training step."""
        return _Step(self, tokens, samples)

    def record_phase(self, name: str, seconds: float) -> None:
        self._put(("phase", name if name in PHASES else "other", float(seconds)))

    def record_step(self, duration_seconds: float, tokens: int = 0, samples: int = 0) -> None:
        self._put(("step", float(duration_seconds), tokens, samples))

    def lifecycle(self, event: str) -> None:
        """"start", "restart" or "end"."""
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
        buffer (the pickle of `_dump_fr_trace`) to `directory/<workload>/nccl_trace_rank_<rank>`,
        replacing the previous dump atomically, for the daemon's flight source (`flight.dir`) to read.

        That is PyTorch's own file name: with TORCH_FR_DUMP_TEMP_FILE set to
        `directory/<workload>/nccl_trace_rank_`, NCCL's dump on a timeout replaces the last periodic
        one with the state at the hang. Failures are counted in `dump_errors`."""
        folder = _safe(self.workload)
        if folder.startswith("."):  # never a hidden folder, never "..": the daemon skips those
            folder = "_" + folder
        self._fr_target = Path(directory) / folder / f"nccl_trace_rank_{self.rank}"
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
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            partial.write_bytes(data)
            os.replace(partial, target)
            self.dumps += 1
        except Exception as exc:  # no torch, no process group, a full disk: never into the loop
            self.dump_errors += 1
            log.debug("goodput telemetry: flight-recorder dump failed: %s", exc)

    # --- the background sender --------------------------------------------------------------------

    def _encode(self, event: tuple) -> dict:  # type: ignore[type-arg]
        base = {"workload": self.workload, "rank": self.rank}
        kind = event[0]
        if kind == "phase":
            return {"type": "phase", **base, "phase": event[1], "seconds": max(0.0, event[2])}
        if kind == "step":
            return {"type": "step", **base, "duration_seconds": max(event[1], 1e-9), "tokens": int(event[2]),
                    "samples": int(event[3])}
        return {"type": "lifecycle", **base, "event": event[1]}

    def _send_pending(self) -> None:
        while self._queue:
            batch = []
            while self._queue and len(batch) < self.max_batch:
                batch.append(self._queue.popleft())
            try:
                response = self._http.post("/v1/events", json={"events": [self._encode(e) for e in batch]})
                if response.status_code == 200:
                    self.sent += len(batch)
                    continue
                problem = f"daemon answered {response.status_code}: {response.text[:200]}"
            except Exception as exc:  # absent, slow, or anything else: never into the training loop
                problem = f"{exc.__class__.__name__}: {exc}"
            self.dropped += len(batch)
            log.debug("goodput telemetry: %d events dropped (%s)", len(batch), problem)

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
        self._http.close()
