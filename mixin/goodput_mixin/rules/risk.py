"""Each GPU's failure risk as a level (0 ok, 1 watch, 2 drain, 3 replace: exporter.health.risk, the one table the
health command reads too), the worst per node, and the count of nodes at each level per cluster.

Each term is a filter: it gives a series, valued at its level and tagged with a reason of its own (so that `or`
keeps them all), only for the GPUs where it holds; the level-0 term, last, gives every GPU with goodput_gpu_up its
level. At 10,000 GPUs the cost is in the vector operations over every GPU's series, not in the ranges: every term
valued 0 on every GPU (`bool`) and joined with `or` to the level-0 term first made 170,000 series an evaluation for
`or` to match and `max` to sift (4.4 s on the rules bench); comparisons with a scalar and range functions match
nothing (bench/results.md)."""

from __future__ import annotations

from exporter.health.risk import (
    DRAIN,
    LEVELS,
    REPEAT_REPLACE_XIDS,
    REPLACE,
    RETIRED_PAGES_REPLACE,
    WATCH,
    XIDS,
    xids_at,
)

from .settings import RulesSettings

HOLD = "1h"  # an XID holds its GPU at its level this long; trends (watch) are judged over it too
REPEAT = "24h"
THERMAL_SHARE = 0.05  # of the hour throttled by temperature: watch
# each GPU's trends over the hour at watch, by reason (goodput.gpu_risk_trends); absent where none holds
TREND = "gpu:goodput_gpu_risk_trend_level:max"


def _new(series: str, window: str) -> str:
    """Rose within the window, or appeared in it (a counter's first value is no increase). The appearance is held
    for the window even when the series then stops (a GPU that fell off the bus is not seen after the daemon
    restarts): `max_over_time`, not the instant series, which Prometheus lost 5m after its last sample while
    MetricsQL's increase() (first value counted) held it: the engines differed by a level for the rest of the hour."""
    return f"(increase({series}[{window}]) > 0 or (max_over_time({series}[{window}]) unless {series} offset {window}))"


def _terms(s: RulesSettings) -> tuple[list[tuple[str, int, str]], list[tuple[str, int, str]]]:
    """The risk terms as (reason, level, filter): those read at every evaluation, and the trends over the hour of the
    counters every GPU has, which the slow group reads once a minute."""
    xid = "goodput_gpu_xid_errors_total"
    listed = "|".join(map(str, sorted(XIDS)))
    repeat = "|".join(map(str, REPEAT_REPLACE_XIDS))
    other = f'{xid}{{xid!~"{listed}"}}'

    def xids(level: int) -> list[tuple[str, int, str]]:
        """The catalogued XIDs at a level: the GPU at it for HOLD after one (none: no term)."""
        codes = "|".join(map(str, xids_at(level)))
        name = {REPLACE: "xid_replace", DRAIN: "xid_drain", WATCH: "xid_watch"}[level]
        selected = xid + '{xid=~"' + codes + '"}'
        return [(name, level, f"max without (xid) ({_new(selected, HOLD)})")] if codes else []

    uncorrected = 'goodput_gpu_ecc_errors_total{error_type="uncorrected"}'
    corrected = 'goodput_gpu_ecc_errors_total{error_type="corrected"}'
    thermal = 'goodput_gpu_clock_throttle_seconds_total{reason="thermal"}'
    now = [
        ("row_remap_failure", REPLACE, "goodput_gpu_row_remap_failure == 1"),
        ("retired_pages_exhausted", REPLACE,
         f"sum without (cause) (goodput_gpu_retired_pages_total) >= {RETIRED_PAGES_REPLACE}"),
        *xids(REPLACE),
        ("xid_repeated", REPLACE, f'max without (xid) (increase({xid}{{xid=~"{repeat}"}}[{REPEAT}])) >= 2'),
        ("row_remap_pending", DRAIN, "goodput_gpu_row_remap_pending == 1"),
        ("retired_pages_pending", DRAIN, "goodput_gpu_retired_pages_pending == 1"),
        ("gpu_lost", DRAIN, "goodput_gpu_up == 0"),
        # the driver's own word (R570 and later): a GPU reset, a node reboot, a drain; what its XID 154 reports
        ("recovery_action", DRAIN, "goodput_gpu_recovery_action > 0"),
        # volatile: counted since the driver loaded, back to 0 at the GPU's reset, which NVIDIA's memory error
        # management asks for after an uncorrectable error (it activates the row remap or page retirement)
        ("ecc_uncorrected", DRAIN, f"{uncorrected} > 0"),
        *xids(DRAIN),
        *xids(WATCH),
        # a series new in the window counted all its events there (the exporter counts from its start)
        ("xids_repeated", WATCH,
         f"sum without (xid) (({other} unless {other} offset {HOLD}) or increase({other}[{HOLD}])) >= 2"),
    ]
    trends = [
        # lost and back: the daemon's count of losses (a loss between two scrapes too), and up changing (a GPU lost
        # at the daemon's start, its count's first value)
        ("gpu_flapping", WATCH,
         f"increase(goodput_gpu_lost_total[{HOLD}]) > 0\n    or\n    changes(goodput_gpu_up[{HOLD}]) > 0"),
        ("exporter_restarted", WATCH, f"resets(goodput_gpu_sampled_seconds_total[{HOLD}]) > 0"),
        # 5% of the hour: a GPU's thermal counter ticks at a low rate when nothing is wrong (1% sat at the noise
        # floor, so the level flickered, and Prometheus and vmalert read the flicker at different instants)
        ("thermal_throttling", WATCH, f"rate({thermal}[{HOLD}]) > {THERMAL_SHARE:g}"),
        ("pcie_replays_rising", WATCH, f"increase(goodput_gpu_pcie_replays_total[{HOLD}]) > 100"),
        ("nvlink_errors_rising", WATCH,
         f"sum without (error_type) (increase(goodput_gpu_nvlink_errors_total[{HOLD}])) > 100"),
        ("ecc_corrected_rising", WATCH, f"increase({corrected}[{HOLD}]) > 100"),
    ]
    return now, trends


