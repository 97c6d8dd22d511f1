"""The wire contract between a training process and the node's goodput-exporter daemon.

This module is the one place it is written: the client builds its requests with it, and the daemon
takes its validation's names and limits from it. Standard library only, and nothing imported at
module level, so that both sides (and a training image) can import it for free.

    POST EVENTS_PATH, Content-Type: application/json, optionally Authorization: Bearer <token>
    {"events": [event, ...]}            applied all or nothing: one invalid event rejects the batch

    {"type": "step", "workload": W, "rank": R, "duration_seconds": S, "tokens": N, "samples": N,
     "step": N, "flops": F, "dtype": D, "elapsed_seconds": T}
    {"type": "phase", "workload": W, "rank": R, "phase": P, "seconds": S, "elapsed_seconds": T}
    {"type": "lifecycle", "workload": W, "rank": R, "event": E, "elapsed_seconds": T,
     "started_at": U, "resumed_from_step": N, "run": X}
    {"type": "role", "workload": W, "rank": R, "pipeline_stage": S, "data_parallel_rank": D}
    {"type": "target", "workload": W, "rank": R, "target_steps": N, "deadline": U}
    {"type": "request", "workload": W, "rank": R, "model": M,
     "ttft_seconds": S|null, "tpot_seconds": S|null, "e2e_seconds": S, "queue_seconds": S|null,
     "prompt_tokens": N, "output_tokens": N, "itl_counts": [N, ...], "itl_sum": S,
     "finish_reason": F, "ttft_objective_seconds": O, "tpot_objective_seconds": O}

    W matches WORKLOAD_PATTERN; 0 <= R < MAX_RANK; P in WIRE_PHASES; E in LIFECYCLE_EVENTS;
    0 <= seconds <= MAX_SECONDS; 0 < duration_seconds <= MAX_SECONDS; 0 <= N <= MAX_COUNT;
    finite numbers only, no other keys.

The keys of the second lines are optional (older clients send none of them):

    elapsed_seconds    0 <= T <= MAX_ELAPSED: the sending process's time since its reporter started (its
                       "start" event), at the end of the event's span. The daemon counts a rank's elapsed time
                       from it, and the part that no phase covers as the phase "untracked".
    started_at         U > 0, Unix time: the wall clock at elapsed 0, on the first event of a process ("start",
                       or "restart" for a process started again after a failure). It begins a new process
                       session of the rank: after a "restart", the gap since the previous session's last
                       event is downtime; a "start" is a new run, whose steps count from scratch.
    resumed_from_step  0 <= N <= MAX_COUNT ("start" or "restart"): the checkpoint the process resumed from
                       holds the state after step N; steps numbered above N that the rank had completed
                       before are redone (wasted progress).
    run                X matches WORKLOAD_PATTERN ("start" or "restart", with started_at): the launch of the job
                       this process belongs to, where the workload names the job across its runs (GOODPUT_JOB, an
                       explicit workload) and the launcher names each run (torchrun's run id, a Slurm job ID).
                       A "start" of a run other than the rank's last is a resubmission of the same job: the
                       daemon takes it as a "restart" (the gap is downtime, the steps it redoes wasted progress).
                       The client sends it only where it differs from the workload.
    step               1 <= N <= MAX_COUNT: the global number of the step completed (steps count 1, 2, ...
                       across restarts, never per epoch).
    flops              0 <= F <= MAX_FLOPS: the model FLOPs of the step; dtype, in FLOPS_DTYPES (default
                       DEFAULT_FLOPS_DTYPE), the data type they run in, for model FLOPs utilization.

A phase "checkpoint" (DEPRECATED_PHASES) is counted as "checkpoint_save".

A "role" event says where the rank sits in its job's parallelism, so that the rules compare it with its peers:

    0 <= S < MAX_ROLE_INDEX, 0 <= D < MAX_ROLE_INDEX, both required. pipeline_stage: the rank's pipeline stage
    (0 without pipeline parallelism); data_parallel_rank: the index of its pipeline (its model replica). The
    daemon keeps the last one per rank; the client sends it again every RESEND_SECONDS, so a daemon that
    restarted learns it again.

A "target" event says where the job's training ends, where the job, its framework or its launcher knows it, for
the forecast of when it finishes:

    target_steps  1 <= N <= MAX_COUNT: the global number of the job's last optimizer step (Hugging Face's and
                  Lightning's max_steps, a OneCycleLR's total_steps, TARGET_STEPS_ENV): the job is done when its
                  step number (the step events' `step`) reaches it.
    deadline      U > 0, Unix time: when the job's owner needs it finished (DEADLINE_ENV).

    Both optional (absent or null: not known); each event replaces the rank's previous declaration whole. The
    daemon keeps the last one per rank; the client sends it again every RESEND_SECONDS, so that a daemon that
    restarted learns it again.

A "request" event is one finished request of an inference server (any process streaming tokens), for
the daemon's per (workload, model) latency histograms and SLO counts:

    M matches MODEL_PATTERN; F in FINISH_REASONS; every key is required except queue_seconds.
    ttft_seconds    arrival to the first output token; null when no token was produced
    tpot_seconds    the request's mean time per output token after the first,
                    (t_last - t_first) / (output_tokens - 1); null when output_tokens < 2
    e2e_seconds     arrival to the last byte
    queue_seconds   arrival to leaving the server's queue, when the server knows it (absent or null: not)
    itl_counts      the request's inter-token gaps, bucketed by the sender: len(ITL_BUCKETS) + 1 counts
                    (the last one past the last bound, +Inf), not cumulative; a gap g is counted under
                    the first bound b with g <= b. itl_sum is the sum of the gaps.
    O               the objectives the request was judged against: 0 < O <= MAX_SECONDS. TTFT is met when
                    ttft_seconds is not null and <= its objective, TPOT likewise; both when TTFT is met
                    and TPOT is met or null.

The buckets are vLLM's (TTFT_BUCKETS its TTFT bounds, TPOT_BUCKETS = ITL_BUCKETS its inter-token
bounds), so that the same thresholds work against either.

Captures: the daemon asks a rank for a flight-recorder dump and a profiler trace of its next steps in the
response to the rank's own POST (the training process opens no port). A 200 response is

    {"accepted": N}                     the events applied, and, when the daemon wants a capture from a
    {"accepted": N, "captures": [request, ...]}         rank that sent events in this batch:
    request: {"id": I, "workload": W, "rank": R, "kinds": [K, ...], "steps": S, "dir": D}

    I matches CAPTURE_ID_PATTERN; K in CAPTURE_KINDS; 1 <= S <= MAX_CAPTURE_STEPS; D an absolute path,
    one directory per capture, shared by its ranks. A request is handed out once.

An empty batch, {"events": []}, is a poll for the sender's requests: a client with captures enabled sends
one after CAPTURE_POLL_SECONDS with nothing else to send (so a hung training loop is still asked for its
dump), and names its rank in the query string, as `poll_path(W, R)` builds it:

    POST EVENTS_PATH?workload=W&rank=R  {"events": []}      nothing pending: {"accepted": 0}

The daemon hands out the requests of the ranks named by the batch's events and by the query string. The
rank answers each kind of a request with one event, in a later batch:

    {"type": "capture", "workload": W, "rank": R, "id": I, "kind": K, "result": X, "path": P, "bytes": N,
     "message": M}

    X in CAPTURE_RESULTS: "written" (P the file, N its bytes), "failed" (it tried; M says why), "disabled"
    (this process's captures are off: GOODPUT_CAPTURES=0), "unsupported" (no PyTorch, no profiler, no
    process group). M at most MAX_CAPTURE_MESSAGE characters; path, bytes and message may be left out
    (empty, 0, empty). The files, in D:

    profile   profile_trace_name(R) = rank-<R>.pt.trace.json: the torch.profiler Chrome trace of S steps,
              each marked ProfilerStep#<n>, as Holistic Trace Analysis reads them
    flight    flight_dump_name(R) = comm_lib_trace_rank_<R>: the `_dump_fr_trace` pickle, taken at once
"""

