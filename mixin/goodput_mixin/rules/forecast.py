"""When each training workload will finish: its progress towards its target, the time and GPU-hours left at P50 and
P90 with its risk of interruptions, and what its badput costs ahead. docs/forecast.md explains the model.

    uninterrupted  remaining steps x the workload's step time ahead / (1 - its step overhead), counted from when
                   its step number was scraped: a finish date, so that the groups that read it later (and the scrape
                   before them) do not add their delay to the time left
                   step time ahead: the greater of its level (the median over its ranks of each rank's change-
                   detector baseline, the level it holds through checkpoint and evaluation spikes; else its 1h
                   median of per-minute medians) and its lifetime mean (recurring episodes between the level's
                   readings); how far the two part is its uncertainty (at least MIN_UNCERTAINTY)
                   step overhead: the share of its ranks' run time outside steps (evaluation, checkpoint saves,
                   untracked), from the daemon's lifetime counters; start-up, checkpoint restores and compilation
                   are left out (a restart pays them again: they are in the interruption cost)
    rate           interruptions per GPU-hour (one GPU per rank): the workload's restarts over its rank-hours, with
                   the cluster's rate as a prior worth one interruption, (restarts + 1) / (rank-hours + 1 / prior);
                   the cluster's the same over every workload it sees, with forecast_interruptions_per_gpu_hour as
                   its prior. A young workload gets the cluster's rate; one with a history, its own.
    cost           the workload's mean downtime, redone steps, and later launches' start-up and checkpoint restore
                   per interruption, with the cluster's mean as a prior worth one; the cluster's the same over every
                   workload, with forecast_interruption_cost as its prior
    interruptions  expected over the time left: lambda x T50, lambda = rate x ranks (per second), T50 the P50 below
    P50            uninterrupted / (1 - lambda x cost): the time left, its expected interruptions' cost included
                   (absent where lambda x cost >= 0.9: at that rate the job barely finishes)
    P90            P50 + the interruptions' spread (the Poisson count's 90th percentile less its mean, to second
                   order, x cost) and the uninterrupted time's (1.2816 x uncertainty x uninterrupted), in quadrature

Every figure is the daemon's lifetime counters' last value or a gauge (no range but the stale window's and the best
goodput's memory), so a Prometheus restart loses nothing but the evaluations it missed. A workload with no target
(goodput_target_step_number) or no step within forecast_stale_window has no forecast: absent, never 0 or a huge one.

Groups, each evaluated every slow_groups_interval, three levels deep: the raw series read once (progress, the step
time, the lifetime history), the estimates from those (a few hundred series, whatever the GPU count), the finish
figures from the estimates. No rule reads a record of its own group: vmalert reads recorded series back from its
store, where a result of the same evaluation is not yet visible, so each link of a chain inside a group came an
evaluation later (with 5 s groups the P90 and the finish dates were 30-40 s behind a job's start, past the live
test's run; with 1m groups, minutes). Prometheus sees a group's earlier rules at once; both see another group's
after at most an evaluation.
"""

from __future__ import annotations

from .recording import Group, Rule
from .settings import RulesSettings, seconds

Z90 = 1.2816  # the standard normal's 90th percentile
# the Poisson count's 90th percentile, to second order (Cornish-Fisher): mean + Z90 sqrt(mean) + (Z90^2 - 1) / 6; the
# constant makes one interruption the P90 of a job expecting a third of one (a normal approximation's 0.74 did not)
POISSON_SKEW = (Z90**2 - 1) / 6
MIN_UNCERTAINTY = 0.08  # the least relative uncertainty of the uninterrupted time (bench/forecast_replay.py)
ONE_LIKELY = 0.105  # expected interruptions at which one becomes the P90 count (1 - e^-0.105 = 0.1)
MAX_LOAD = 0.9  # lambda x cost at or above it: no forecast

