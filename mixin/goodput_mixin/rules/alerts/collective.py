"""Alerts on a training workload's ranks and collectives: a straggler, a collective that hangs or misses a rank.
Group `goodput.alerts.collective` (apart from `goodput.alerts.workload`, so that neither group reads every rank and
every workload figure at once). Each names a workload, so each carries its verdict and the `diagnose` command
(alert.py).

Jobs span nodes: every alert names the node of the rank at fault (the node label; and the rank's namespace and pod
where the kubelet source knows them), never that of the ranks that wait for it, so that Alertmanager routes the page
to the owner of that node. A collective that hangs pages once per workload and process group: for the ranks missing
from it, one alert per node (and pod) they are on (their ranks listed in its description, the waiting ranks
counted); where no rank is missing (every rank joined it and none completes: the fabric, the library), one alert
with no node.
"""

from __future__ import annotations

from ..recording import COLLECTIVE_MISSING, OWN_STAGE, OWN_VARIATION, STRAGGLER_COST, STRAGGLER_LOST, with_pod
from ..settings import RulesSettings
from ..verdict import CANDIDATE
from .alert import Alert

# the verdict's findings that explain waits in collectives better than uneven work (GoodputStragglerRandom holds off)
NETWORK_FAULTS = ("rank_missing", "collective_hang", "fabric_errors", "fabric_congestion")


def _ranks_of(s: RulesSettings, record: str) -> str:
    """The ranks of the alert's workload, process group and node in `record`, listed (a query in the template)."""
    c, n = s.cluster_label, s.node_label
    return (f'{{{{ range printf "{record}{{{c}=%q,{n}=%q,workload=%q,pg=%q}}" $labels.{c} $labels.{n} '
            f"$labels.workload $labels.pg | query }}}}{{{{ .Labels.rank }}}} {{{{ end }}}}")


def _waiting(s: RulesSettings) -> str:
    """How many ranks of the alert's workload and process group wait in a collective (a query in the template)."""
    c = s.cluster_label
    return (f'{{{{ with printf "count(goodput_collective_oldest_inflight_seconds{{{c}=%q,workload=%q,pg=%q}} > 0)" '
            f"$labels.{c} $labels.workload $labels.pg | query }}}}{{{{ . | first | value }}}}{{{{ else }}}}0"
            "{{ end }}")


def _cost(s: RulesSettings) -> str:
    """What the rank costs its job (a query in the template): the share of the job's GPU time and the GPU-hours a
    day it would give back at its stage's typical speed."""
    c, w = s.cluster_label, s.windows[0]
    rank = f"{{{c}=%q,workload=%q,rank=%q}}\" $labels.{c} $labels.workload $labels.rank"
    return (f' {{{{ with printf "{STRAGGLER_COST}{w}{rank} | query }}}}It costs the job '
            "{{ . | first | value | humanizePercentage }} of its GPU time"
            f'{{{{ with printf "24 * {STRAGGLER_LOST}{w}{rank} | query }}}}: '
            '{{ . | first | value | printf "%.0f" }} GPU-hours a day{{ end }}.{{ end }}')


def _variation(s: RulesSettings) -> str:
    """The median rank's step-to-step variation of its own time, as a percentage (a query in the template)."""
    c = s.cluster_label
    return (f'{{{{ with printf "{OWN_VARIATION}{{{c}=%q,workload=%q}}" $labels.{c} $labels.workload | query }}}}'
            "{{ . | first | value | humanizePercentage }}{{ end }}")


def _wait_min(s: RulesSettings) -> str:
    """The share of its step the least-waiting rank of the alert's workload waits (a query in the template)."""
    c, w = s.cluster_label, s.windows[0]
    return (f'{{{{ with printf "workload:goodput_step_wait_min_ratio:rate{w}{{{c}=%q,workload=%q}}" $labels.{c} '
            "$labels.workload | query }}{{ . | first | value | humanizePercentage }}{{ end }}")


def _slowdown(s: RulesSettings) -> str:
    """The alert's workload's slowdown from stragglers, as a clause, where it reads more than 1.05 (a query in the
    template)."""
    c, w = s.cluster_label, s.windows[0]
    return (f'{{{{ with printf "workload:goodput_straggler_slowdown_ratio:rate{w}{{{c}=%q,workload=%q}} > 1.05" '
            f"$labels.{c} $labels.workload | query }}}}; the job runs "
            '{{ . | first | value | printf "%.2f" }}x slower than with its work spread evenly{{ end }}')


def _slowest_stage(s: RulesSettings) -> str:
    """The slowest stage of the alert's workload (a query in the template), followed by a space."""
    c, w = s.cluster_label, s.windows[0]
    return (f'{{{{ range printf "topk(1, {OWN_STAGE}{w}{{{c}=%q,workload=%q,pipeline_stage!=\\"\\"}})" $labels.{c} '
            "$labels.workload | query }}{{ .Labels.pipeline_stage }} {{ end }}")


