"""Each GPU's failure risk as a level (0 ok, 1 watch, 2 drain, 3 replace: exporter.health.risk, the one table the
health command reads too), the worst per node, and the count of nodes at each level per cluster.

Each term is a filter: it gives a series, valued at its level and tagged with a reason of its own (so that `or`
keeps them all), only for the GPUs where it holds; every GPU with goodput_gpu_up has the level 0 term, and the worst
is kept. The trends of counters every GPU has (ECC, PCIe replays, NVLink errors, thermal throttling, losses) are
judged from two reads, now and a window ago, not from a range over every sample of the window: at 10,000 GPUs the
ranges over the hour were most of the group's 4.4 s (bench/results.md). Where the daemon started within the window
(its first hour on the node, a restart), a counter's value is its rise: the daemon counts from its start. What two
reads cannot see is left unjudged, not guessed: a counter with no value a window ago on a daemon older than the window
(a gap in the store's data). The XID terms keep their ranges: XID series exist only on the GPUs that had one."""

from __future__ import annotations

from exporter.health.risk import DRAIN, LEVELS, REPEAT_REPLACE_XIDS, REPLACE, RETIRED_PAGES_REPLACE, WATCH, xids_at

from .settings import RulesSettings, seconds

HOLD = "1h"  # an XID holds its GPU at its level this long; trends (watch) are judged over it too
REPEAT = "24h"
THERMAL_SHARE = 0.05  # of the hour throttled by temperature: watch


def _new(series: str, window: str) -> str:
    """Rose within the window, or appeared in it (a counter's first value is no increase). The appearance is held
    for the window even when the series then stops (a GPU that fell off the bus is not seen after the daemon
    restarts): `max_over_time`, not the instant series, which Prometheus lost 5m after its last sample while
    MetricsQL's increase() (first value counted) held it: the engines differed by a level for the rest of the hour."""
    return f"(increase({series}[{window}]) > 0 or (max_over_time({series}[{window}]) unless {series} offset {window}))"


def _started_within(s: RulesSettings, window: str) -> str:
    """The nodes whose daemon started within the window: its process_start_time_seconds (prometheus_client's), the
    series of the scrape that has the GPUs (another exporter on the node shares the node label where that names the
    host, not its job)."""
    c, n = s.cluster_label, s.node_label
    return f"(process_start_time_seconds > time() - {seconds(window)} and on ({c}, {n}, job) goodput_gpu_up)"


def _rose(s: RulesSettings, series: str, window: str) -> str:
    """The counter's rise over the window from two reads, where it has a value now and a window ago and did not reset;
    on a node whose daemon started within the window, its value (the daemon counts from its start: a new series, or
    one that reset). Elsewhere a counter with no value a window ago (a gap in the store's data) is not judged."""
    c, n = s.cluster_label, s.node_label
    return (f"({series} - {series} offset {window} >= 0\n      or\n      {series} and on ({c}, {n}) "
            f"{_started_within(s, window)})")


def risk_terms(s: RulesSettings) -> str:
    """Each GPU's risk terms, each a filter valued at its level and tagged with its reason, joined with `or`: the
    record keeps each GPU's worst (by its labels), `goodput-exporter diagnose` each reason's too."""
    c, n, w = s.cluster_label, s.node_label, s.windows[0]
    xid = "goodput_gpu_xid_errors_total"
    drain_xids, replace_xids = "|".join(map(str, xids_at(DRAIN))), "|".join(map(str, xids_at(REPLACE)))
    serious = "|".join(map(str, xids_at(DRAIN) + xids_at(REPLACE)))
    repeat = "|".join(map(str, REPEAT_REPLACE_XIDS))
    other = f'{xid}{{xid!~"{serious}"}}'
    replace_sel, drain_sel = f'{xid}{{xid=~"{replace_xids}"}}', f'{xid}{{xid=~"{drain_xids}"}}'
    uncorrected = 'goodput_gpu_ecc_errors_total{error_type="uncorrected"}'
    corrected = 'goodput_gpu_ecc_errors_total{error_type="corrected"}'
    thermal = 'goodput_gpu_clock_throttle_seconds_total{reason="thermal"}'
    terms = [
        ("row_remap_failure", REPLACE, "goodput_gpu_row_remap_failure == 1"),
        ("retired_pages_exhausted", REPLACE,
         f"sum without (cause) (goodput_gpu_retired_pages_total) >= {RETIRED_PAGES_REPLACE}"),
        ("xid_replace", REPLACE, f"max without (xid) ({_new(replace_sel, HOLD)})"),
        ("xid_repeated", REPLACE, f'max without (xid) (increase({xid}{{xid=~"{repeat}"}}[{REPEAT}])) >= 2'),
        ("row_remap_pending", DRAIN, "goodput_gpu_row_remap_pending == 1"),
        ("retired_pages_pending", DRAIN, "goodput_gpu_retired_pages_pending == 1"),
        ("gpu_lost", DRAIN, "goodput_gpu_up == 0"),
        ("ecc_uncorrected", DRAIN, f"{_rose(s, uncorrected, w)} > 0"),
        ("xid_drain", DRAIN, f"max without (xid) ({_new(drain_sel, HOLD)})"),
        # a series new in the window counted all its events there (the exporter counts from its start)
        ("xids_repeated", WATCH,
         f"sum without (xid) (({other} unless {other} offset {HOLD}) or increase({other}[{HOLD}])) >= 2"),
        ("gpu_flapping", WATCH, f"{_rose(s, 'goodput_gpu_lost_total', HOLD)} > 0"),
        # its daemon started within the window, on a node whose GPU it already reported a window ago
        ("exporter_restarted", WATCH,
         f"goodput_gpu_up offset {HOLD}\n    and on ({c}, {n})\n    "
         f"{_started_within(s, HOLD)}\n    and goodput_gpu_up"),
        # 5% of the hour: a GPU's thermal counter ticks at a low rate when nothing is wrong (1% sat at the noise
        # floor, so the level flickered, and Prometheus and vmalert read the flicker at different instants)
        ("thermal_throttling", WATCH, f"{_rose(s, thermal, HOLD)} > {THERMAL_SHARE * seconds(HOLD):g}"),
        ("pcie_replays_rising", WATCH, f"{_rose(s, 'goodput_gpu_pcie_replays_total', HOLD)} > 100"),
        ("nvlink_errors_rising", WATCH,
         f"sum without (error_type) ({_rose(s, 'goodput_gpu_nvlink_errors_total', HOLD)}) > 100"),
        ("ecc_corrected_rising", WATCH, f"{_rose(s, corrected, HOLD)} > 100"),
    ]
    parts = ['label_replace(goodput_gpu_up * 0, "reason", "none", "", "")'] + [
        f'label_replace(({expr}) * 0 + {level}, "reason", "{reason}", "", "")' for reason, level, expr in terms]
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