from __future__ import annotations

EVENTS_PATH = "/v1/events"
CONTENT_TYPE = "application/json"
EVENT_TYPES = ("step", "phase", "lifecycle", "role", "request", "capture", "target")
PHASES = ("compute", "data_wait", "comm_wait", "checkpoint_save", "checkpoint_restore", "compile", "startup", "eval",
          "other")
FALLBACK_PHASE = "other"  # where the client records a phase name it does not know
# Deprecated phase names, still accepted on the wire and by the client for one release, and what they count as.
DEPRECATED_PHASES = {"checkpoint": "checkpoint_save"}
WIRE_PHASES = (*PHASES, *DEPRECATED_PHASES)
UNTRACKED_PHASE = "untracked"  # never sent: the daemon's name for a rank's elapsed time that no phase covers
FLOPS_DTYPES = ("fp64", "tf32", "fp16", "bf16", "fp8", "fp4")  # the data types a job's model FLOPs are declared in
DEFAULT_FLOPS_DTYPE = "bf16"
MAX_ELAPSED = 10**9  # seconds a process may report having run (about 31 years)
MAX_FLOPS = 1e30  # model FLOPs of one step
LIFECYCLE_EVENTS = ("start", "restart", "end")
MAX_SECONDS = 86_400.0  # a step or phase longer than a day is a bug in the reporter, not data
MAX_COUNT = 10**12  # tokens, samples
MIN_DURATION = 1e-9  # a step's duration is positive: shorter ones are sent as this
WORKLOAD_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$"
MAX_RANK = 1_000_000
MAX_ROLE_INDEX = 1_000_000  # pipeline stages, data-parallel replicas
RESEND_SECONDS = 60.0  # how often a client sends the rank's role and target again (a restarted daemon forgot them)
PIPELINE_STAGE_ENV = "GOODPUT_PIPELINE_STAGE"  # a rank's role, where neither the job nor a probe tells it
DATA_PARALLEL_RANK_ENV = "GOODPUT_DATA_PARALLEL_RANK"
TARGET_STEPS_ENV = "GOODPUT_TARGET_STEPS"  # the job's last step number, where neither the job nor a probe tells it
DEADLINE_ENV = "GOODPUT_DEADLINE"  # when the job must be finished: Unix seconds, or ISO 8601 with its UTC offset
MAX_DEADLINE = 1e11  # Unix time (the year 5138): a later one is a unit error (milliseconds)
_FOLDER_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_HEX = frozenset("0123456789ABCDEFabcdef")