def alerts(s: RulesSettings) -> list[Alert]:
    short = s.windows[0]
    c, node = s.cluster_label, s.node_label
    stage = "{{ with $labels.pipeline_stage }}, pipeline stage {{ . }}{{ end }}"
    of_stage = "{{ with $labels.pipeline_stage }} of its stage{{ end }}"
    pod = "{{ with $labels.pod }}, pod {{ $labels.namespace }}/{{ . }}{{ end }}"
    hung = (f"goodput_collective_oldest_inflight_seconds > {s.collective_hang_seconds:g}\n"
            f"and on ({c}, {node}, workload, rank)\n"
            f"  (time() - goodput_flight_recorder_dump_timestamp_seconds < {s.dump_stale_seconds:g})")
    return [
        Alert(
            "GoodputStraggler", "straggler.md", "critical",
            with_pod(s, f"workload_rank:goodput_straggler_ratio:rate{short} > {s.straggler_ratio}"),
            s.straggler_for,
            "One rank of a training workload is much slower than the others.",
            f"Rank {{{{ $labels.rank }}}} of workload {{{{ $labels.workload }}}} "
            f"(node {{{{ $labels.{node} }}}}{pod}{stage}) "
            "spends {{ $value | printf \"%.2f\" }}x the time per step outside collectives of the median rank"
            f"{of_stage}; every other rank waits for it.{_cost(s)}",
            per_workload=True),
        Alert(
            "GoodputStageImbalance", "stage-imbalance.md", "warning",
            f"workload:goodput_stage_imbalance_ratio:rate{short} > {s.stage_imbalance_ratio:g}\n"
            f"unless on ({c}, workload)\n  {OWN_VARIATION} > {s.straggler_random_variation:g}",
            s.stage_imbalance_for,
            "One pipeline stage of a training workload is slower than the others by construction.",
            f"Pipeline stage {_slowest_stage(s)}of workload {{{{ $labels.workload }}}} takes "
            "{{ $value | printf \"%.2f\" }}x the mean stage's time per step outside collectives, on all of its "
            "ranks alike and in every step: the other stages wait for it. Rebalance the layers between stages (no "
            "node is at fault).",
            per_workload=True),
        Alert(
            "GoodputStragglerRandom", "straggler-random.md", "warning",
            f"(\n  workload:goodput_straggler_slowdown_ratio:rate{short} > {s.straggler_random_slowdown:g}\n  or\n"
            f"  workload:goodput_step_wait_min_ratio:rate{short} > {s.straggler_random_wait_ratio:g}\n)\n"
            f"and on ({c}, workload)\n  {OWN_VARIATION} > {s.straggler_random_variation:g}\n"
            f"and on ({c}, workload)\n  workload:goodput_straggler_ratio:rate{short} <= {s.straggler_ratio:g}\n"
            f"unless on ({c}, workload)\n  {CANDIDATE}{{reason=~\"{'|'.join(NETWORK_FAULTS)}\"}}",
            s.straggler_random_for,
            "The ranks of a training workload wait for each other in turn: the slowest rank changes from step to step.",
            "Each rank of workload {{ $labels.workload }} does uneven work from step to step (its own time per step "
            f"varies by about {_variation(s)}), so each step waits for a different rank, and no rank is persistently "
            f"slower than the others. Even the rank that waits least spends {_wait_min(s)} of its step waiting"
            f"{_slowdown(s)}. Uneven batches or sequence lengths (the data pipeline's owner), not a node.",
            per_workload=True),
        Alert(
            "GoodputCollectiveRankMissing", "collective-rank-missing.md", "critical",
            f"count by ({c}, {node}, namespace, pod, workload, pg) ({COLLECTIVE_MISSING})", s.rank_missing_for,
            "Ranks on one node never joined a collective the others wait in.",
            f"{{{{ $value }}}} rank(s) of workload {{{{ $labels.workload }}}} on node {{{{ $labels.{node} }}}} "
            "have not enqueued the collective that the other ranks of process group {{ $labels.pg }} wait in: rank(s) "
            f"{_ranks_of(s, COLLECTIVE_MISSING)}({_waiting(s)} ranks wait for them).",
            per_workload=True),
        Alert(
            "GoodputCollectiveHang", "collective-hang.md", "critical",
            f"max by ({c}, workload, pg) (\n  {hung}\n)\nunless on ({c}, workload, pg)\n{COLLECTIVE_MISSING}",
            "0m",
            "A collective every rank joined has been waiting for minutes.",
            "A collective on process group {{ $labels.pg }} of workload {{ $labels.workload }} has waited "
            f"{{{{ $value | humanizeDuration }}}} in {_waiting(s)} ranks, and no rank is missing from it: look at the "
            "fabric and the collective library of the workload's nodes (a rank missing from it pages as "
            "GoodputCollectiveRankMissing instead).",
            per_workload=True),
    ]
