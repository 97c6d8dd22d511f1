"""Alerts on the network fabric between nodes (the fabric source's RDMA ports and interfaces): a link down or trained
below its peers, a link that flaps, link errors, congestion that costs the jobs on a node their goodput.
Group `goodput.alerts.fabric`.

Each alert names one link: an RDMA port (labels `device`, `port`), or a network interface that backs no RDMA port
(label `interface`). A RoCE port and the interface behind it are one link: the port's alert looks at both (mlx5
counts a RoCE link's physical errors and carrier changes on the interface), so one fault never pages twice.
"""

from __future__ import annotations

from ..recording import NETDEV_AS_INTERFACE, per_link
from ..settings import RulesSettings
from .alert import Alert

ACTIVE = 4  # goodput_fabric_port_state: 4 ACTIVE, the only state that carries traffic


def _link(node: str) -> str:
    """The link an alert names, for descriptions: an interface, or a port of an RDMA device."""
    return ("{{ if $labels.interface }}Interface {{ $labels.interface }}{{ else }}Port {{ $labels.port }} of "
            f"{{{{ $labels.device }}}}{{{{ end }}}} on {{{{ $labels.{node} }}}}")


def _because(expr: str, reason: str) -> str:
    return f'label_replace(\n  {expr},\n  "reason", "{reason}", "", ""\n)'


def _link_down(s: RulesSettings) -> str:
    """Links that are down, or up at a lower rate than the node's fastest port of the same link layer.

    A link down is only judged where it had a link before: a port whose link_downed counter is 0 (and whose netdev,
    if any, never had a carrier) and an interface whose carrier never came up (carrier_changes below 2: carrier
    changes alternate, so a carrier that came up and went down again counts at least 2) are ports nobody cabled,
    common on storage NICs and on-board Ethernet, not failures. A counter that cannot be read does not silence it.
    """
    c, n = s.cluster_label, s.node_label
    ignore = s.fabric_link_down_ignore.replace("\\", "\\\\").replace('"', '\\"')
    dev = f'{{device!~"{ignore}"}}' if ignore else ""
    iface = f'{{interface!~"{ignore}"}}' if ignore else ""
    port = f"{c}, {n}, device, port"
    netdev_had_carrier = (f"goodput_fabric_port_info\n      * on ({c}, {n}, netdev) group_left ()\n"
                          '      label_replace(goodput_fabric_interface_carrier_changes_total >= 2, "netdev", "$1", '
                          '"interface", "(.+)")')
    never_up_port = (f"goodput_fabric_port_link_downed_total == 0\n    unless on ({port}) (\n"
                     f"      {netdev_had_carrier}\n    )")
    down_port = (f"goodput_fabric_port_state{dev} != {ACTIVE}\n  unless on ({port}) (\n"
                 f"    {never_up_port}\n  )")
    down_interface = (f"goodput_fabric_interface_up{iface} == 0\n"
                      f"  unless on ({c}, {n}, interface) goodput_fabric_interface_carrier_changes_total < 2\n"
                      f"  unless on ({c}, {n}, interface) {NETDEV_AS_INTERFACE}")
    # the rate of active ports, with their link layer; a RoCE port trains with its interface, so interfaces are not
    # compared again (a node's management interface runs slower by design)
    active_rate = (f"(\n    goodput_fabric_port_rate_bytes_per_second{dev}\n"
                   f"    and on ({port}) goodput_fabric_port_state == {ACTIVE}\n  )\n"
                   f"  * on ({port}) group_left (link_layer) goodput_fabric_port_info")
    degraded = (f"{active_rate}\n  < on ({c}, {n}, link_layer) group_left ()\n"
                f"  max by ({c}, {n}, link_layer) (\n  {active_rate}\n  )")
    links = (f"{_because(down_port, 'down')}\nor\n{_because(down_interface, 'down')}\n"
             f"or\n{_because(degraded, 'degraded')}")
    if not s.fabric_link_down_allocated_only:
        return links
    # in use: a GPU held by a process at any time in the window (a link failure that kills the job frees its
    # GPUs), or assigned to a pod now (a job can hold its GPUs before a process opens them)
    in_use = (f"max_over_time(node:goodput_gpu_allocated_ratio:avg[{s.fabric_link_down_allocated_window}]) > 0\n"
              f"  or group by ({c}, {n}) (goodput_gpu_pod_info)")
    return f"(\n{links}\n)\nand on ({c}, {n}) (\n  {in_use}\n)"


def _flaps(s: RulesSettings) -> str:
    """Times each link went down or retrained within the window: an RDMA port's link_downed and link_error_recovery
    (a retrain that kept the link) together; an interface's carrier changes over 2 (each loss is a down and an up)."""
    w = s.fabric_flap_window
    port = "sum without (counter) (\n    " + "\n    or ".join(
        f'label_replace(increase(goodput_fabric_port_{counter}_total[{w}]), "counter", "{counter}", "", "")'
        for counter in ("link_downed", "link_error_recovery")) + "\n  )"
    interface = f"(increase(goodput_fabric_interface_carrier_changes_total[{w}]) / 2)"
    return per_link(s, port, interface)


def alerts(s: RulesSettings) -> list[Alert]:
    short = s.windows[0]
    c, node = s.cluster_label, s.node_label
    link = _link(node)
    port = f"Port {{{{ $labels.port }}}} of {{{{ $labels.device }}}} on {{{{ $labels.{node} }}}}"
    return [
        Alert(
            "GoodputFabricLinkDown", "fabric-link-down.md", "critical",
            _link_down(s), s.fabric_link_down_for,
            "A fabric link of a node in use is down or runs below the rate of its peers.",
            f"{link} {{{{ if eq $labels.reason \"degraded\" }}}}trained at {{{{ $value | humanize }}}}B/s, below the "
            "node's fastest {{ $labels.link_layer }} port{{ else }}is down{{ end }}: the collectives of the jobs on "
            "the node run slower through it, or fail."),
        Alert(
            "GoodputFabricLinkFlapping", "fabric-link-flapping.md", "warning",
            f"(\n{_flaps(s)}\n) >= {s.fabric_flaps}", "0m",
            "A fabric link keeps losing its link.",
            f"{link} lost its link {{{{ $value | printf \"%.0f\" }}}} times in the last {s.fabric_flap_window} "
            "(went down or retrained); each loss stalls or breaks the collectives through it."),
        Alert(
            "GoodputFabricErrors", "fabric-errors.md", "warning",
            f"link:goodput_fabric_link_errors:rate{short} > {s.fabric_error_rate:g}", s.fabric_errors_for,
            "A fabric link keeps counting errors.",
            f"{link} counts {{{{ $value | printf \"%.2f\" }}}} link errors per second (symbol, receive or "
            "integrity errors; an interface's receive errors); every corrupted packet is sent again."),
        Alert(
            "GoodputFabricCongestion", "fabric-congestion.md", "warning",
            f"link:goodput_fabric_congestion_ratio:rate{short} > {s.fabric_congestion_ratio:g}\n"
            f"and on ({c}, {node})\n"
            f"  node:goodput_comm_wait_ratio:rate{short} > {s.fabric_congestion_comm_wait_ratio:g}",
            s.fabric_congestion_for,
            "A congested fabric port slows the collectives of the jobs on its node.",
            f"{port}: {{{{ $value | humanizePercentage }}}} of its packets carry congestion marks or notifications "
            f"(ECN, CNP), while the workloads on the node spend over "
            f"{s.fabric_congestion_comm_wait_ratio:.0%} of their time waiting on communication."),
    ]