STEP = "workload:goodput_step_number:max"
STEP_AT = "workload:goodput_step_number_timestamp_seconds:max"
RUNS = "workload:goodput_runs:count"
TARGET = "workload:goodput_target_step_number:max"
DEADLINE = "workload:goodput_deadline_timestamp_seconds:min"
RANKS = "workload:goodput_ranks:count"
STEP_TIME = "workload:goodput_step_time_seconds:median"
MEAN_STEP = "workload:goodput_step_time_seconds:lifetime_mean"
FORECAST_STEP = "workload:goodput_step_time_seconds:forecast"
UNCERTAINTY = "workload:goodput_step_time_uncertainty_ratio"
OVERHEAD = "workload:goodput_step_overhead_ratio:lifetime"
RESTARTS = "workload:goodput_restarts:max"
WALL = "workload:goodput_wall_seconds:lifetime"
LOST = "workload:goodput_interruption_seconds:lifetime"
CLUSTER_RATE = "cluster:goodput_interruptions_per_gpu_hour:estimate"
RATE = "workload:goodput_interruptions_per_gpu_hour:estimate"
COST = "workload:goodput_interruption_cost_seconds:estimate"
CLUSTER_COST = "cluster:goodput_interruption_cost_seconds:estimate"
PROGRESS = "workload:goodput_progress_ratio"
REMAINING = "workload:goodput_remaining_steps"
FINISH_UNINTERRUPTED = "workload:goodput_finish_timestamp_seconds:uninterrupted"
UNINTERRUPTED = "workload:goodput_time_to_finish_seconds:uninterrupted"
INTERRUPTIONS = "workload:goodput_interruptions_to_finish:mean"
P50 = "workload:goodput_time_to_finish_seconds:p50"
P90 = "workload:goodput_time_to_finish_seconds:p90"
FINISH_P50 = "workload:goodput_finish_timestamp_seconds:p50"
FINISH_P90 = "workload:goodput_finish_timestamp_seconds:p90"
GPU_HOURS_P50 = "workload:goodput_gpu_hours_to_finish:p50"
GPU_HOURS_P90 = "workload:goodput_gpu_hours_to_finish:p90"
BADPUT_GPU_HOURS = "workload:goodput_badput_gpu_hours_to_finish:vs_best"


def best(s: RulesSettings) -> str:
    return f"workload:goodput_ratio:best{s.windows[-1]}"


def _progress(s: RulesSettings) -> list[Rule]:
    c = s.cluster_label
    by = f"{c}, workload"
    return [
        {"record": STEP, "expr": f"max by ({by}) (goodput_step_number)"},
        # when that step number was read (the scrape's time): the finish dates count from it, not from the
        # evaluation that reads the estimates, a scrape and up to three groups' evaluations later. `and` the series
        # itself: MetricsQL's timestamp() looks further back than its plain selector (minutes past a job's end)
        {"record": STEP_AT,
         "expr": f"max by ({by}) (\n  timestamp(goodput_step_number)\n  and\n  goodput_step_number\n)"},
        {"record": TARGET, "expr": f"max by ({by}) (goodput_target_step_number)"},
        # its lineage: the runs (launches) its ranks reported, where it names the job across them (GOODPUT_JOB)
        {"record": RUNS,
         "expr": f"count by ({by}) (\n  max by ({by}, run) (goodput_workload_run_start_timestamp_seconds)\n)"},
        {"record": DEADLINE, "expr": f"min by ({by}) (goodput_deadline_timestamp_seconds)"},
        # the ranks reporting now (a dormant rank's account has no last-event gauge)
        {"record": RANKS, "expr": f"count by ({by}) (goodput_workload_last_event_timestamp_seconds)"},
    ]


def _step_times(s: RulesSettings) -> list[Rule]:
    """The step time's two figures, from the raw series: a group of their own beside the progress (together, every
    rank's series read eight times, they took up to 1.1 s at 10,000 GPUs)."""
    c = s.cluster_label
    by = f"{c}, workload"
    return [
        # each rank's normal level (else its hour's median), the median rank's; only while the workload steps
        {"record": STEP_TIME,
         "expr": f"quantile by ({by}) (\n  0.5,\n  goodput_step_time_baseline_seconds\n"
                 f'  or ignoring (window)\n  goodput_step_time_seconds{{window="1h"}}\n)\n'
                 f"and on ({by})\n"
                 f"  max by ({by}) (changes(goodput_step_number[{s.forecast_stale_window}])) > 0"},
        # the mean step time over its ranks' lifetime (restarts and runs included): what recurring episodes (data
        # stalls, a straggler) cost its steps on average, which the level above leaves out between them
        {"record": MEAN_STEP,
         "expr": f"sum by ({by}) (goodput_step_duration_seconds_sum)\n"
                 f"/ (sum by ({by}) (goodput_step_duration_seconds_count) > 0)"},
    ]


