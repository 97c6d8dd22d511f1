"""Shared parts of the dashboards: variables, panels and queries built with grafana-foundation-sdk,
with the conventions (lint.py checks them) applied in one place: every panel and query reads the
`$datasource` variable, every panel has a description and a unit, every query has a refId."""

from __future__ import annotations

from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders.common import StackingConfig
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prom_model

from ..rules.settings import RulesSettings
from ..rules.verdict import CANDIDATE, HEALTHY, LAYERS, VERDICT, order

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAGS = ["goodput", "gpu"]
# Grafana turns an "All" selection into this regex; an absent label matches it too.
ALL = ".*"


@dataclass(frozen=True)
class Level:
    """One dashboard of the funnel: its file name, stable uid, title and what it answers."""

    number: int
    slug: str
    title: str
    answers: str

    @property
    def uid(self) -> str:
        return f"goodput-{self.slug}"

    @property
    def filename(self) -> str:
        return f"{self.number}-{self.slug}.json"


LEVELS = [
    Level(1, "cluster", "Goodput / 1 Cluster overview",
          "Is the cluster doing useful work, and what holds each job back? The verdict per workload; goodput, "
          "tokens/s, idle GPUs (allocated or not), stragglers, hangs, GPU health; the worst workloads and nodes."),
    Level(2, "collectives", "Goodput / 2 Collectives and network",
          "Is a workload waiting on its collectives or on the network? Sequence lag per rank, oldest in-flight op, "
          "missing ranks, collective time and bytes by op, NVLink and PCIe throughput; the fabric of its nodes: port "
          "throughput against link rate, errors, congestion, retries, links down, which NIC each GPU uses."),
    Level(3, "host", "Goodput / 3 Host and input pipeline",
          "Is the host starving the GPUs? Data-loader wait, CPU of the GPU processes, NUMA mismatches, "
          "CPU/IO/memory pressure, PCIe."),
    Level(4, "memory", "Goodput / 4 GPU memory",
          "Will a GPU run out of memory? Used vs total per GPU and per process, the trend, predicted exhaustion."),
    Level(5, "kernels", "Goodput / 5 Kernels and silicon",
          "Are the kernels using the silicon? Utilization, SM clock, throttle reasons, power vs limit, DCGM SM, "
          "tensor and DRAM activity."),
    Level(6, "workload", "Goodput / 6 Workload",
          "How is one job doing? Its verdict and failing checks, goodput and badput by phase, step time per rank "
          "and its lasting shifts, stragglers, collective state."),
    Level(7, "serving", "Goodput / 7 Serving (inference SLOs)",
          "Are the served models meeting their latency objectives? SLO attainment and SLO goodput, error budget "
          "burn, time to first token and per output token against the objectives, queue, KV cache, preemptions, "
          "tokens, and the GPUs under each model (links down to their memory, kernels and cluster)."),
]


class Names:
    """Recording-rule names and label names for one rules setting (the defaults are what dashboards/ ships)."""

    def __init__(self, settings: RulesSettings) -> None:
        self.settings = settings
        self.short, self.long = settings.windows[0], settings.windows[-1]
        self.node = settings.node_label
        self.cluster = settings.cluster_label

    def rule(self, level: str, metric: str, op: str) -> str:
        """`rule("gpu", "goodput_gpu_idle_ratio", "rate")` -> gpu:goodput_gpu_idle_ratio:rate5m."""
        return f"{level}:{metric}:{op}{self.short}"

    def rule_long(self, level: str, metric: str, op: str) -> str:
        return f"{level}:{metric}:{op}{self.long}"


class Filters:
    """Label matchers of a dashboard's variables, e.g. `cluster=~"$cluster", instance=~"$node"`."""

    def __init__(self, names: Names, node: bool = False, workload: bool = False) -> None:
        self.names = names
        self.has_node, self.has_workload = node, workload

    def __call__(self, *extra: str, node: bool | None = None, workload: bool | None = None) -> str:
        parts = [f'{self.names.cluster}=~"$cluster"']
        if self.has_node if node is None else node:
            parts.append(f'{self.names.node}=~"$node"')
        if self.has_workload if workload is None else workload:
            parts.append('workload=~"$workload"')
        return "{" + ", ".join([*parts, *extra]) + "}"