def workload_folder(workload: str) -> str:
    """The directory of a workload's files (flight-recorder dumps under flight.dir, captures), one path component:
    its name with each byte of any other character than letters, digits and `_.-` written as %XX (a leading `.`
    too). Reversible: the daemon reads the folder back as the workload's name (workload_from_folder), so the flight
    series and the ingest series of a job carry the same `workload` (`node-7/localhost:29500` is the folder
    `node-7%2Flocalhost%3A29500`). A name of many such characters can pass the 255 bytes a folder's name may have:
    writing there then fails with ENAMETOOLONG, counted where the write is."""
    out = [ch if ch in _FOLDER_SAFE else "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogateescape"))
           for ch in workload]
    if out and out[0] == ".":
        out[0] = "%2E"
    return "".join(out)


def workload_from_folder(folder: str) -> str:
    """A folder's workload name: the inverse of workload_folder. `folder` as os.scandir gives it (undecodable
    bytes as surrogates). Bytes that are not UTF-8 stay %XX, so two folders that differ only there stay apart."""
    raw = bytearray()
    data = folder.encode("utf-8", "surrogateescape")
    i = 0
    while i < len(data):
        if data[i] == 0x25 and i + 2 < len(data) and chr(data[i + 1]) in _HEX and chr(data[i + 2]) in _HEX:
            raw.append(int(data[i + 1:i + 3], 16))
            i += 3
        else:
            raw.append(data[i])
            i += 1
    text = bytes(raw).decode("utf-8", "surrogateescape")
    return "".join(f"%{ord(ch) - 0xDC00:02X}" if "\udc80" <= ch <= "\udcff" else ch for ch in text)

