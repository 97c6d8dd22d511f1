"""Metrics of the `ingest` source: what training jobs and inference servers report over the events API."""

from __future__ import annotations

from goodput_client.contract import E2E_BUCKETS, ITL_BUCKETS, QUEUE_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS

from ...core.catalog import Declarer, Kind

_m = Declarer("ingest")

WR = ("workload", "rank")
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
STEP_DURATION = _m(
    "goodput_step_duration_seconds", Kind.HISTOGRAM, "seconds",
    "Wall time of each training step reported by the job.", WR, STEP_BUCKETS)
STEPS = _m("goodput_steps_total", Kind.COUNTER, "", "Training steps completed.", WR)
TOKENS = _m("goodput_tokens_total", Kind.COUNTER, "", "Tokens processed by completed steps.", WR)
SAMPLES = _m("goodput_samples_total", Kind.COUNTER, "", "Samples processed by completed steps.", WR)
PHASE_SECONDS = _m(
    "goodput_phase_seconds_total", Kind.COUNTER, "seconds",
    "Seconds the rank spent per phase: compute (useful work); data_wait, comm_wait, checkpoint_save, "
    "checkpoint_restore, compile, startup, eval (evaluation passes), other (badput, as the job reported it); "
    "untracked (its elapsed time that no reported phase covers). All phases together make "
    "goodput_elapsed_seconds_total.", (*WR, "phase"))
ELAPSED = _m(
    "goodput_elapsed_seconds_total", Kind.COUNTER, "seconds",
    "Wall time the rank's processes ran on this node, as they reported it, over all their restarts: the sum of "
    "every phase, untracked included.", WR)
DOWNTIME = _m(
    "goodput_downtime_seconds_total", Kind.COUNTER, "seconds",
    "Wall time between the rank's last event before a restart and its restarted process's start (restarts within "
    "ingest.restart_window). Elapsed plus downtime is the rank's wall time since it first started on this node.",
    WR)
WASTED_STEPS = _m(
    "goodput_wasted_steps_total", Kind.COUNTER, "",
    "Steps redone after restarts: those numbered after the step the rank resumed from, up to the last it had "
    "completed.", WR)
WASTED_SECONDS = _m(
    "goodput_wasted_seconds_total", Kind.COUNTER, "seconds",
    "Duration the redone steps took the first time they ran (goodput_wasted_steps_total), wasted progress.", WR)
WASTED_COMPUTE = _m(
    "goodput_wasted_compute_seconds_total", Kind.COUNTER, "seconds",
    "Compute-phase seconds of the redone steps the first time they ran: compute minus this is productive time.",
    WR)
STEP_NUMBER = _m(
    "goodput_step_number", Kind.GAUGE, "",
    "Global number of the last step the rank completed, for jobs that number their steps.", WR)
MODEL_FLOPS = _m(
    "goodput_model_flops_total", Kind.COUNTER, "flops",
    "Model FLOPs of the rank's completed steps as the job declared them, by the data type they run in (dtype), for "
    "model FLOPs utilization against goodput_gpu_peak_flops.", (*WR, "dtype"))
STEP_TIME = _m(
    "goodput_step_time_seconds", Kind.GAUGE, "seconds",
    "The rank's step duration at three time scales, to tell a transient from a trend: window=\"last\" the last "
    "step, \"1m\" the median of the last minute's steps, \"1h\" the median of the per-minute medians of the last "
    "hour, the current minute so far included.",
    (*WR, "window"))
STEP_BASELINE = _m(
    "goodput_step_time_baseline_seconds", Kind.GAUGE, "seconds",
    "The step duration the rank's change detector holds as its normal level (robust to checkpoint and evaluation "
    "spikes); it moves only when a lasting shift is detected.", WR)
STEP_OWN_VARIATION = _m(
    "goodput_step_own_variation_ratio", Kind.GAUGE, "ratio",
    "How much the rank's own time per step (its phases other than comm_wait between two steps) varies over its "
    "last 64 steps: their interquartile range over 1.349 times their median, a coefficient of variation robust to "
    "the odd checkpoint step. About 0.01 for work that is the same each step (even on a slow node or a slow "
    "pipeline stage), 0.1 and more when batches differ from step to step and every rank waits for another in turn "
    "(the straggler rules' random kind). Absent until 32 steps with phases.", WR)
