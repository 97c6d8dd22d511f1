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

from ..recording import COLLECTIVE_MISSING, with_pod
from ..settings import RulesSettings
from .alert import Alert


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


def alerts(s: RulesSettings) -> list[Alert]:
    short = s.windows[0]
    c, node = s.cluster_label, s.node_label
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
            f"(node {{{{ $labels.{node} }}}}{pod}) "
            "spends {{ $value | printf \"%.2f\" }}x the median rank's time per step outside collectives; every other "
            "rank waits for it.",
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
