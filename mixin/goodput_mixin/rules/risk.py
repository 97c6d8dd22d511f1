"""Each GPU's failure risk as a level (0 ok, 1 watch, 2 drain, 3 replace: exporter.health.risk, the one table the
health command reads too), the worst per node, and the count of nodes at each level per cluster. Each term is
valued at its level or 0 (`bool`), tagged with a reason of its own so that `or` keeps them all, and the worst is
kept."""

from __future__ import annotations

from exporter.health.risk import DRAIN, LEVELS, REPEAT_REPLACE_XIDS, REPLACE, RETIRED_PAGES_REPLACE, WATCH, xids_at

from .settings import RulesSettings

HOLD = "1h"  # an XID holds its GPU at its level this long; trends (watch) are judged over it too
REPEAT = "24h"


def _new(series: str, window: str) -> str:
    """Rose within the window, or appeared in it (a counter's first value is no increase). The appearance is held
    for the window even when the series then stops (a GPU that fell off the bus is not seen after the daemon
    restarts): `max_over_time`, not the instant series, which Prometheus lost 5m after its last sample while
    MetricsQL's increase() (first value counted) held it: the engines differed by a level for the rest of the hour."""
    return f"(increase({series}[{window}]) > 0 or (max_over_time({series}[{window}]) unless {series} offset {window}))"


def risk_terms(s: RulesSettings) -> str:
    """Each GPU's risk terms, every one valued at its level or 0 and tagged with its reason, joined with `or`: the
    record keeps each GPU's worst (by its labels), `goodput-exporter diagnose` each reason's too."""
    w = s.windows[0]
    xid = "goodput_gpu_xid_errors_total"
    drain_xids, replace_xids = "|".join(map(str, xids_at(DRAIN))), "|".join(map(str, xids_at(REPLACE)))
    serious = "|".join(map(str, xids_at(DRAIN) + xids_at(REPLACE)))
    repeat = "|".join(map(str, REPEAT_REPLACE_XIDS))
    other = f'{xid}{{xid!~"{serious}"}}'
    replace_sel, drain_sel = f'{xid}{{xid=~"{replace_xids}"}}', f'{xid}{{xid=~"{drain_xids}"}}'
    terms = [
        ("row_remap_failure", REPLACE, "goodput_gpu_row_remap_failure == bool 1"),
        ("retired_pages_exhausted", REPLACE,
         f"sum without (cause) (goodput_gpu_retired_pages_total) >= bool {RETIRED_PAGES_REPLACE}"),
        ("xid_replace", REPLACE, f"max without (xid) ({_new(replace_sel, HOLD)}) > bool 0"),
        ("xid_repeated", REPLACE, f'max without (xid) (increase({xid}{{xid=~"{repeat}"}}[{REPEAT}])) >= bool 2'),
        ("row_remap_pending", DRAIN, "goodput_gpu_row_remap_pending == bool 1"),
        ("retired_pages_pending", DRAIN, "goodput_gpu_retired_pages_pending == bool 1"),
        ("gpu_lost", DRAIN, "goodput_gpu_up == bool 0"),
        ("ecc_uncorrected", DRAIN,
         f'increase(goodput_gpu_ecc_errors_total{{error_type="uncorrected"}}[{w}]) > bool 0'),
        ("xid_drain", DRAIN, f"max without (xid) ({_new(drain_sel, HOLD)}) > bool 0"),
        # a series new in the window counted all its events there (the exporter counts from its start)
        ("xids_repeated", WATCH,
         f"sum without (xid) (({other} unless {other} offset {HOLD}) or increase({other}[{HOLD}])) >= bool 2"),
        ("gpu_flapping", WATCH, f"changes(goodput_gpu_up[{HOLD}]) > bool 0"),
        ("exporter_restarted", WATCH, f"resets(goodput_gpu_sampled_seconds_total[{HOLD}]) > bool 0"),
        # 5% of the hour: a GPU's thermal counter ticks at a low rate when nothing is wrong (1% sat at the noise
        # floor, so the level flickered, and Prometheus and vmalert read the flicker at different instants)
        ("thermal_throttling", WATCH,
         f'rate(goodput_gpu_clock_throttle_seconds_total{{reason="thermal"}}[{HOLD}]) > bool 0.05'),
        ("pcie_replays_rising", WATCH, f"increase(goodput_gpu_pcie_replays_total[{HOLD}]) > bool 100"),
        ("nvlink_errors_rising", WATCH,
         f"sum without (error_type) (increase(goodput_gpu_nvlink_errors_total[{HOLD}])) > bool 100"),
        ("ecc_corrected_rising", WATCH,
         f'increase(goodput_gpu_ecc_errors_total{{error_type="corrected"}}[{HOLD}]) > bool 100'),
    ]
    parts = ['label_replace(goodput_gpu_up * 0, "reason", "none", "", "")'] + [
        f'label_replace({level} * ({expr}), "reason", "{reason}", "", "")' for reason, level, expr in terms]
    return "\nor\n  ".join(parts)


def gpu_labels(s: RulesSettings) -> str:
    """The labels a GPU's risk level is kept by."""
    return f"{s.cluster_label}, {s.node_label}, gpu, uuid"


def risk_rules(s: RulesSettings) -> list[dict[str, object]]:
    c, n = s.cluster_label, s.node_label
    rules: list[dict[str, object]] = [
        {"record": "gpu:goodput_gpu_risk_level:max",
         "expr": f"max by ({gpu_labels(s)}) (\n  {risk_terms(s)}\n)"},
        {"record": "node:goodput_gpu_risk_level:max",
         "expr": f"max by ({c}, {n}) (gpu:goodput_gpu_risk_level:max)"},
    ]
    for value, name in enumerate(LEVELS):
        rules.append({"record": "cluster:goodput_nodes_at_risk_level:count", "labels": {"level": name},
                      "expr": f"count by ({c}) (node:goodput_gpu_risk_level:max == {value})"})
    return rules
