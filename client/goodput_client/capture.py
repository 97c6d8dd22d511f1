"""Captures: what a rank writes when its daemon asks (a flight-recorder dump at once, a profiler trace of its
next steps), and the answer it sends back for each.

The requests arrive in the responses the sender thread reads (`requests_in`). A flight-recorder dump is taken
on that thread at once (`flight`): a training loop hung in a collective is still dumped. A profiler trace is
taken by the training thread itself (`Profile`), from its next step boundary: the profiler records the thread
that starts it, and only that thread knows where a step ends.

A request never brings PyTorch into a process that has not imported it: such a process answers
"unsupported". Nothing raises out of this module into the training loop; what goes wrong is the answer's
"failed" and its message.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from .contract import (
    CAPTURE_ID_PATTERN,
    CAPTURE_KINDS,
    MAX_CAPTURE_MESSAGE,
    MAX_CAPTURE_STEPS,
    flight_dump_name,
    profile_trace_name,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time
    from collections.abc import Callable
    from typing import Any

# (id, kind, result, path, bytes, message): one capture event, as Telemetry queues it
Answer = tuple[str, str, str, str, int, str]

PROFILE_WARMUP_STEPS = 1  # the profiler's first step is not recorded: it pays the profiler's own start-up


class Request:
    """One capture request, as the daemon handed it out."""

    __slots__ = ("dir", "id", "kinds", "steps")

    def __init__(self, capture_id: str, kinds: tuple[str, ...], steps: object, directory: object) -> None:
        self.id = capture_id
        self.kinds = kinds
        self.steps = steps  # checked where it is used: a bad one fails the profile, not the dump
        self.dir = directory


def requests_in(text: str, workload: str, rank: int) -> tuple[list[Request], list[str]]:
    """The capture requests for (workload, rank) in the text of a 200 response, and what was wrong with those
    that could not be read (no id to answer, or no kind known). Requests for other ranks are skipped."""
    import json  # here, not at import time
    import re

    try:
        body = json.loads(text)
    except ValueError as exc:
        return [], [f"the response is not JSON ({exc})"]
    items = body.get("captures") if isinstance(body, dict) else None
    if not isinstance(items, list):
        return [], [] if items is None else ["`captures` is not a list"]
    found: list[Request] = []
    problems: list[str] = []
    for item in items:
        if not isinstance(item, dict) or item.get("workload") != workload or item.get("rank") != rank:
            if not isinstance(item, dict):
                problems.append(f"a capture request is not an object: {item!r:.80}")
            continue
        capture_id = item.get("id")
        if not isinstance(capture_id, str) or not re.fullmatch(CAPTURE_ID_PATTERN, capture_id):
            problems.append(f"capture request id {capture_id!r:.140} does not match {CAPTURE_ID_PATTERN}")
            continue
        kinds = item.get("kinds")
        known = tuple(k for k in CAPTURE_KINDS if isinstance(kinds, list) and k in kinds)
        if not known:
            problems.append(f"capture request {capture_id}: no known kind in {kinds!r:.80}")
            continue
        found.append(Request(capture_id, known, item.get("steps"), item.get("dir")))
    return found, problems


def _message(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {exc}"[:MAX_CAPTURE_MESSAGE]


def _bad_dir(request: Request) -> str | None:
    if isinstance(request.dir, str) and os.path.isabs(request.dir) and "\0" not in request.dir:
        return None
    return f"the request's dir {request.dir!r:.200} is not an absolute path"


def write_atomic(path: str, data: bytes) -> int:
    """Write `data` to `path` through `path.partial` and a rename, so that a reader never sees half a file;
    makes the folder. Returns the bytes written."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = path + ".partial"
    try:
        with open(partial, "wb") as out:
            out.write(data)
        os.replace(partial, path)
    except BaseException:
        _remove(partial)
        raise
    return len(data)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def dump_flight(path: str) -> int:
    """Write this process's flight-recorder buffer (the pickle of `_dump_fr_trace`) to `path`, atomically.
    Raises ImportError without torch.distributed; any error of PyTorch's or the disk's."""
    from torch._C._distributed_c10d import _dump_fr_trace

    return write_atomic(path, _dump_fr_trace(True, False, False))