def _history(s: RulesSettings) -> list[Rule]:
    c = s.cluster_label
    by = f"{c}, workload"
    per_launch = 'sum without (phase) (goodput_phase_seconds_total{phase=~"startup|checkpoint_restore"})'
    return [
        # run time outside steps: of each rank's elapsed time less what each launch pays once (start-up, checkpoint
        # restore, compilation), the share its steps did not take; the ranks with a step histogram only
        {"record": OVERHEAD,
         "expr": f"clamp(\n  1 - sum by ({by}) (goodput_step_duration_seconds_sum)\n  / (\n    sum by ({by}) (\n"
                 "      (\n        goodput_elapsed_seconds_total\n"
                 '        - sum without (phase) (goodput_phase_seconds_total{phase=~"startup|checkpoint_restore|'
                 'compile"})\n      )\n      and goodput_step_duration_seconds_sum\n    ) > 0\n  ),\n'
                 "  0, 0.95\n)"},
        # a job's ranks restart together: its restarts are its ranks' most
        {"record": RESTARTS, "expr": f"max by ({by}) (goodput_workload_restarts_total)"},
        # rank-seconds of wall time since each rank first reported (GPU-seconds, one GPU per rank)
        {"record": WALL,
         "expr": f"sum by ({by}) (\n  goodput_elapsed_seconds_total\n  + goodput_downtime_seconds_total\n)"},
        # what the interruptions cost it: the rank's downtime, its redone steps, and what each launch after the
        # first paid (its share r / (r + 1) of every launch's, r its restarts; all of it for a rank whose account is
        # dormant, which shows no restart count)
        {"record": LOST,
         "expr": f"max by ({by}) (\n  goodput_downtime_seconds_total\n  + goodput_wasted_seconds_total\n"
                 f"  + (\n    {per_launch}\n    * goodput_workload_restarts_total\n"
                 f"    / (goodput_workload_restarts_total + 1)\n    or\n    {per_launch}\n  )\n)"},
    ]


def _cluster_rate(s: RulesSettings) -> str:
    """The cluster's interruptions per GPU-hour, from the history group's records."""
    c = s.cluster_label
    prior = 1 / s.forecast_interruptions_per_gpu_hour
    return f"(sum by ({c}) ({RESTARTS}) + 1)\n/ (sum by ({c}) ({WALL}) / 3600 + {prior:g})"


def _cluster_cost(s: RulesSettings) -> str:
    """The cluster's mean cost of an interruption, from the history group's records, with the prior worth one."""
    c = s.cluster_label
    return f"(sum by ({c}) ({LOST}) + {seconds(s.forecast_interruption_cost)})\n/ (sum by ({c}) ({RESTARTS}) + 1)"


def _estimates(s: RulesSettings) -> list[Rule]:
    """Level 2: each read only the raw groups' records (progress, history), never a record of its own group, so that
    a ruler that reads recorded series back from its store (vmalert) sees them as soon as Prometheus does."""
    c = s.cluster_label
    prior_rate = 1 / s.forecast_interruptions_per_gpu_hour
    remaining = f"clamp_min({TARGET} - {STEP}, 0)"
    cluster_rate = _cluster_rate(s).replace("\n", "\n      ")
    cluster_cost = _cluster_cost(s).replace("\n", "\n    ")
    # the step time ahead: the greater of its level now and its lifetime mean (a level above the mean is a shift
    # that lasts, a mean above the level the episodes that come back); only while it steps, as the level
    # (each tagged, so that `or` keeps both: a comparison keeps its left side's name, and the engines differ on it)
    step_time = (f"(\n  max by ({c}, workload) (\n    label_replace({STEP_TIME}, \"of\", \"level\", \"\", \"\")\n"
                 f"    or\n    label_replace({MEAN_STEP}, \"of\", \"mean\", \"\", \"\")\n  )\n"
                 f"  and\n  {STEP_TIME}\n)")
    return [
        {"record": CLUSTER_RATE, "expr": _cluster_rate(s)},
        {"record": PROGRESS, "expr": f"clamp_max({STEP} / ({TARGET} > 0), 1)"},
        {"record": REMAINING, "expr": remaining},
        # the cluster's rate inline, not its record: a record of the same group is read back one evaluation late
        {"record": RATE,
         "expr": f"({RESTARTS} + 1)\n/ (\n    {WALL} / 3600\n    + on ({c}) group_left ()\n"
                 f"      (1 / (\n      {cluster_rate}\n      ))\n"
                 f"  or\n    {WALL} / 3600 + {prior_rate:g}\n)"},
        {"record": CLUSTER_COST, "expr": _cluster_cost(s)},
        # its own interruptions' mean cost, with the cluster's mean as the prior worth one (inline, as the rate)
        {"record": COST,
         "expr": f"(\n    {LOST}\n    + on ({c}) group_left ()\n    {cluster_cost}\n  or\n"
                 f"    {LOST} + {seconds(s.forecast_interruption_cost)}\n)\n/ ({RESTARTS} + 1)"},
        {"record": FORECAST_STEP, "expr": step_time},
        # how far the two figures of its step time part, relative to the one taken: its uninterrupted time's
        # uncertainty, at least MIN_UNCERTAINTY
        {"record": UNCERTAINTY,
         "expr": f"clamp_min(\n  abs({STEP_TIME} - {MEAN_STEP})\n  / {step_time.replace(chr(10), chr(10) + '  ')},\n"
                 f"  {MIN_UNCERTAINTY:g}\n)\nor\n{STEP_TIME} * 0 + {MIN_UNCERTAINTY:g}"},
        # the date it would finish uninterrupted, from when its step number was read (a date does not age as the
        # groups after this one read it); no overhead figure (no step histogram yet): none
        {"record": FINISH_UNINTERRUPTED,
         "expr": f"{STEP_AT}\n+ {remaining} * {step_time}\n/ (\n  (1 - {OVERHEAD})\n  or\n  {STEP_TIME} * 0 + 1\n)"},
        # the best goodput it sustained over the long window within the memory: kept through a gap shorter than it
        # (a max_over_time of another record, not a running maximum reading its own: that would be a cycle)
        {"record": best(s), "expr": _best_expr(s)},
    ]