def datasource_variable() -> gdash.DatasourceVariable:
    return gdash.DatasourceVariable("datasource").label("Data source").type("prometheus")


def query_variable(name: str, label: str, query: str, multi: bool = True) -> gdash.QueryVariable:
    return (gdash.QueryVariable(name).label(label).datasource(DATASOURCE).query(query)
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(model.VariableSort.ALPHABETICAL_ASC)
            .multi(multi).include_all(True).all_value(ALL))


def variables(names: Names, node: bool = False, workload: bool = False) -> list[gdash.QueryVariable]:
    """cluster always; node and workload where the dashboard filters by them. Each narrows the next."""
    out = [query_variable("cluster", "Cluster", f"label_values(goodput_exporter_build_info, {names.cluster})")]
    if node:
        out.append(query_variable(
            "node", "Node", f'label_values(goodput_exporter_build_info{{{names.cluster}=~"$cluster"}}, {names.node})'))
    if workload:
        out.append(query_variable(
            "workload", "Workload", f'label_values(goodput_steps_total{{{names.cluster}=~"$cluster"}}, workload)'))
    return out


def query(expr: str, legend: str = "", ref: str = "A", instant: bool = False, table_format: bool = False
          ) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE).legend_format(legend or "__auto")
    q = q.instant() if instant else q.range()
    if table_format:
        q = q.format(prom_model.PromQueryFormat.TABLE)
    return q


Target = tuple[str, str]  # (expr, legend)


def _targets(targets: list[Target], instant: bool = False, table_format: bool = False) -> list[prometheus.Dataquery]:
    return [query(expr, legend, chr(ord("A") + i), instant, table_format) for i, (expr, legend) in enumerate(targets)]


@dataclass(frozen=True)
class DataLink:
    """A data link (the panel's fieldConfig.defaults.links): clicking a series offers `url`, in which Grafana fills in
    `${__field.labels.<label>}` from the series and `${<variable>:queryparam}`, `${__url_time_range}` from the
    dashboard. Built as Grafana stores it (the SDK's builder would write a dashboard link's fields)."""

    title: str
    url: str

    def build(self) -> dict[str, str]:
        return {"title": self.title, "url": self.url}


def link_to_node(level: Level, title: str, node: str) -> DataLink:
    """From a table row (or series) naming a node to `level` for that node, keeping the time range, data source and
    cluster. `node` is how Grafana finds the node in the clicked item: `${__data.fields.instance}` in a table,
    `${__field.labels.instance}` on a series."""
    return DataLink(title, f"/d/{level.uid}?${{__url_time_range}}&${{datasource:queryparam}}&${{cluster:queryparam}}"
                           f"&var-node={node}")


def link_to_workload(workload: str) -> DataLink:
    """From a table row (or series) naming a workload to the Workload dashboard for it, keeping the time range, data
    source and cluster. `workload` is how Grafana finds it in the clicked item: `${__data.fields.workload}` in a
    table, `${__field.labels.workload}` on a series."""
    return DataLink("This workload", f"/d/{LEVELS[5].uid}?${{__url_time_range}}&${{datasource:queryparam}}"
                                     f"&${{cluster:queryparam}}&var-workload={workload}")


def link_to_level(level: Level, title: str) -> DataLink:
    """To `level` with the time range, data source and cluster (its other variables at their defaults)."""
    return DataLink(title, f"/d/{level.uid}?${{__url_time_range}}&${{datasource:queryparam}}&${{cluster:queryparam}}")


def link_to_workload_fabric() -> DataLink:
    """From a series with a `workload` label to Collectives and network for that workload alone, on all of its
    nodes: its fabric row then shows the ports and interfaces of that job's nodes."""
    return DataLink("Fabric of this workload's nodes",
                    f"/d/{LEVELS[1].uid}?${{__url_time_range}}&${{datasource:queryparam}}&${{cluster:queryparam}}"
                    "&var-node=$__all&var-workload=${__field.labels.workload}")


def fixed_color(color: str) -> model.DynamicConfigValue:
    """An override property that draws the matched series in one colour (a Grafana colour name or #rrggbb)."""
    return model.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": color})