def flight(request: Request, rank: int) -> Answer:
    """Take the flight-recorder dump a request asks for, now; the answer."""
    path = ""
    try:
        problem = _bad_dir(request)
        if problem is not None:
            return request.id, "flight", "failed", "", 0, problem
        if "torch" not in sys.modules:
            return request.id, "flight", "unsupported", "", 0, "PyTorch is not imported by this process"
        import torch.distributed as dist

        if not dist.is_available():
            return request.id, "flight", "unsupported", "", 0, "this PyTorch has no torch.distributed"
        if not dist.is_initialized():
            return request.id, "flight", "unsupported", "", 0, "no process group is initialized in this process"
        path = os.path.join(request.dir, flight_dump_name(rank))  # type: ignore[arg-type,call-overload]
        return request.id, "flight", "written", path, dump_flight(path), ""
    except ImportError as exc:
        return request.id, "flight", "unsupported", "", 0, _message(exc)
    except Exception as exc:  # a full disk, a PyTorch error: said, never raised
        return request.id, "flight", "failed", "", 0, _message(exc)


def profile_problem(request: Request) -> tuple[str, str] | None:
    """(result, message) when a profile request cannot be taken up, checked on the sender thread; None if
    it can be."""
    problem = _bad_dir(request)
    steps = request.steps
    if problem is None and (isinstance(steps, bool) or not isinstance(steps, int)
                            or not 1 <= steps <= MAX_CAPTURE_STEPS):
        problem = f"the request's steps {steps!r:.40} is not a whole number within [1, {MAX_CAPTURE_STEPS}]"
    if problem is not None:
        return "failed", problem
    if "torch" not in sys.modules:
        return "unsupported", "PyTorch is not imported by this process"
    return None


# the profiler is process-global: one capture profiles at a time in a process (ranks run as threads of one process
# would otherwise both start it, which kills the process in libtorch)
_ONE_PROFILER = threading.Lock()