STEP_SHIFTS = _m(
    "goodput_step_time_shifts_total", Kind.COUNTER, "",
    "Lasting shifts of the rank's step duration found by its change detector, by direction (up: slower, down: "
    "faster). A shift on one rank of a job is a new straggler; on every rank, a job-wide regression.",
    (*WR, "direction"))
RANK_ROLE = _m(
    "goodput_rank_role_info", Kind.INFO, "",
    "The rank's role in its job's parallelism, where the job or its probes know it: pipeline_stage (0 for the "
    "first stage; 0 without pipeline parallelism) and data_parallel_rank (its replica's index). The straggler rules "
    "compare a rank with the ranks of its own stage. Absent when the job reported no role; value is always 1.",
    (*WR, "pipeline_stage", "data_parallel_rank"))
TARGET_STEP = _m(
    "goodput_target_step_number", Kind.GAUGE, "",
    "Global number of the step at which the job's training ends (its max_steps), where the job, its framework "
    "(Hugging Face's and Lightning's Trainer, a OneCycleLR schedule, under goodput-instrument) or GOODPUT_TARGET_STEPS "
    "declared it: the job is done when goodput_step_number reaches it. Absent when not declared.", WR)
DEADLINE = _m(
    "goodput_deadline_timestamp_seconds", Kind.GAUGE, "seconds",
    "Unix time by which the job's owner needs it finished, where the job declared it (GOODPUT_DEADLINE, "
    "Telemetry.target(deadline=...)). Absent when not declared.", WR)
RESTARTS = _m(
    "goodput_workload_restarts_total", Kind.COUNTER, "", "Restarts the job reported.", WR)
LAST_EVENT = _m(
    "goodput_workload_last_event_timestamp_seconds", Kind.GAUGE, "seconds",
    "Unix time the daemon last accepted an event from the workload's rank.", WR)
CHECKPOINT_LAST_SAVE = _m(
    "goodput_checkpoint_last_save_timestamp_seconds", Kind.GAUGE, "seconds",
    "Unix time the daemon received the rank's last completed checkpoint_save phase (the save had ended); absent "
    "until the rank reports one. `goodput-exporter health` drains a node at risk after its jobs' next save.", WR)
CHECKPOINT_INTERVAL = _m(
    "goodput_checkpoint_interval_seconds", Kind.GAUGE, "seconds",
    "Seconds between the rank's last two completed checkpoint saves; absent until it reported two.", WR)
RUN_START = _m(
    "goodput_workload_run_start_timestamp_seconds", Kind.GAUGE, "seconds",
    "Unix time each run (launch) of the job started on this node: its first process's start. A workload that names "
    "the job across its runs (GOODPUT_JOB) has one series per run its ranks here reported (the last 16), "
    "its lineage; a job whose launcher names the workload, one at most.", ("workload", "run"))

# --- inference servers: what each reported per finished request (a request event) ---
WM = ("workload", "model")
TTFT = _m(
    "goodput_inference_time_to_first_token_seconds", Kind.HISTOGRAM, "seconds",
    "Time from a request's arrival to its first output token, as the serving process reported it.", WM,
    TTFT_BUCKETS)
TPOT = _m(
    "goodput_inference_time_per_output_token_seconds", Kind.HISTOGRAM, "seconds",
    "Mean time per output token after the first, one observation per request of two tokens or more, as the "
    "serving process reported it.", WM, TPOT_BUCKETS)
ITL = _m(
    "goodput_inference_inter_token_latency_seconds", Kind.HISTOGRAM, "seconds",
    "Time between consecutive output tokens (or chunks of tokens sent together), one observation per gap.",
    WM, ITL_BUCKETS)
E2E = _m(
    "goodput_inference_e2e_request_latency_seconds", Kind.HISTOGRAM, "seconds",
    "Time from a request's arrival to its last byte.", WM, E2E_BUCKETS)
QUEUE = _m(
    "goodput_inference_queue_time_seconds", Kind.HISTOGRAM, "seconds",
    "Time a request waited in the server's queue, for the requests whose server reported it.", WM,
    QUEUE_BUCKETS)
PROMPT_TOKENS = _m(
    "goodput_inference_prompt_tokens_total", Kind.COUNTER, "", "Prompt tokens of finished requests.", WM)
GENERATION_TOKENS = _m(
    "goodput_inference_generation_tokens_total", Kind.COUNTER, "", "Output tokens of finished requests.", WM)
REQUESTS = _m(
    "goodput_inference_requests_total", Kind.COUNTER, "",
    "Finished requests, by finish reason: stop, length, abort (the client went away), error.",
    (*WM, "reason"))