def timeseries_panel(title: str, description: str, unit: str, targets: list[Target], width: int = 12,
                     height: int = 8, stacked: bool = False, max_value: float | None = None,
                     links: list[DataLink] | None = None, colors: dict[str, str] | None = None) -> timeseries.Panel:
    """`colors` fixes the colour of the series with each name (as its legend shows it), e.g. {"productive": "green"},
    so a series keeps its colour whichever others are present."""
    panel = (timeseries.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .targets(_targets(targets)).span(width).height(height).min(0))
    for name, color in (colors or {}).items():
        panel = panel.override_by_name(name, [fixed_color(color)])
    if max_value is not None:
        panel = panel.max(max_value)
    if links:
        panel = panel.data_links(links)  # type: ignore[arg-type]  # Grafana's data-link shape, not a dashboard link
    if stacked:
        panel = panel.stacking(StackingConfig().mode(common.StackingMode.NORMAL)).fill_opacity(40)
    return panel


def stat_panel(title: str, description: str, unit: str, targets: list[Target], width: int = 4,
               height: int = 4, no_value: str | None = None, links: list[DataLink] | None = None) -> stat.Panel:
    panel = (stat.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .targets(_targets(targets)).span(width).height(height))
    if no_value is not None:
        panel = panel.no_value(no_value)
    if links:
        panel = panel.data_links(links)  # type: ignore[arg-type]  # Grafana's data-link shape, not a dashboard link
    return panel


def table_panel(title: str, description: str, unit: str, targets: list[Target], width: int = 12,
                height: int = 8) -> table.Panel:
    """An instant query shown as a table, one row per series; the value column carries `unit`."""
    return (table.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
            .targets(_targets(targets, instant=True, table_format=True)).span(width).height(height)
            .with_transformation(model.DataTransformerConfig(id_val="organize", options={
                "excludeByName": {"Time": True}, "renameByName": {"Value": title}})))


Column = tuple[str, str, str]  # (expr, column name, unit)


def joined_table_panel(title: str, description: str, unit: str, columns: list[Column], width: int = 24,
                       height: int = 8, links: list[DataLink] | None = None) -> table.Panel:
    """Instant queries with the same labels merged into one table, a row per label set and a column per query
    (named and given a unit each; `unit` is the panel's default)."""
    panel = (table.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .targets(_targets([(expr, "") for expr, _, _ in columns], instant=True, table_format=True))
             .span(width).height(height)
             .with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
             .with_transformation(model.DataTransformerConfig(id_val="organize", options={
                 "excludeByName": {"Time": True},
                 "renameByName": {f"Value #{chr(ord('A') + i)}": name for i, (_, name, _) in enumerate(columns)}})))
    for _, name, column_unit in columns:
        if column_unit != unit:
            panel = panel.override_by_name(name, [model.DynamicConfigValue(id_val="unit", value=column_unit)])
    if links:
        panel = panel.data_links(links)  # type: ignore[arg-type]  # Grafana's data-link shape, not a dashboard link
    return panel


# The funnel's layers (workload:goodput_bottleneck:info), each in a fixed colour wherever a verdict shows: the colours
# of the Workload dashboard's buckets where a layer has one (network purple as comm_wait, host orange as data_wait).
LAYER_COLORS = {"cluster": "red", "network": "purple", "host": "orange", "memory": "blue", "kernel": "yellow",
                "healthy": "green"}
assert list(LAYER_COLORS) == list(LAYERS)


def text_colors(colors: dict[str, str]) -> model.ValueMap:
    """A value mapping that gives each text its colour (the text itself is kept)."""
    return model.ValueMap(options={text: model.ValueMappingResult(color=color, index=i)
                                   for i, (text, color) in enumerate(colors.items())})


