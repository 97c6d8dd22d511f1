"""Metrics of the `dcgm` source: what the kernels do, from DCGM's profiling fields."""

from __future__ import annotations

from ...core.catalog import GPU, Declarer, Kind

_m = Declarer("dcgm")
# A GPU in MIG mode is measured per GPU instance: the parent GPU's gpu and uuid, and the instance's
# gpu_instance_id (NVML's, as on goodput_gpu_mig_info, so the two join); empty for a whole GPU.
DCGM_GPU = (*GPU, "gpu_instance_id")

_DCGM = ("Per GPU, or per MIG GPU instance (gpu_instance_id) of a GPU in MIG mode. Read from DCGM's "
         "profiling field {field} (through DCGM's Python bindings, or from a "
         "dcgm-exporter on the node); averaged by DCGM over its sampling period: dcgm.interval with "
         "dcgm.mode=bindings, dcgm-exporter's own collection interval (its -c, 30 s by default) with "
         "dcgm.mode=exporter.")
GPU_GR_ENGINE_ACTIVE = _m(
    "goodput_gpu_gr_engine_active_ratio", Kind.GAUGE, "ratio",
    "Share of time the graphics/compute engine had work in flight (0-1): the coarsest profiling figure, "
    "in dcgm-exporter's default counters and often the only one a cluster collects; unlike "
    "goodput_gpu_utilization_ratio it is averaged over the whole period, not sampled. "
    + _DCGM.format(field="DCGM_FI_PROF_GR_ENGINE_ACTIVE"), DCGM_GPU)
GPU_SM_ACTIVE = _m(
    "goodput_gpu_sm_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles in which an SM had at least one warp resident, averaged over all SMs (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_SM_ACTIVE"), DCGM_GPU)
GPU_SM_OCCUPANCY = _m(
    "goodput_gpu_sm_occupancy_ratio", Kind.GAUGE, "ratio",
    "Warps resident on the SMs as a share of the most they can hold, averaged over all SMs (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_SM_OCCUPANCY"), DCGM_GPU)
GPU_TENSOR_ACTIVE = _m(
    "goodput_gpu_tensor_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles the tensor (HMMA/IMMA) pipes were active (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), DCGM_GPU)
GPU_TENSOR_HMMA_ACTIVE = _m(
    "goodput_gpu_tensor_hmma_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles the tensor pipes ran half-precision matrix math (FP16/BF16 HMMA) (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE"), DCGM_GPU)
GPU_TENSOR_IMMA_ACTIVE = _m(
    "goodput_gpu_tensor_imma_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles the tensor pipes ran integer matrix math (INT8 IMMA, e.g. quantized inference) (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE"), DCGM_GPU)
GPU_TENSOR_DFMA_ACTIVE = _m(
    "goodput_gpu_tensor_dfma_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles the tensor pipes ran double-precision math (FP64 DFMA; Ampere and newer) (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE"), DCGM_GPU)
GPU_DRAM_ACTIVE = _m(
    "goodput_gpu_dram_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles the device memory interface was sending or receiving data (0-1); near 1 means "
    "memory-bound. " + _DCGM.format(field="DCGM_FI_PROF_DRAM_ACTIVE"), DCGM_GPU)
GPU_FP16_ACTIVE = _m(
    "goodput_gpu_fp16_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles the FP16 pipes were active, tensor pipes not included (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_PIPE_FP16_ACTIVE"), DCGM_GPU)
GPU_FP32_ACTIVE = _m(
    "goodput_gpu_fp32_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles the FP32 pipes were active (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_PIPE_FP32_ACTIVE"), DCGM_GPU)
GPU_FP64_ACTIVE = _m(
    "goodput_gpu_fp64_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles the FP64 pipes were active (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_PIPE_FP64_ACTIVE"), DCGM_GPU)
GPU_INT_ACTIVE = _m(
    "goodput_gpu_int_active_ratio", Kind.GAUGE, "ratio",
    "Share of cycles the integer pipe was active (0-1). "
    + _DCGM.format(field="DCGM_FI_PROF_PIPE_INT_ACTIVE"), DCGM_GPU)
_DCGM_RATE = ("A rate DCGM measures, averaged over its sampling period (dcgm.interval with "
              "dcgm.mode=bindings; dcgm-exporter's -c interval, 30 s by default, with dcgm.mode=exporter, "
              "even where dcgm-exporter types the field as a counter); a gauge, not a counter, "
              "because only the latest average is seen. Where NVML gives the byte counter "
              "{counter}, prefer rate() of it: it misses nothing between samples.")
GPU_DCGM_PCIE_TX = _m(
    "goodput_gpu_pcie_transmit_bytes_per_second", Kind.GAUGE, "bytes_per_second",
    "Bytes per second the GPU sent over PCIe, protocol headers included (DCGM_FI_PROF_PCIE_TX_BYTES). "
    + _DCGM_RATE.format(counter="goodput_gpu_pcie_transmit_bytes_total"), DCGM_GPU)
GPU_DCGM_PCIE_RX = _m(
    "goodput_gpu_pcie_receive_bytes_per_second", Kind.GAUGE, "bytes_per_second",
    "Bytes per second the GPU received over PCIe, protocol headers included "
    "(DCGM_FI_PROF_PCIE_RX_BYTES). " + _DCGM_RATE.format(counter="goodput_gpu_pcie_receive_bytes_total"),
    DCGM_GPU)
GPU_DCGM_NVLINK_TX = _m(
    "goodput_gpu_nvlink_transmit_bytes_per_second", Kind.GAUGE, "bytes_per_second",
    "Bytes per second the GPU sent over all its NVLinks together (DCGM_FI_PROF_NVLINK_TX_BYTES). "
    + _DCGM_RATE.format(counter="goodput_gpu_nvlink_transmit_bytes_total (summed over the links)"), DCGM_GPU)
GPU_DCGM_NVLINK_RX = _m(
    "goodput_gpu_nvlink_receive_bytes_per_second", Kind.GAUGE, "bytes_per_second",
    "Bytes per second the GPU received over all its NVLinks together (DCGM_FI_PROF_NVLINK_RX_BYTES). "
    + _DCGM_RATE.format(counter="goodput_gpu_nvlink_receive_bytes_total (summed over the links)"), DCGM_GPU)

METRICS = _m.metrics