class Profile:
    """One profiler capture. The sender thread makes it; the training thread calls `step()`
    at each step boundary: the first starts the profiler, each later one marks the next step (ProfilerStep#n),
    and after the warm-up step and `steps` recorded ones the trace is exported to the request's dir and the
    answer given. Only the thread that started the profiler advances it. `close()` ends it early.

    The cost falls only within a capture, all on the training thread: the profiler's start, its recording, and
    the export at the end. The first start in a process imports torch._inductor's configuration (a second or
    two where no torch.optim optimizer or compile has loaded it yet); not from the sender thread beforehand,
    where that import races the loop's own imports of torch._dynamo and breaks them."""

    def __init__(self, request: Request, rank: int, answer: Callable[[Answer], None]) -> None:
        self.request = request
        self.rank = rank
        self.steps: int = request.steps  # type: ignore[assignment]  # checked by profile_problem
        self.path = os.path.join(request.dir, profile_trace_name(rank))  # type: ignore[arg-type,call-overload]
        self._answer = answer
        self._lock = threading.Lock()
        self._profiler: Any = None
        self._thread: threading.Thread | None = None  # the thread that started the profiler (not its ident: reused)
        self._marked = 0  # step boundaries since the start
        self._exported: int | None = None  # bytes of the trace written
        self._holds = False  # this capture holds _ONE_PROFILER
        self.done = False

    def step(self) -> bool:
        """A step ended on the calling thread; True when the capture is over (answered)."""
        if not self._lock.acquire(blocking=False):  # another thread is closing it or stepping it
            return self.done
        try:
            if self.done:
                if self._profiler and threading.current_thread() is self._thread:  # answered by a close elsewhere
                    self._profiler.on_trace_ready = None  # answered "failed": nothing is exported now
                    self._stop()
                return True
            if self._profiler is None:
                self._start()
            elif threading.current_thread() is self._thread:
                self._profiler.step()
                self._marked += 1
                if self._marked > self.steps:  # the warm-up step and `steps` recorded: the trace was exported
                    self._stop()
                    self._finish("")
        except Exception as exc:  # never into the training loop
            self._fail(_message(exc))
        finally:
            self._lock.release()
        return self.done

    def close(self, timeout: float) -> bool:
        """The process ends: export what was recorded (fewer steps than asked, said in the message), or
        answer why nothing was. Waits up to `timeout` for a step boundary in progress on another thread. True
        when nothing is left running; False when the profiler runs on another thread, which alone can stop it
        (PyTorch crashes stopping it elsewhere): the answer is given, its next `step()` stops it."""
        if not self._lock.acquire(timeout=max(timeout, 0.0)):
            return False  # that thread is exporting: it answers
        try:
            if self.done:
                return not self._profiler
            if self._profiler is None:
                self._give("failed", "", 0, "the process ended before its next step boundary: the profile never "
                           "started")
                return True
            if threading.current_thread() is not self._thread:
                self._give("failed", "", 0, "closed on another thread than the profiled steps': the profiler can "
                           "only be stopped on theirs, so nothing was exported")
                return False
            recorded = self._marked - PROFILE_WARMUP_STEPS  # steps ended since the warm-up one
            self._stop()
            if self._exported is None:
                self._fail("the process ended during the profiler's warm-up step: no step was recorded")
            else:
                self._finish(f"the process ended after {max(recorded, 0)} of {self.steps} steps")
        except Exception as exc:
            self._fail(_message(exc))
        finally:
            self._lock.release()
        return True

    def _start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        if not torch.autograd.kineto_available():
            self._give("unsupported", "", 0, "this PyTorch has no Kineto profiler")
            return
        if not _ONE_PROFILER.acquire(blocking=False):
            self._give("failed", "", 0, "busy: another capture profiles this process (one at a time)")
            return
        self._holds = True
        if torch.autograd._profiler_enabled():
            self._give("failed", "", 0, "busy: a profiler is already running in this process")
            self._release()
            return
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        os.makedirs(self.request.dir, exist_ok=True)  # type: ignore[arg-type]
        profiler = profile(activities=activities,
                           schedule=schedule(wait=0, warmup=PROFILE_WARMUP_STEPS, active=self.steps, repeat=1),
                           on_trace_ready=self._export)
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            # with a process group the profiler writes its own distributedInfo; without one, Holistic Trace
            # Analysis would take every rank's trace for rank 0
            import json

            profiler.preset_metadata_json("distributedInfo", json.dumps({"rank": self.rank}))
        self._thread = threading.current_thread()
        self._profiler = profiler
        profiler.start()

    def _export(self, profiler: Any) -> None:
        """The profiler's on_trace_ready: the Chrome trace, through a .partial file and a rename."""
        partial = self.path + ".partial"
        try:
            profiler.export_chrome_trace(partial)
            os.replace(partial, self.path)
        except BaseException:
            _remove(partial)
            _remove(partial + ".tmp")  # Kineto writes through it: left behind when the disk is full
            raise
        self._exported = os.stat(self.path).st_size

    def _stop(self) -> None:
        profiler, self._profiler = self._profiler, False  # False: started once, never again
        try:
            if profiler:
                profiler.stop()
        finally:
            self._release()

    def _release(self) -> None:
        if self._holds:
            self._holds = False
            _ONE_PROFILER.release()

    def _finish(self, message: str) -> None:
        if self._exported is None:
            self._give("failed", "", 0, "the profiler never delivered its trace")
        else:
            self._give("written", self.path, self._exported, message)

    def _fail(self, message: str) -> None:
        with contextlib.suppress(Exception):  # already failing: the first error is the one said
            self._stop()
        if not self.done:
            self._give("failed", "", 0, message)

    def _give(self, result: str, path: str, size: int, message: str) -> None:
        self.done = True
        self._answer((self.request.id, "profile", result, path, size, message))