def _best_expr(s: RulesSettings) -> str:
    return f"max_over_time(workload:goodput_ratio:rate{s.windows[-1]}[{s.forecast_best_memory}])"


def _finish(s: RulesSettings) -> list[Rule]:
    """Level 3: from the estimates' records only. P50 = uninterrupted + interruptions x cost, with interruptions =
    lambda x P50, is uninterrupted / (1 - lambda x cost); each figure is written out from the estimates rather than
    read from another record of this group (vmalert would see that one an evaluation late, each link of a chain one
    more: a finish date minutes behind its inputs and absent for as long after a job starts)."""
    lam = f"{RATE} * {RANKS} / 3600"  # interruptions per second of the workload's wall time
    load = f"(1 - ({lam} * {COST} < {MAX_LOAD:g}))"  # absent at or above MAX_LOAD
    left = f"clamp_min({FINISH_UNINTERRUPTED} - time(), 0)"  # its uninterrupted time left, from now
    p50 = f"{left}\n/ {load}"
    interruptions = f"{left} * {lam}\n/ {load}"
    # P90: P50 plus, in quadrature, the interruptions' spread (the Poisson count's 90th percentile less its mean, to
    # second order, the skew's constant phased in up to ONE_LIKELY) and the uninterrupted time's (its uncertainty)
    count = interruptions.replace(chr(10), chr(10) + "      ")
    spread = (f"(\n    {Z90:g} * sqrt(\n      {count}\n    )\n"
              f"    + {POISSON_SKEW:.4f} * clamp_max(\n      {count}\n      / {ONE_LIKELY:g},\n      1\n    )\n"
              f"  ) * {COST}")
    p90 = (f"{p50}\n+ sqrt(\n  (\n  {spread}\n  ) ^ 2\n  + (\n    {Z90:g} * {UNCERTAINTY}\n"
           f"    * {left}\n  ) ^ 2\n)")
    goodput = f"workload:goodput_ratio:rate{s.windows[-1]}"

    def times(expr: str, factor: str) -> str:
        return f"(\n  {expr.replace(chr(10), chr(10) + '  ')}\n)\n{factor}"

    return [
        {"record": UNINTERRUPTED, "expr": left},
        {"record": INTERRUPTIONS, "expr": interruptions},
        {"record": P50, "expr": p50},
        {"record": P90, "expr": p90},
        {"record": FINISH_P50, "expr": f"time() + {times(p50, '')}".rstrip()},
        {"record": FINISH_P90, "expr": f"time() + {times(p90, '')}".rstrip()},
        {"record": GPU_HOURS_P50, "expr": times(p50, f"* {RANKS} / 3600")},
        {"record": GPU_HOURS_P90, "expr": times(p90, f"* {RANKS} / 3600")},
        # the GPU-hours of its uninterrupted time left that its best goodput would not spend (the best written out,
        # not read from its record: the long-window goodput is itself deep in the rules' levels)
        {"record": BADPUT_GPU_HOURS,
         "expr": f"clamp_min(\n  {left} * {RANKS} / 3600\n  * (1 - {goodput} / ({_best_expr(s)} > 0)),\n"
                 "  0\n)"},
    ]


def forecast_groups(s: RulesSettings) -> list[Group]:
    interval = {"interval": s.slow_groups_interval}
    return [
        {"name": "goodput.forecast_progress", **interval, "rules": _progress(s)},
        {"name": "goodput.forecast_step_time", **interval, "rules": _step_times(s)},
        {"name": "goodput.forecast_history", **interval, "rules": _history(s)},
        {"name": "goodput.forecast_estimates", **interval, "rules": _estimates(s)},
        {"name": "goodput.forecast", **interval, "rules": _finish(s)},
    ]
