"""Level 5, Kernels and silicon: are the kernels using the GPU (busy time, clocks, throttling, power, the PCIe and
NVLink links and the video engines, and DCGM's SM, tensor and DRAM activity where DCGM or a dcgm-exporter is
there)."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from .kit import LEVELS, Filters, Names, new_dashboard, row, timeseries_panel

LEVEL = LEVELS[4]


def build(names: Names) -> Dashboard:
    f = Filters(names, node=True)
    n = names.node
    gpu = "{{" + n + "}} GPU {{gpu}}"
    d = new_dashboard(LEVEL, names, node=True).with_row(row("Busy and clocks (NVML)"))
    d = d.with_panel(timeseries_panel(
        "Busy share", "Share of time a kernel ran on each GPU, from the integrated idle counter (exact, not a "
        "sampled gauge). Low on an allocated GPU is time the job loses; the levels above say why.",
        "percentunit", [(f"1 - {names.rule('gpu', 'goodput_gpu_idle_ratio', 'rate')}{f()}", gpu)], max_value=1))
    d = d.with_panel(timeseries_panel(
        "SM and memory clocks", "Current SM and memory clocks per GPU. An SM clock below the GPU's usual boost "
        "clock while busy means a limit holds it down (see Throttle reasons); the memory clock stays put on HBM "
        "GPUs, lower means a memory clock limit.",
        "hertz", [(f"goodput_gpu_sm_clock_hertz{f()}", f"{gpu} SM"),
                  (f"goodput_gpu_memory_clock_hertz{f()}", f"{gpu} memory")]))
    d = d.with_panel(timeseries_panel(
        "Throttle reasons", "Share of time clocks were held below target, by reason (NVML violation counters). "
        "Power or thermal near 1 means the GPU runs slower than it could: check cooling, power caps and "
        "board limits.",
        "percentunit", [(f"rate(goodput_gpu_clock_throttle_seconds_total{f()}[$__rate_interval]) > 0",
                         gpu + " {{reason}}")], max_value=1))
    d = d.with_panel(timeseries_panel(
        "Power vs limit", "Board power draw per GPU, the average power from the energy counter (exact "
        "between scrapes), and the limit the driver enforces. Flat at the limit while clocks drop is power "
        "throttling; far below it "
        "while busy means the kernels do not load the GPU.",
        "watt", [(f"goodput_gpu_power_watts{f()}", f"{gpu} now"),
                 (f"goodput_gpu_power_limit_watts{f()}", f"{gpu} limit"),
                 (f"rate(goodput_gpu_energy_joules_total{f()}[$__rate_interval])", f"{gpu} average")]))
    d = d.with_panel(timeseries_panel(
        "Temperature", "GPU core and memory (HBM) temperature. Close to the slowdown temperature (about 85-90 C "
        "on data-centre GPUs; HBM throttles from about 95 C) it comes with thermal throttling. Memory "
        "temperature is absent where the GPU does not report it.",
        "celsius", [(f"goodput_gpu_temperature_celsius{f()}", f"{gpu} core"),
                    (f"goodput_gpu_memory_temperature_celsius{f()}", f"{gpu} memory")]))
    s = names.settings
    d = d.with_row(row("Links and engines (NVML)"))
    d = d.with_panel(timeseries_panel(
        "PCIe link generation", "The PCIe generation each GPU's link runs at, and the highest the GPU and its slot "
        "both allow. Idle GPUs drop to a lower generation to save power, so only a busy GPU below its maximum "
        f"is a degraded link (GoodputGPUPCIeLinkDegraded compares it on GPUs busy over "
        f"{s.pcie_degraded_busy_ratio:.0%} of the time).",
        "none", [(f"goodput_gpu_pcie_link_generation{f()}", f"{gpu} now"),
                 (f"goodput_gpu_pcie_link_max_generation{f()}", f"{gpu} max")]))
    d = d.with_panel(timeseries_panel(
        "PCIe link width", "Lanes each GPU's link runs on, and the most the GPU and its slot both allow. Below "
        "the maximum, host-device copies (data loading, checkpoints) run slower in proportion: reseat the GPU, "
        "riser or cable.",
        "none", [(f"goodput_gpu_pcie_link_width{f()}", f"{gpu} now"),
                 (f"goodput_gpu_pcie_link_max_width{f()}", f"{gpu} max")]))
    d = d.with_panel(timeseries_panel(
        "PCIe replays", "PCIe packets resent after link errors, per second. A steady rise (DCGM's limit: 8 a "
        "minute) means a marginal link, often with a narrower or slower one.",
        "cps", [(f"rate(goodput_gpu_pcie_replays_total{f()}[$__rate_interval])", gpu)]))
    d = d.with_panel(timeseries_panel(
        "NVLink errors", "NVLink data-link errors per second on each GPU that counts any, its links together: CRC "
        "errors in flits or data (each corrected by a replay), replays, and recoveries (the link retrained, "
        f"stalling its traffic). GoodputGPUNVLinkErrors fires above {s.nvlink_crc_error_rate:g} CRC or "
        f"{s.nvlink_replay_error_rate:g} replay or recovery errors a second. Empty when every link is clean. Which "
        "link: goodput_gpu_nvlink_link_errors_total, with the nvml source's nvlink_per_link on.",
        "cps", [(f"rate(goodput_gpu_nvlink_errors_total{f()}[$__rate_interval]) > 0",
                 gpu + " {{error_type}}")]))
    d = d.with_panel(timeseries_panel(
        "Video encoder and decoder", "Share of time the video encoders (NVENC) and decoders (NVDEC) ran. High "
        "decode in a training job means its input pipeline decodes video on the GPU.",
        "percentunit", [(f"goodput_gpu_encoder_utilization_ratio{f()}", f"{gpu} encoder"),
                        (f"goodput_gpu_decoder_utilization_ratio{f()}", f"{gpu} decoder")], max_value=1))
    d = d.with_row(row("Activity inside the GPU (DCGM profiling, when present)"))
    # a GPU in MIG mode is measured per GPU instance: its series carry gpu_instance_id
    gpu = gpu + "{{gpu_instance_id}}"
    d = d.with_panel(timeseries_panel(
        "Engine and SM activity", "Graphics engine active: share of time the GPU had work in flight (the "
        "coarsest profiling figure, and in dcgm-exporter's default counters). SM active: share of cycles an SM "
        "had a warp resident. Occupancy: warps resident over the most the SMs hold. A GPU 'busy' per NVML with "
        "low SM activity runs kernels too small to fill it. A GPU in MIG mode shows one line per GPU instance "
        "(its number after the GPU's). Needs DCGM (source dcgm); empty without it.",
        "percentunit", [(f"goodput_gpu_gr_engine_active_ratio{f()}", f"{gpu} engine active"),
                        (f"goodput_gpu_sm_active_ratio{f()}", f"{gpu} SM active"),
                        (f"goodput_gpu_sm_occupancy_ratio{f()}", f"{gpu} occupancy")], max_value=1))
    d = d.with_panel(timeseries_panel(
        "Tensor core active", "Share of cycles the tensor pipes were active, and by kind where DCGM has them: "
        "HMMA (FP16/BF16), IMMA (INT8), DFMA (FP64). Low in a mixed-precision training job means the math runs "
        "outside tensor cores (FP32 paths, small or odd shapes). Needs DCGM.",
        "percentunit", [(f"goodput_gpu_tensor_active_ratio{f()}", gpu),
                        (f"goodput_gpu_tensor_hmma_active_ratio{f()}", f"{gpu} HMMA"),
                        (f"goodput_gpu_tensor_imma_active_ratio{f()}", f"{gpu} IMMA"),
                        (f"goodput_gpu_tensor_dfma_active_ratio{f()}", f"{gpu} DFMA")], max_value=1))
    d = d.with_panel(timeseries_panel(
        "DRAM active", "Share of cycles the memory interface moved data. Near 1 with low tensor activity means "
        "the kernels are memory-bound. Needs DCGM.",
        "percentunit", [(f"goodput_gpu_dram_active_ratio{f()}", gpu)], max_value=1))
    d = d.with_panel(timeseries_panel(
        "FP16, FP32, FP64 and integer pipes", "Share of cycles each floating-point pipe, and the integer pipe, "
        "was active (tensor pipes not included). Busy FP32 or FP64 in a job meant for mixed precision means "
        "precision was lost on the way. Needs DCGM.",
        "percentunit", [(f"goodput_gpu_fp16_active_ratio{f()}", f"{gpu} fp16"),
                        (f"goodput_gpu_fp32_active_ratio{f()}", f"{gpu} fp32"),
                        (f"goodput_gpu_fp64_active_ratio{f()}", f"{gpu} fp64"),
                        (f"goodput_gpu_int_active_ratio{f()}", f"{gpu} int")], max_value=1))
    d = d.with_panel(timeseries_panel(
        "GPUs by activity class", f"How many of the selected GPUs were, over the last {names.short}: underused "
        f"(SMs active below {names.settings.underused_sm_active_ratio:g}), compute-bound (a math pipe at "
        f"{names.settings.compute_bound_pipe_ratio:g} or more), memory-bound (memory interface at "
        f"{names.settings.memory_bound_dram_ratio:g} or more) or other (SMs busy, neither saturated: latency, "
        "launch or synchronization bound). Underused GPUs are the waste; memory-bound ones want fewer bytes "
        "moved per flop. Needs DCGM.",
        "short", [(f"count by (class) ({names.rule('gpu', 'goodput_gpu_activity_class', 'avg')}{f()})", "{{class}}")],
        stacked=True))
    d = d.with_panel(timeseries_panel(
        "NVLink and PCIe (DCGM)", "Bytes per second over all NVLinks and over PCIe as DCGM measures them "
        "(averaged over its sampling period; protocol headers included for PCIe). Needs DCGM.",
        "Bps", [(f"goodput_gpu_nvlink_transmit_bytes_per_second{f()}", f"{gpu} NVLink tx"),
                (f"goodput_gpu_nvlink_receive_bytes_per_second{f()}", f"{gpu} NVLink rx"),
                (f"goodput_gpu_pcie_transmit_bytes_per_second{f()}", f"{gpu} PCIe tx"),
                (f"goodput_gpu_pcie_receive_bytes_per_second{f()}", f"{gpu} PCIe rx")]))
    return d