# --- inference requests ---
MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,255}$"
FINISH_REASONS = ("stop", "length", "abort", "error")
FALLBACK_FINISH_REASON = "stop"  # where the client records a finish reason it does not know
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
TPOT_BUCKETS = ITL_BUCKETS
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
QUEUE_BUCKETS = E2E_BUCKETS
DEFAULT_TTFT_OBJECTIVE = 1.0  # seconds
DEFAULT_TPOT_OBJECTIVE = 0.1  # seconds

DEFAULT_SOCKET = "/run/goodput-exporter/ingest.sock"  # the daemon's ingest.socket_path default
SOCKET_ENV = "GOODPUT_INGEST_SOCKET_PATH"  # the same setting, as the daemon and the client read it
# Flight-recorder dump names: <prefix><rank>. PyTorch's own default (c10d's DebugInfoWriter, which NCCL's
# dump on timeout uses: $XDG_CACHE_HOME/torch/comm_lib_trace_rank_<rank> unless TORCH_FR_DUMP_TEMP_FILE names
# another prefix) is what the client writes; the daemon's flight.prefixes reads it and the older name.
FLIGHT_DUMP_PREFIX = "comm_lib_trace_rank_"
FLIGHT_DUMP_PREFIX_LEGACY = "nccl_trace_rank_"  # PyTorch's earlier default, and this client's before
FLIGHT_DUMP_PREFIXES = (FLIGHT_DUMP_PREFIX, FLIGHT_DUMP_PREFIX_LEGACY)  # the daemon's flight.prefixes default

# --- captures ---
CAPTURE_KINDS = ("profile", "flight")
CAPTURE_RESULTS = ("written", "failed", "disabled", "unsupported")
CAPTURE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
MAX_CAPTURE_STEPS = 1000  # profiler steps one capture may ask for
MAX_CAPTURE_MESSAGE = 512  # characters of a capture event's message
CAPTURE_POLL_SECONDS = 5.0  # a client with captures on and nothing to send polls this often
CAPTURES_ENV = "GOODPUT_CAPTURES"  # "0" or "false": the client answers every request "disabled"

Event = dict[str, object]


def profile_trace_name(rank: int) -> str:
    """The profiler trace's file name in a capture's directory (".pt.trace.json", as PyTorch's own trace
    handler names them; Holistic Trace Analysis reads every .json file of a directory, so the dump is not one)."""
    return f"rank-{rank}.pt.trace.json"


def flight_dump_name(rank: int) -> str:
    """The flight-recorder dump's file name in a capture's directory."""
    return f"{FLIGHT_DUMP_PREFIX}{rank}"


def poll_path(workload: str, rank: int) -> str:
    """The path of an empty batch that polls for (workload, rank)'s capture requests."""
    from urllib.parse import urlencode  # here, not at import time

    return f"{EVENTS_PATH}?{urlencode({'workload': workload, 'rank': rank})}"


def step_event(workload: str, rank: int, duration_seconds: float, tokens: int = 0, samples: int = 0, *,
               step: int | None = None, flops: float | None = None, dtype: str = DEFAULT_FLOPS_DTYPE,
               elapsed_seconds: float | None = None) -> Event:
    event: Event = {"type": "step", "workload": workload, "rank": rank,
                    "duration_seconds": max(duration_seconds, MIN_DURATION), "tokens": int(tokens),
                    "samples": int(samples)}
    if step is not None:
        event["step"] = int(step)
    if flops is not None:
        event["flops"], event["dtype"] = float(flops), dtype
    if elapsed_seconds is not None:
        event["elapsed_seconds"] = max(0.0, elapsed_seconds)
    return event


def phase_event(workload: str, rank: int, phase: str, seconds: float, *,
                elapsed_seconds: float | None = None) -> Event:
    event: Event = {"type": "phase", "workload": workload, "rank": rank, "phase": phase, "seconds": max(0.0, seconds)}
    if elapsed_seconds is not None:
        event["elapsed_seconds"] = max(0.0, elapsed_seconds)
    return event