def reasons(s: RulesSettings) -> list[str]:
    """Every reason the rules record a level for, in the terms' order (the level-0 term's `none` left out)."""
    now, trends = _terms(s)
    return [reason for reason, _, _ in now + trends]


def _tagged(terms: list[tuple[str, int, str]]) -> list[str]:
    return [f'label_replace(({expr}) * 0 + {level}, "reason", "{reason}", "", "")' for reason, level, expr in terms]


# the trends' groups, by the `kind` each records: NVLink's four series a GPU (its links' error types); the GPU's and
# the daemon's availability (up, losses, the sampled counter's resets); the other counters' rises (kind gpu)
TREND_KINDS = {"nvlink_errors_rising": "nvlink", "gpu_flapping": "availability", "exporter_restarted": "availability"}
TREND_GROUPS = {"gpu": "goodput.gpu_risk_trends", "availability": "goodput.gpu_risk_trends_availability",
                "nvlink": "goodput.gpu_risk_trends_nvlink"}


def trend_terms(s: RulesSettings, kind: str) -> str:
    """The trends over the hour of one kind (TREND_KINDS), each a filter valued at its level and tagged with its
    reason, joined with `or`."""
    return "\nor\n  ".join(_tagged([t for t in _terms(s)[1] if TREND_KINDS.get(t[0], "gpu") == kind]))


def risk_terms(s: RulesSettings) -> str:
    """Each GPU's risk terms, each a filter valued at its level and tagged with its reason, joined with `or`: the
    terms read now, the slow group's trends (TREND, their reasons kept), and the level-0 term. The record keeps each
    GPU's worst (by its labels), `goodput-exporter diagnose` each reason's too."""
    # the level-0 term last: each `or` before it matches a few series, not every GPU's
    none = 'label_replace(goodput_gpu_up * 0, "reason", "none", "", "")'
    return "\nor\n  ".join([*_tagged(_terms(s)[0]), TREND, none])


def gpu_labels(s: RulesSettings) -> str:
    """The labels a GPU's risk level is kept by."""
    return f"{s.cluster_label}, {s.node_label}, gpu, uuid"


def risk_groups(s: RulesSettings) -> list[dict[str, object]]:
    """The trends' groups (every slow_groups_interval: hour-long windows over every GPU's counters, more than half
    the level's cost at 10,000 GPUs), one per kind (TREND_GROUPS: together 1.2 s, then the rest without NVLink's
    still about 1 s on vmalert under the rules bench's load), then the level's, which reads the trends' record."""
    c, n = s.cluster_label, s.node_label

    def trends(kind: str) -> dict[str, object]:
        # each group's own `kind`: two rules recording one name with the same labels would be one series twice
        return {"record": TREND, "expr": f"max by ({gpu_labels(s)}, reason) (\n  {trend_terms(s, kind)}\n)",
                "labels": {"kind": kind}}

    rules: list[dict[str, object]] = [
        {"record": "gpu:goodput_gpu_risk_level:max",
         "expr": f"max by ({gpu_labels(s)}) (\n  {risk_terms(s)}\n)"},
        {"record": "node:goodput_gpu_risk_level:max",
         "expr": f"max by ({c}, {n}) (gpu:goodput_gpu_risk_level:max)"},
    ]
    for value, name in enumerate(LEVELS):
        rules.append({"record": "cluster:goodput_nodes_at_risk_level:count", "labels": {"level": name},
                      "expr": f"count by ({c}) (node:goodput_gpu_risk_level:max == {value})"})
    return [*({"name": name, "interval": s.slow_groups_interval, "rules": [trends(kind)]}
              for kind, name in TREND_GROUPS.items()),
            {"name": "goodput.gpu_risk", "rules": rules}]
