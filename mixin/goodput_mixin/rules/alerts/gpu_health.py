"""Alerts on a broken or degraded GPU: critical XIDs, uncorrectable ECC errors, a reset due (row remap or page
retirement pending), throttling, a PCIe link trained below its maximum, NVLink errors.
Group `goodput.alerts.gpu_health`; throttling, PCIe and NVLink each in a part of their own (`_throttled`, `_pcie`,
`_nvlink`): NVLink's reads several series of every GPU; throttling and PCIe read a record of every GPU
(goodput.gpu_throttled, goodput.gpu_pcie_*), which reading those series once per GPU made cheap."""

from __future__ import annotations

from ..recording import PCIE_DEGRADED, throttled
from ..settings import RulesSettings
from .alert import Alert


def alerts(s: RulesSettings) -> list[Alert]:
    short = s.windows[0]
    node = s.node_label
    pct = "{{ $value | humanizePercentage }}"
    xids = "|".join(str(x) for x in sorted(set(s.critical_xids)))
    xid_series = f'goodput_gpu_xid_errors_total{{xid=~"{xids}"}}'
    gpu = f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.uuid }}}}) on {{{{ $labels.{node} }}}}"

    def because(expr: str, label: str, value: str) -> str:
        return f'label_replace({expr}, "{label}", "{value}", "", "")'

    reset_due = "\nor\n".join(because(f"goodput_gpu_{state} == 1", "reason", state)
                               for state in ("row_remap_pending", "row_remap_failure", "retired_pages_pending"))
    nvlink = "goodput_gpu_nvlink_errors_total"
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
            # a row remap (Ampere and later) or page retirement (before) takes effect at the next reset; until then
            # the bad memory can be handed out again. A failed remap (no spare row) holds until the GPU is replaced.
            "GoodputGPUResetRequired", "gpu-reset-required.md", "critical",
            reset_due, s.reset_required_for,
            "A GPU needs a reset to stop using bad memory (or replacing, after a failed row remap).",
            f"{gpu} needs a reset: {{{{ $labels.reason }}}}. Drain it and reset it (replace it after a "
            "row_remap_failure)."),
        Alert(
            "GoodputGPUThrottled", "gpu-throttled.md", "warning",
            f"{throttled(s)} > {s.throttle_ratio}",
            s.throttle_for,
            "A GPU's clocks are held down.",
            f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.uuid }}}}) on {{{{ $labels.{node} }}}} was throttled by "
            f"power, thermal, board or reliability limits {pct} of the time.", part="throttled"),
        Alert(
            # the degraded links goodput.gpu_pcie_width and goodput.gpu_pcie_generation record (what counts: there)
            "GoodputGPUPCIeLinkDegraded", "gpu-pcie-link-degraded.md", "warning",
            PCIE_DEGRADED, s.pcie_degraded_for,
            "A GPU's PCIe link runs below what the GPU and its slot allow.",
            f"The PCIe link {{{{ $labels.degraded }}}} of {gpu} is {{{{ $value }}}}, below what the GPU and its slot "
            "allow: host-device copies run slower.", part="pcie"),
        Alert(
            "GoodputGPUNVLinkErrors", "gpu-nvlink-errors.md", "warning",
            f'rate({nvlink}{{error_type=~"crc_flit|crc_data"}}[{short}]) > {s.nvlink_crc_error_rate:g}\n'
            f'or\nrate({nvlink}{{error_type=~"replay|recovery"}}[{short}]) > {s.nvlink_replay_error_rate:g}',
            s.nvlink_errors_for,
            "A GPU's NVLink links keep counting errors.",
            f"The NVLink links of {gpu} count {{{{ $value | printf \"%.2f\" }}}} {{{{ $labels.error_type }}}} errors "
            "per second together (which link: the runbook).", part="nvlink"),
    ]