def labels_table_panel(title: str, description: str, expr: str, labels: list[str], value: str | None = None,
                       unit: str = "none", colored: dict[str, dict[str, str]] | None = None,
                       width: int = 12, height: int = 8, links: list[DataLink] | None = None) -> table.Panel:
    """An instant query shown as a table of its series' labels, one row per series: the columns are `labels`, in
    order and under their own names (a data link finds them as `${__data.fields.<label>}`), every other label left
    out; `value` names the value column, shown last and sorted on (smallest first), or is None to leave the value
    out (an _info series' 1). `colored` maps a label to the colour of each of its values, the cell's background."""
    shown = [*labels, *(["Value"] if value else [])]
    panel = (table.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .targets(_targets([(expr, "")], instant=True, table_format=True)).span(width).height(height)
             .with_transformation(model.DataTransformerConfig(id_val="filterFieldsByName", options={
                 "include": {"names": shown}}))
             .with_transformation(model.DataTransformerConfig(id_val="organize", options={
                 "indexByName": {name: i for i, name in enumerate(shown)},
                 "renameByName": {"Value": value} if value else {}})))
    for label, colors in (colored or {}).items():
        panel = panel.override_by_name(label, [
            model.DynamicConfigValue(id_val="mappings", value=[text_colors(colors)]),
            model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"})])
    if value:
        panel = panel.sort_by([common_builders.TableSortByFieldState().display_name(value).desc(False)])
    if links:
        panel = panel.data_links(links)  # type: ignore[arg-type]  # Grafana's data-link shape, not a dashboard link
    return panel


def link_down(level: Level) -> gdash.DashboardLink:
    """A link to the next level that carries the time range and every variable."""
    return (gdash.DashboardLink(f"Down: {level.title.split(' / ', 1)[1]}").type(model.DashboardLinkType.LINK)
            .url(f"/d/{level.uid}").tooltip(level.answers).icon("arrow-down").include_vars(True).keep_time(True))


def link_all() -> gdash.DashboardLink:
    """A drop-down of every goodput dashboard (by tag), also carrying time range and variables."""
    return (gdash.DashboardLink("Goodput dashboards").type(model.DashboardLinkType.DASHBOARDS).tags(["goodput"])
            .as_dropdown(True).include_vars(True).keep_time(True))


def new_dashboard(level: Level, names: Names, node: bool = False, workload: bool = False,
                  own_variables: list[gdash.QueryVariable] | None = None,
                  also_down: tuple[Level, ...] = ()) -> gdash.Dashboard:
    """`own_variables` replace the usual ones (cluster, node, workload); `also_down` links to levels past the next."""
    builder = (gdash.Dashboard(level.title).uid(level.uid).description(level.answers)
               .tags([*TAGS, level.slug]).editable().time("now-1h", "now").refresh("30s")
               .tooltip(model.DashboardCursorSync.CROSSHAIR).timezone("browser")
               .with_variable(datasource_variable()))
    for variable in variables(names, node, workload) if own_variables is None else own_variables:
        builder = builder.with_variable(variable)
    following = [lv for lv in LEVELS if lv.number == level.number + 1]
    links = [link_down(lv) for lv in (*following[:1], *also_down)]
    return builder.links([*links, link_all()])


def row(title: str) -> gdash.Row:
    return gdash.Row(title)


def of_workload_gpus(expr: str, names: Names) -> str:
    """Keep only the per-GPU series of GPUs that a process of the selected workloads holds (join on uuid with
    goodput_gpu_workload_info; `max by` keeps the right side unique when several ranks share a GPU)."""
    return (f"{expr} * on ({names.node}, uuid) group_left () "
            f'max by ({names.node}, uuid) (goodput_gpu_workload_info{{{names.cluster}=~"$cluster", '
            f'{names.node}=~"$node", workload=~"$workload"}})')


def of_workload_nodes(expr: str, names: Names) -> str:
    """Keep only the per-node series (fabric ports, interfaces, GPU-NIC topology) of nodes where a process of the
    selected workloads holds a GPU, or of every selected node when the workload variable is All: an absent label
    matches ".*", so goodput_exporter_build_info (which has no workload label) passes every exporter then and none
    for a chosen workload. `expr` must keep the cluster and node labels."""
    c, n = names.cluster, names.node
    matchers = f'{c}=~"$cluster", {n}=~"$node", workload=~"$workload"'
    return (f"{expr} and on ({c}, {n}) (group by ({c}, {n}) (goodput_gpu_workload_info{{{matchers}}}) "
            f"or group by ({c}, {n}) (goodput_exporter_build_info{{{matchers}}}))")


def verdict_in_walk_order(f: Filters) -> str:
    """Each workload's verdict (workload:goodput_bottleneck:info: layer and reason), valued by the place in the funnel's
    walk of the check that decided it (healthy: one past the last), so that a table sorted on it lists first the jobs
    held back earliest in the walk."""
    keys = f"{f.names.cluster}, workload, layer, reason"
    healthy = f('layer="' + HEALTHY[0] + '"')
    return f"{CANDIDATE}{f()} and on ({keys}) {VERDICT}{f()} or {order(HEALTHY[1])} * {VERDICT}{healthy}"