def lifecycle_event(workload: str, rank: int, event: str, *, elapsed_seconds: float | None = None,
                    started_at: float | None = None, resumed_from_step: int | None = None,
                    run: str | None = None) -> Event:
    body: Event = {"type": "lifecycle", "workload": workload, "rank": rank, "event": event}
    if elapsed_seconds is not None:
        body["elapsed_seconds"] = max(0.0, elapsed_seconds)
    if started_at is not None:
        body["started_at"] = float(started_at)
    if resumed_from_step is not None:
        body["resumed_from_step"] = int(resumed_from_step)
    if run is not None:
        body["run"] = run
    return body


def role_event(workload: str, rank: int, pipeline_stage: int, data_parallel_rank: int) -> Event:
    return {"type": "role", "workload": workload, "rank": rank, "pipeline_stage": int(pipeline_stage),
            "data_parallel_rank": int(data_parallel_rank)}


def target_event(workload: str, rank: int, target_steps: int | None, deadline: float | None) -> Event:
    event: Event = {"type": "target", "workload": workload, "rank": rank}
    if target_steps is not None:
        event["target_steps"] = int(target_steps)
    if deadline is not None:
        event["deadline"] = float(deadline)
    return event


def parse_deadline(text: str) -> float | None:
    """A deadline as GOODPUT_DEADLINE gives it, as Unix time: seconds since the epoch ("1767225600"), or an ISO 8601
    date and time with its UTC offset ("2026-01-01T00:00:00Z", "2026-01-01T01:00:00+01:00"). None for anything else,
    a time without an offset included (whose time zone would be a guess)."""
    import math

    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        from datetime import datetime  # here, not at import time

        try:
            moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
        except ValueError:
            return None
        if moment.tzinfo is None:
            return None
        value = moment.timestamp()
    return value if math.isfinite(value) and 0.0 < value <= MAX_DEADLINE else None


def _seconds(value: float | None) -> float | None:
    """None as None, a negative time as 0; NaN is kept (encode refuses it, as it should)."""
    if value is None:
        return None
    value = float(value)
    return 0.0 if value < 0.0 else value


def request_event(workload: str, rank: int, model: str, *, ttft_seconds: float | None, tpot_seconds: float | None,
                  e2e_seconds: float, output_tokens: int = 0, prompt_tokens: int = 0,
                  itl_counts: list[int] | None = None, itl_sum: float = 0.0, finish_reason: str = "stop",
                  ttft_objective_seconds: float = DEFAULT_TTFT_OBJECTIVE,
                  tpot_objective_seconds: float = DEFAULT_TPOT_OBJECTIVE,
                  queue_seconds: float | None = None) -> Event:
    """One finished request. Negative times are sent as 0; `itl_counts` None: no gaps."""
    event: Event = {
        "type": "request", "workload": workload, "rank": rank, "model": model,
        "ttft_seconds": _seconds(ttft_seconds), "tpot_seconds": _seconds(tpot_seconds),
        "e2e_seconds": _seconds(e2e_seconds), "prompt_tokens": int(prompt_tokens),
        "output_tokens": int(output_tokens),
        "itl_counts": [0] * (len(ITL_BUCKETS) + 1) if itl_counts is None else [int(n) for n in itl_counts],
        "itl_sum": _seconds(itl_sum), "finish_reason": finish_reason,
        "ttft_objective_seconds": float(ttft_objective_seconds),
        "tpot_objective_seconds": float(tpot_objective_seconds)}
    if queue_seconds is not None:
        event["queue_seconds"] = _seconds(queue_seconds)
    return event


def capture_event(workload: str, rank: int, capture_id: str, kind: str, result: str, *, path: str = "",
                  size: int = 0, message: str = "") -> Event:
    """A rank's answer to one kind of a capture request; the message is cut to MAX_CAPTURE_MESSAGE."""
    return {"type": "capture", "workload": workload, "rank": rank, "id": capture_id, "kind": kind,
            "result": result, "path": path, "bytes": int(size), "message": message[:MAX_CAPTURE_MESSAGE]}


def batch_body(events: list[Event]) -> dict[str, list[Event]]:
    return {"events": events}


def encode(body: dict[str, list[Event]]) -> bytes:
    """The request body as sent: compact UTF-8 JSON. NaN and infinities raise ValueError here rather
    than reach the daemon, which would reject the whole batch."""
    import json  # here, not at import time: `import goodput_client` stays cheap

    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