SLO_MET = _m(
    "goodput_inference_slo_met_requests_total", Kind.COUNTER, "",
    "Requests that met their latency objective, counted exactly per request: ttft (time to first token within "
    "its objective), tpot (time per output token within its objective), both (ttft met, and tpot met or not "
    "measured: fewer than two tokens). Divide ttft and both by the time-to-first-token histogram's _count, "
    "tpot by the time-per-output-token histogram's _count.", (*WM, "objective"))
SLO_OBJECTIVE = _m(
    "goodput_inference_slo_objective_seconds", Kind.GAUGE, "seconds",
    "The objective the last request of the model was judged against: ttft or tpot.", (*WM, "objective"))

INGEST_ACCEPTED = _m(
    "goodput_ingest_events_accepted_total", Kind.COUNTER, "",
    "Events accepted from training jobs and inference servers, by type (step, phase, lifecycle, request, "
    "capture).",
    ("type",))
INGEST_REJECTED = _m(
    "goodput_ingest_rejected_requests_total", Kind.COUNTER, "",
    "Event requests rejected whole, by reason: invalid (bad JSON, types, values, unknown phase), truncated (the "
    "sender went away mid-body), oversize (body or batch too large), unauthorized (missing or wrong token), "
    "not_owner (a workload another uid, pod or Slurm job owns), uid_cap (the sender's uid owns too many live "
    "workloads, ranks or models: ingest.max_*_per_uid), workload_cap, rank_cap, model_cap (too many live "
    "workloads, ranks, workload and model pairs on the node).",
    ("reason",))

STATE_ERRORS = _m(
    "goodput_ingest_state_errors_total", Kind.COUNTER, "",
    "Problems with the state file under ingest.state_dir, by reason: corrupt (unparsable or malformed: set aside, "
    "started fresh), unreadable, unwritable (a write failed, e.g. a full disk; retried at the next collect: until "
    "then each rank's counters stay at what was saved last, and those of a rank never saved are withheld, "
    "goodput_ingest_state_withheld_ranks).", ("reason",))
STATE_WITHHELD = _m(
    "goodput_ingest_state_withheld_ranks", Kind.GAUGE, "",
    "Ranks whose counters are withheld from /metrics because nothing of their account could be saved under "
    "ingest.state_dir yet (a full or unwritable disk: goodput_ingest_state_errors_total{reason=\"unwritable\"}). "
    "Their gauges (step number, step time, last event) are still shown; their counters appear from their first "
    "save on, so that no counter a scrape saw can go down after a daemon restart. 0 when none is; absent without "
    "ingest.state_dir.", ())

# --- captures: what the daemon asked the ranks for, and what they wrote (ingest.capture_dir) ---
CAPTURES = _m(
    "goodput_captures_total", Kind.COUNTER, "",
    "Captures' outcomes, one per rank asked, by what triggered the capture (step_time_shift, hang, rank_missing) "
    "and result: written (the rank wrote a profiler trace or flight-recorder dump), failed (it tried and could "
    "not), refused (captures disabled in the job, or no profiler), expired (no answer within "
    "ingest.capture_timeout).", ("trigger", "result"))
CAPTURE_SKIPPED = _m(
    "goodput_capture_skipped_total", Kind.COUNTER, "",
    "Triggers of an opted-in workload that started no capture, by trigger and reason: rate_limited "
    "(ingest.capture_interval of the workload, or ingest.capture_max_per_hour of the node), refused_recently (every "
    "rank asked said within capture_interval that it cannot), budget (unfinished captures already hold "
    "ingest.capture_max_bytes).", ("trigger", "reason"))
CAPTURE_BYTES = _m(
    "goodput_capture_bytes", Kind.GAUGE, "bytes", "Bytes the captures under ingest.capture_dir hold now.", ())
CAPTURES_PRUNED = _m(
    "goodput_captures_pruned_total", Kind.COUNTER, "",
    "Captures deleted, oldest first, to keep capture_dir within ingest.capture_max_bytes (and its index within "
    "1000 captures).", ())
CAPTURE_INDEX_ERRORS = _m(
    "goodput_capture_index_errors_total", Kind.COUNTER, "",
    "Problems with the capture index (ingest.capture_dir/index.json), by reason: corrupt (unparsable or malformed: "
    "set aside), unreadable, unwritable (a write failed, e.g. a full disk: written again at the next collect, until "
    "it succeeds, and at shutdown).", ("reason",))

METRICS = _m.metrics
