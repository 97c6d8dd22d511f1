"""Alerts on a broken or degraded GPU: critical XIDs, uncorrectable ECC errors, throttling.
Group `goodput.alerts.gpu_health`."""

from __future__ import annotations

from ..settings import RulesSettings
from .alert import Alert


def alerts(s: RulesSettings) -> list[Alert]:
    short = s.windows[0]
    node = s.node_label
    pct = "{{ $value | humanizePercentage }}"
    xids = "|".join(str(x) for x in sorted(set(s.critical_xids)))
    xid_series = f'goodput_gpu_xid_errors_total{{xid=~"{xids}"}}'
    return [
        Alert(
            "GoodputGPUXidCritical", "gpu-xid-critical.md", "critical",
            f"increase({xid_series}[{short}]) > 0\nor\n({xid_series} unless {xid_series} offset {short})",
            "0m",
            "A GPU reported a critical XID error.",
            f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.uuid }}}}) on {{{{ $labels.{node} }}}} reported XID "
            "{{ $labels.xid }}."),
        Alert(
            "GoodputGPUEccUncorrectable", "gpu-ecc-uncorrectable.md", "critical",
            f'increase(goodput_gpu_ecc_errors_total{{error_type="uncorrected"}}[{short}]) > 0', "0m",
            "A GPU had uncorrectable memory errors.",
            f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.uuid }}}}) on {{{{ $labels.{node} }}}} had "
            f"{{{{ $value | printf \"%.0f\" }}}} uncorrectable ECC errors in {short}."),
        Alert(
            "GoodputGPUThrottled", "gpu-throttled.md", "warning",
            f"sum without (reason) (rate(goodput_gpu_clock_throttle_seconds_total"
            f'{{reason=~"power|thermal|board_limit|reliability"}}[{short}])) > {s.throttle_ratio}',
            s.throttle_for,
            "A GPU's clocks are held down.",
            f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.uuid }}}}) on {{{{ $labels.{node} }}}} was throttled by "
            f"power, thermal, board or reliability limits {pct} of the time."),
    ]
