"""Peak dense tensor-core FLOPS of a GPU model, per data type, from NVIDIA's datasheets.

The denominator of model FLOPs utilization: `peak_flops(nvml_name)` gives, for the model NVML names
(`nvmlDeviceGetName`), its peak tensor-core FLOPS per data type of `FLOPS_DTYPES`, without sparsity.

- NVIDIA prints most tensor-core figures "with sparsity" (2:4 structured sparsity doubles them): the dense figure
  is half the printed one. Where a datasheet prints both ("dense | sparse*"), the dense one is taken as printed.
  FP64 is never sparse.
- A data type the model's tensor cores lack (FP8 before Hopper and Ada, FP4 before Blackwell, FP64 on Ada) is
  absent, never 0; so is one its datasheet gives no tensor-core figure for.
- A model not in the table has no entry: {} (no guess from a look-alike name).

Every figure carries the datasheet line it comes from; every name, where it was seen as NVML reports it. The names
are the driver's own: the "Compatible GPUs" table of NVIDIA's open GPU kernel modules README lists each product
name with its PCI device ID (https://github.com/NVIDIA/open-gpu-kernel-modules/blob/595.45.04/README.md, "README"
below); public nvidia-smi pastes confirm most of them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from types import MappingProxyType

from goodput_client.contract import FLOPS_DTYPES

# --- the figures, per model ------------------------------------------------------------------------------------

# NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): one set of peak
# figures for A100 40GB and 80GB, PCIe and SXM; it prints "dense | sparse*" (* with sparsity). No FP8, no FP4.
_A100 = {
    "fp64": 19.5e12,  # A100 datasheet: "FP64 Tensor Core 19.5 TFLOPS" (dense; FP64 has no sparsity figure)
    "tf32": 156e12,  # A100 datasheet: "Tensor Float 32 (TF32) 156 TFLOPS | 312 TFLOPS*": dense 156 as printed
    "bf16": 312e12,  # A100 datasheet: "BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS*": dense 312 as printed
    "fp16": 312e12,  # A100 datasheet: "FP16 Tensor Core 312 TFLOPS | 624 TFLOPS*": dense 312 as printed
}

# NVIDIA H100 Tensor Core GPU datasheet (h100-datasheet), column "H100 SXM"; "* With sparsity". No FP4.
_H100_SXM = {
    "fp64": 67e12,  # H100 datasheet, H100 SXM: "FP64 Tensor Core 67 teraFLOPS" (dense)
    "tf32": 494.5e12,  # H100 datasheet, H100 SXM: "TF32 Tensor Core* 989 teraFLOPS" with sparsity: dense = 989 / 2
    "bf16": 989.5e12,  # H100 datasheet, H100 SXM: "BFLOAT16 Tensor Core* 1,979 teraFLOPS" sparse: dense = 1,979 / 2
    "fp16": 989.5e12,  # H100 datasheet, H100 SXM: "FP16 Tensor Core* 1,979 teraFLOPS" sparse: dense = 1,979 / 2
    "fp8": 1979e12,  # H100 datasheet, H100 SXM: "FP8 Tensor Core* 3,958 teraFLOPS" sparse: dense = 3,958 / 2
}

# NVIDIA H100 Tensor Core GPU datasheet, the revision with the column "H100 PCIe" (2022); "* With sparsity".
_H100_PCIE = {
    "fp64": 51e12,  # H100 datasheet, H100 PCIe: "FP64 Tensor Core 51 teraFLOPS" (dense)
    "tf32": 378e12,  # H100 datasheet, H100 PCIe: "TF32 Tensor Core* 756 teraFLOPS" sparse: dense = 756 / 2
    "bf16": 756.5e12,  # H100 datasheet, H100 PCIe: "BFLOAT16 Tensor Core* 1,513 teraFLOPS" sparse: dense = 1,513 / 2
    "fp16": 756.5e12,  # H100 datasheet, H100 PCIe: "FP16 Tensor Core* 1,513 teraFLOPS" sparse: dense = 1,513 / 2
    "fp8": 1513e12,  # H100 datasheet, H100 PCIe: "FP8 Tensor Core* 3,026 teraFLOPS" sparse: dense = 3,026 / 2
}

# NVIDIA H100 Tensor Core GPU datasheet, the revision with the per-GPU column "H100 NVL" (94 GB, 350-400 W);
# "* With sparsity". (A first revision printed the figures of the NVLink-bridged pair of boards, twice these.)
_H100_NVL = {
    "fp64": 60e12,  # H100 datasheet, H100 NVL: "FP64 Tensor Core 60 teraFLOPS" (dense)
    "tf32": 417.5e12,  # H100 datasheet, H100 NVL: "TF32 Tensor Core* 835 teraFLOPS" sparse: dense = 835 / 2
    "bf16": 835.5e12,  # H100 datasheet, H100 NVL: "BFLOAT16 Tensor Core* 1,671 teraFLOPS" sparse: dense = 1,671 / 2
    "fp16": 835.5e12,  # H100 datasheet, H100 NVL: "FP16 Tensor Core* 1,671 teraFLOPS" sparse: dense = 1,671 / 2
    "fp8": 1670.5e12,  # H100 datasheet, H100 NVL: "FP8 Tensor Core* 3,341 teraFLOPS" sparse: dense = 3,341 / 2
}

# NVIDIA H200 Tensor Core GPU datasheet (h200-datasheet), column "H200 SXM"; footnote: "With sparsity". No FP4.
_H200_SXM = {
    "fp64": 67e12,  # H200 datasheet, H200 SXM: "FP64 Tensor Core 67 TFLOPS" (dense)
    "tf32": 494.5e12,  # H200 datasheet, H200 SXM: "TF32 Tensor Core 989 TFLOPS" with sparsity: dense = 989 / 2
    "bf16": 989.5e12,  # H200 datasheet, H200 SXM: "BFLOAT16 Tensor Core 1,979 TFLOPS" sparse: dense = 1,979 / 2
    "fp16": 989.5e12,  # H200 datasheet, H200 SXM: "FP16 Tensor Core 1,979 TFLOPS" sparse: dense = 1,979 / 2
    "fp8": 1979e12,  # H200 datasheet, H200 SXM: "FP8 Tensor Core 3,958 TFLOPS" with sparsity: dense = 3,958 / 2
}

# NVIDIA H200 Tensor Core GPU datasheet, column "H200 NVL" (PCIe board, up to 600 W); footnote: "With sparsity".
_H200_NVL = {
    "fp64": 60e12,  # H200 datasheet, H200 NVL: "FP64 Tensor Core 60 TFLOPS" (dense)
    "tf32": 417.5e12,  # H200 datasheet, H200 NVL: "TF32 Tensor Core 835 TFLOPS" with sparsity: dense = 835 / 2
    "bf16": 835.5e12,  # H200 datasheet, H200 NVL: "BFLOAT16 Tensor Core 1,671 TFLOPS" sparse: dense = 1,671 / 2
    "fp16": 835.5e12,  # H200 datasheet, H200 NVL: "FP16 Tensor Core 1,671 TFLOPS" sparse: dense = 1,671 / 2
    "fp8": 1670.5e12,  # H200 datasheet, H200 NVL: "FP8 Tensor Core 3,341 TFLOPS" with sparsity: dense = 3,341 / 2
}

# NVIDIA H20 (the export-limited Hopper, 96 GB): NVIDIA publishes no H20 datasheet on nvidia.com; these are the
# figures of the H20 product datasheet NVIDIA gave its partners, as reprinted by them. It prints them without a
# sparsity mark and they are dense: a BF16 GEMM reaches 142 of the 148 TFLOPS on an H20
# (https://github.com/zzc0721/torch-performance-test-data/issues/77). Its FP64 figure (1 TFLOPS) does not say
# whether it is the tensor-core rate, so FP64 is left out.
_H20 = {
    "tf32": 74e12,  # H20 partner datasheet: "TF32 Tensor Core 74 TFLOPS" (dense as printed)
    "bf16": 148e12,  # H20 partner datasheet: "BF16 Tensor Core 148 TFLOPS" (dense as printed)
    "fp16": 148e12,  # H20 partner datasheet: "FP16 Tensor Core 148 TFLOPS" (dense as printed)
    "fp8": 296e12,  # H20 partner datasheet: "FP8 Tensor Core 296 TFLOPS" (dense as printed)
}

# NVIDIA L40S GPU datasheet (l40s-datasheet): prints "dense | sparse*" (* with sparsity). Ada has no FP64 tensor
# cores (the datasheet gives no FP64 figure) and no FP4.
_L40S = {
    "tf32": 183e12,  # L40S datasheet: "TF32 Tensor Core TFLOPS 183 | 366*": dense 183 as printed
    "bf16": 362.05e12,  # L40S datasheet: "BFLOAT16 Tensor Core TFLOPS 362.05 | 733*": dense 362.05 as printed
    "fp16": 362.05e12,  # L40S datasheet: "FP16 Tensor Core 362.05 | 733*": dense 362.05 as printed
    "fp8": 733e12,  # L40S datasheet: "FP8 Tensor Core 733 | 1,466*": dense 733 as printed
}

# NVIDIA Blackwell datasheet (blackwell-datasheet, "GB200 NVL72 | HGX B200"), "Individual Blackwell GPU
# Specifications", column "HGX B200" (1,000 W); its tensor-core figures are with sparsity, FP64 excepted.
_B200 = {
    "fp64": 37e12,  # Blackwell datasheet, HGX B200 GPU: "FP64/FP64 Tensor Core 37 TFLOPS" (dense)
    "tf32": 1.1e15,  # Blackwell datasheet, HGX B200 GPU: "TF32 Tensor Core 2.2 PFLOPS" sparse: dense = 2.2 / 2
    "bf16": 2.25e15,  # Blackwell datasheet, HGX B200 GPU: "FP16/BF16 Tensor Core 4.5 PFLOPS" sparse: dense = 4.5 / 2
    "fp16": 2.25e15,  # Blackwell datasheet, HGX B200 GPU: "FP16/BF16 Tensor Core 4.5 PFLOPS" sparse: dense = 4.5 / 2
    "fp8": 4.5e15,  # Blackwell datasheet, HGX B200 GPU: "FP8/FP6 Tensor Core 9 PFLOPS" sparse: dense = 9 / 2
    "fp4": 9e15,  # Blackwell datasheet, HGX B200 GPU: "FP4 Tensor Core 18 PFLOPS" sparse: dense = 18 / 2
}

# NVIDIA Blackwell datasheet, "Individual Blackwell GPU Specifications", column "GB200 NVL72" (one Blackwell GPU of
# a GB200 superchip, up to 1,200 W); tensor-core figures with sparsity, FP64 excepted.
_GB200 = {
    "fp64": 40e12,  # Blackwell datasheet, GB200 GPU: "FP64/FP64 Tensor Core 40 TFLOPS" (dense)
    "tf32": 1.25e15,  # Blackwell datasheet, GB200 GPU: "TF32 Tensor Core 2.5 PFLOPS" sparse: dense = 2.5 / 2
    "bf16": 2.5e15,  # Blackwell datasheet, GB200 GPU: "FP16/BF16 Tensor Core 5 PFLOPS" sparse: dense = 5 / 2
    "fp16": 2.5e15,  # Blackwell datasheet, GB200 GPU: "FP16/BF16 Tensor Core 5 PFLOPS" sparse: dense = 5 / 2
    "fp8": 5e15,  # Blackwell datasheet, GB200 GPU: "FP8/FP6 Tensor Core 10 PFLOPS" sparse: dense = 10 / 2
    "fp4": 10e15,  # Blackwell datasheet, GB200 GPU: "FP4 Tensor Core 20 PFLOPS" sparse: dense = 20 / 2
}

# --- the names, as NVML reports them ---------------------------------------------------------------------------

# NVML product name -> the model's figures. "README" is the driver's table named above, with the PCI device ID.
TABLE: Mapping[str, Mapping[str, float]] = MappingProxyType({
    # README 20B0; nvidia-smi: https://github.com/bottlerocket-os/bottlerocket-core-kit/pull/834
    "NVIDIA A100-SXM4-40GB": MappingProxyType(_A100),
    # README 20B2; nvidia-smi -a: https://github.com/NVIDIA/CUDALibrarySamples/issues/104
    "NVIDIA A100-SXM4-80GB": MappingProxyType(_A100),
    # the A100 SXM4 80GB under drivers 450.x (no "NVIDIA " prefix, "SXM"): https://github.com/keyu-tian/SparK/issues/8
    "A100-SXM-80GB": MappingProxyType(_A100),
    # README 20F1
    "NVIDIA A100-PCIE-40GB": MappingProxyType(_A100),
    # README 20B5
    "NVIDIA A100 80GB PCIe": MappingProxyType(_A100),
    # H100 SXM5, README 2330; nvidia-smi: https://github.com/NVIDIA/dcgm-exporter/issues/512,
    # https://github.com/NVIDIA/nccl/issues/1264; the simulated backend's model (simulated.MODEL)
    "NVIDIA H100 80GB HBM3": MappingProxyType(_H100_SXM),
    # README 2331; device name: https://github.com/zzc0721/torch-performance-test-data/issues/95
    "NVIDIA H100 PCIe": MappingProxyType(_H100_PCIE),
    # README 2321; nvidia-smi: https://github.com/NVIDIA/gpu-admin-tools/issues/4,
    # https://github.com/akash-network/provider-configs/pull/91
    "NVIDIA H100 NVL": MappingProxyType(_H100_NVL),
    # H200 SXM, README 2335; nvidia-smi -q: https://github.com/NVIDIA/mig-parted/issues/120
    "NVIDIA H200": MappingProxyType(_H200_SXM),
    # README 233B
    "NVIDIA H200 NVL": MappingProxyType(_H200_NVL),
    # README 2329; device name: https://github.com/zzc0721/torch-performance-test-data/issues/77
    "NVIDIA H20": MappingProxyType(_H20),
    # README 26B9; nvidia-smi -q: https://github.com/isaac-sim/IsaacSim/issues/228,
    # nvidia-smi --query-gpu=name: https://github.com/akash-network/provider-configs/pull/99
    "NVIDIA L40S": MappingProxyType(_L40S),
    # README 2901; nvidia-smi: https://github.com/NVIDIA/TensorRT-LLM/issues/10278
    "NVIDIA B200": MappingProxyType(_B200),
    # README 2941; device name: https://github.com/sgl-project/sglang/issues/11208
    "NVIDIA GB200": MappingProxyType(_GB200),
})


def _normal(name: str) -> str:
    """The name without case, the separators NVML and its relabellings vary (spaces, "-", "_": the Kubernetes node
    label nvidia.com/gpu.product reads "NVIDIA-H100-80GB-HBM3") and the "NVIDIA " prefix older drivers left out.
    Whole words only: "H20" never reads as "H200", nor "B200" as "GB200"."""
    words = [word for word in re.split(r"[\s_-]+", name.casefold()) if word]
    if words[:1] == ["nvidia"]:
        words = words[1:]
    return " ".join(words)


_NORMAL = {_normal(name): figures for name, figures in TABLE.items()}
if len(_NORMAL) != len(TABLE):  # two names of the table read alike: the lookup would be ambiguous
    raise AssertionError("peak_flops: two names of TABLE normalise to the same key")


@functools.lru_cache(maxsize=64)
def _lookup(model_name: str) -> tuple[tuple[str, float], ...]:
    figures = TABLE.get(model_name)  # the name exactly as NVML gives it
    if figures is None:
        figures = _NORMAL.get(_normal(model_name), {})
    return tuple((dtype, figures[dtype]) for dtype in FLOPS_DTYPES if dtype in figures)


def peak_flops(model_name: str) -> dict[str, float]:
    """Peak dense tensor-core FLOPS of the GPU model NVML names `model_name`, per data type of FLOPS_DTYPES (in
    that order); only the data types the model has; {} for a model not in the table."""
    return dict(_lookup(model_name))
