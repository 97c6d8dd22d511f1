"""Peak dense tensor-core FLOPS per GPU model: every figure cited to its datasheet, names matched without mistaking
a look-alike, the real NVML names resolved, and goodput_gpu_peak_flops exported by the nvml source."""

from __future__ import annotations

import ast
import inspect
import io
import tokenize

import pytest
from conftest import ManualClock, series, value
from goodput_client.contract import FLOPS_DTYPES

from exporter.core.exposition import TEXT, Renderer
from exporter.sources.nvml import peak_flops as module
from exporter.sources.nvml import simulated
from exporter.sources.nvml import source as source_module
from exporter.sources.nvml.peak_flops import TABLE, peak_flops
from exporter.sources.nvml.simulated import SimulatedGpus
from exporter.sources.nvml.source import NvmlSource

# H100 SXM, dense: half the H100 datasheet's sparse figures (FP64 as printed)
H100_SXM = {"fp64": 67e12, "tf32": 494.5e12, "fp16": 989.5e12, "bf16": 989.5e12, "fp8": 1979e12}


def _comments_by_line(text: str) -> dict[int, str]:
    return {tok.start[0]: tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline)
            if tok.type == tokenize.COMMENT}


def _figure_dicts(tree: ast.Module) -> dict[str, ast.Dict]:
    """The module-level dict literals keyed by data types: the per-model figures."""
    found = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Dict) and node.value.keys
                and all(isinstance(k, ast.Constant) and k.value in FLOPS_DTYPES for k in node.value.keys)):
            found[node.targets[0].id] = node.value
    return found


def test_every_figure_carries_its_datasheet_citation() -> None:
    text = inspect.getsource(module)
    comments = _comments_by_line(text)
    figures = _figure_dicts(ast.parse(text))
    assert len(figures) >= 10
    for name, node in figures.items():
        for key, val in zip(node.keys, node.values, strict=True):
            assert isinstance(key, ast.Constant)
            lines = range(key.lineno, (val.end_lineno or val.lineno) + 1)
            cited = " ".join(comments.get(line, "") for line in lines)
            assert "datasheet" in cited.casefold(), f"{name}[{key.value!r}] (line {key.lineno}) cites no datasheet"
            # the figure as printed and how the dense value follows from it
            assert '"' in cited and ("dense" in cited or "sparse" in cited), (name, key.value, cited)
    # every model of the table is one of these cited dicts
    for model_name, mapping in TABLE.items():
        assert any(dict(mapping) == vars(module)[name] for name in figures), model_name


def test_every_name_says_where_it_was_seen() -> None:
    text = inspect.getsource(module)
    comments = _comments_by_line(text)
    table = next(node for node in ast.parse(text).body
                 if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "TABLE")
    call = table.value
    assert isinstance(call, ast.Call) and isinstance(call.args[0], ast.Dict)
    keys = call.args[0].keys
    assert {k.value for k in keys if isinstance(k, ast.Constant)} == set(TABLE)
    for key in keys:
        assert isinstance(key, ast.Constant)
        line, block = key.lineno - 1, []
        while line in comments:  # the comment lines right above the entry
            block.append(comments[line])
            line -= 1
        seen = " ".join(block) + comments.get(key.lineno, "")
        assert "README" in seen or "https://" in seen, f"{key.value!r}: where was this NVML name seen?"


def test_figures_are_plausible() -> None:
    for name, figures in TABLE.items():
        assert figures, name
        assert set(figures) <= set(FLOPS_DTYPES), name
        assert all(isinstance(v, float) and v > 0 for v in figures.values()), name
        assert figures["bf16"] == figures["fp16"], name
        # narrower types are faster: fp64 < tf32 < bf16 < fp8 < fp4, over the types the model has
        ordered = [figures[d] for d in ("fp64", "tf32", "bf16", "fp8", "fp4") if d in figures]
        assert ordered == sorted(set(ordered)), name
        # dense, not sparse: no GPU of the table reaches 3 dense BF16 PFLOPS (GB200: 2.5)
        assert figures["bf16"] < 3e15, name


def test_absent_data_types_are_absent_not_zero() -> None:
    assert "fp8" not in peak_flops("NVIDIA A100-SXM4-80GB")  # Ampere has no FP8 tensor cores
    assert "fp4" not in peak_flops("NVIDIA H100 80GB HBM3")  # FP4 came with Blackwell
    assert "fp64" not in peak_flops("NVIDIA L40S")  # Ada: no FP64 tensor cores
    assert set(peak_flops("NVIDIA B200")) == set(FLOPS_DTYPES)
    assert all(v > 0 for name in TABLE for v in peak_flops(name).values())


def test_simulated_model_is_an_h100_sxm() -> None:
    assert simulated.MODEL == "NVIDIA H100 80GB HBM3"
    assert peak_flops(simulated.MODEL) == H100_SXM


@pytest.mark.parametrize(("name", "not_this"), [
    ("NVIDIA H20", "NVIDIA H200"),
    ("NVIDIA H200", "NVIDIA H20"),
    ("NVIDIA GB200", "NVIDIA B200"),
    ("NVIDIA B200", "NVIDIA GB200"),
    ("NVIDIA H100 NVL", "NVIDIA H100 80GB HBM3"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3"),
    ("NVIDIA H200 NVL", "NVIDIA H200"),
    ("NVIDIA A100 80GB PCIe", "NVIDIA H100 PCIe"),
])
def test_look_alikes_are_not_confused(name: str, not_this: str) -> None:
    assert peak_flops(name) == dict(TABLE[name])
    assert peak_flops(name) != peak_flops(not_this)


@pytest.mark.parametrize("name", [
    "", "unknown", "NVIDIA", "NVIDIA H100", "NVIDIA H20 NVL16", "NVIDIA H800", "NVIDIA GH200 480GB", "NVIDIA GB300",
    "NVIDIA B300 SXM6 AC", "NVIDIA A100-SXM-64GB", "NVIDIA A100", "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
    "NVIDIA H1000", "NVIDIA GH20", "NVIDIA L40", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090",
])
def test_unknown_or_partial_names_get_nothing(name: str) -> None:
    assert peak_flops(name) == {}


def test_lookup_normalises_case_spacing_and_separators() -> None:
    for name in ("nvidia h100 80gb hbm3", "  NVIDIA  H100 80GB HBM3 ", "NVIDIA-H100-80GB-HBM3", "H100 80GB HBM3"):
        assert peak_flops(name) == H100_SXM, name
    assert peak_flops("A100-PCIE-40GB") == peak_flops("NVIDIA A100-PCIE-40GB")  # drivers before 470 had no prefix
    result = peak_flops("NVIDIA H100 80GB HBM3")
    result["bf16"] = 0.0  # the caller's copy: the table is untouched
    assert peak_flops("NVIDIA H100 80GB HBM3") == H100_SXM


# NVML names as printed by nvidia-smi (or by CUDA's device name, the same string) in public pastes, and the model
# each must resolve to (its dense BF16 figure). The strings are copied from the pages named.
PASTES = [
    # nvidia-smi, 8x H100 SXM: https://github.com/NVIDIA/dcgm-exporter/issues/512
    ("NVIDIA H100 80GB HBM3", 989.5e12, "https://github.com/NVIDIA/dcgm-exporter/issues/512"),
    # nvidia-smi, HGX H100: https://github.com/NVIDIA/nccl/issues/1264
    ("NVIDIA H100 80GB HBM3", 989.5e12, "https://github.com/NVIDIA/nccl/issues/1264"),
    # torch device name: https://github.com/zzc0721/torch-performance-test-data/issues/95
    ("NVIDIA H100 PCIe", 756.5e12, "https://github.com/zzc0721/torch-performance-test-data/issues/95"),
    # nvidia-smi, 2x H100 NVL: https://github.com/NVIDIA/gpu-admin-tools/issues/4
    ("NVIDIA H100 NVL", 835.5e12, "https://github.com/NVIDIA/gpu-admin-tools/issues/4"),
    # nvidia-smi --query-gpu=name: https://github.com/akash-network/provider-configs/pull/91
    ("NVIDIA H100 NVL", 835.5e12, "https://github.com/akash-network/provider-configs/pull/91"),
    # nvidia-smi, driver 580: https://github.com/bottlerocket-os/bottlerocket-core-kit/pull/834
    ("NVIDIA A100-SXM4-40GB", 312e12, "https://github.com/bottlerocket-os/bottlerocket-core-kit/pull/834"),
    # nvidia-smi -a "Product Name", driver 470: https://github.com/NVIDIA/CUDALibrarySamples/issues/104
    ("NVIDIA A100-SXM4-80GB", 312e12, "https://github.com/NVIDIA/CUDALibrarySamples/issues/104"),
    # nvidia-smi, driver 450 (no "NVIDIA " prefix): https://github.com/keyu-tian/SparK/issues/8
    ("A100-SXM-80GB", 312e12, "https://github.com/keyu-tian/SparK/issues/8"),
    # nvidia-smi -q "Product Name": https://github.com/NVIDIA/mig-parted/issues/120
    ("NVIDIA H200", 989.5e12, "https://github.com/NVIDIA/mig-parted/issues/120"),
    # torch device name: https://github.com/zzc0721/torch-performance-test-data/issues/77
    ("NVIDIA H20", 148e12, "https://github.com/zzc0721/torch-performance-test-data/issues/77"),
    # nvidia-smi -q "Product Name": https://github.com/isaac-sim/IsaacSim/issues/228
    ("NVIDIA L40S", 362.05e12, "https://github.com/isaac-sim/IsaacSim/issues/228"),
    # nvidia-smi --query-gpu=name: https://github.com/akash-network/provider-configs/pull/99
    ("NVIDIA L40S", 362.05e12, "https://github.com/akash-network/provider-configs/pull/99"),
    # nvidia-smi, 8x B200: https://github.com/NVIDIA/TensorRT-LLM/issues/10278
    ("NVIDIA B200", 2.25e15, "https://github.com/NVIDIA/TensorRT-LLM/issues/10278"),
    # sglang check_env (CUDA device name), 4x GB200: https://github.com/sgl-project/sglang/issues/11208
    ("NVIDIA GB200", 2.5e15, "https://github.com/sgl-project/sglang/issues/11208"),
]


@pytest.mark.parametrize(("name", "bf16", "url"), PASTES, ids=[f"{n}@{u.rsplit('/', 3)[-3]}" for n, _, u in PASTES])
def test_real_nvml_names_resolve_to_their_model(name: str, bf16: float, url: str) -> None:
    figures = peak_flops(name)
    assert figures, f"{name!r} (seen at {url}) is not in the table"
    assert figures["bf16"] == bf16, url


def test_names_only_in_the_driver_table_resolve_too() -> None:
    """No public paste found for these; the driver's own table (open-gpu-kernel-modules README, 595.45.04) names
    them: https://github.com/NVIDIA/open-gpu-kernel-modules/blob/595.45.04/README.md"""
    assert peak_flops("NVIDIA A100-PCIE-40GB")["bf16"] == 312e12  # 20F1
    assert peak_flops("NVIDIA A100 80GB PCIe")["bf16"] == 312e12  # 20B5
    assert peak_flops("NVIDIA H200 NVL")["bf16"] == 835.5e12  # 233B


# --- the nvml source, on the simulated backend --------------------------------------------------------------------

def _setup(count: int = 2) -> tuple[ManualClock, SimulatedGpus, NvmlSource]:
    clock = ManualClock()
    sim = SimulatedGpus(count, clock=clock)
    return clock, sim, NvmlSource(sim, clock=clock)


def _scrape(source: NvmlSource) -> str:
    return Renderer().render(source.collect(), TEXT).decode()


def test_simulated_gpus_export_the_h100_sxm_peak_per_dtype() -> None:
    clock, sim, source = _setup(3)
    clock.advance(1)
    text = _scrape(source)
    rows = series(text, "goodput_gpu_peak_flops")
    assert len(rows) == 3 * len(H100_SXM)
    for gpu in ("0", "1", "2"):
        uuid = sim.device_uuid(sim.device_handle(int(gpu)))
        assert {r["dtype"] for r in rows if r["gpu"] == gpu} == set(H100_SXM)
        for dtype, flops in H100_SXM.items():
            assert value(text, "goodput_gpu_peak_flops", gpu=gpu, uuid=uuid, dtype=dtype) == flops
    assert value(text, "goodput_gpu_info", gpu="0", model="NVIDIA H100 80GB HBM3") == 1
    assert "# TYPE goodput_gpu_peak_flops gauge" in text


def test_peak_is_looked_up_once_per_gpu_not_per_collect(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def counting(name: str) -> dict[str, float]:
        calls.append(name)
        return peak_flops(name)

    monkeypatch.setattr(source_module, "peak_flops", counting)
    clock, _sim, source = _setup(2)
    for _ in range(4):
        clock.advance(1)
        assert len(series(_scrape(source), "goodput_gpu_peak_flops")) == 2 * len(H100_SXM)
    assert calls == [simulated.MODEL, simulated.MODEL]


def test_unknown_model_exports_no_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simulated, "MODEL", "NVIDIA Imaginary 1000")
    clock, _sim, source = _setup(2)
    clock.advance(1)
    text = _scrape(source)
    assert series(text, "goodput_gpu_peak_flops") == []
    assert value(text, "goodput_gpu_info", gpu="0", model="NVIDIA Imaginary 1000") == 1
    assert value(text, "goodput_gpu_up", gpu="0") == 1


def test_lost_gpu_keeps_its_model_peak_and_an_unidentified_one_has_none() -> None:
    clock, sim, source = _setup(2)
    sim.lose(1)  # lost before start-up: never identified
    clock.advance(1)
    text = _scrape(source)
    assert {r["gpu"] for r in series(text, "goodput_gpu_peak_flops")} == {"0"}
    sim._gpus[1].lost = False  # reset by an operator: identified now
    clock.advance(1)
    text = _scrape(source)
    assert {r["gpu"] for r in series(text, "goodput_gpu_peak_flops")} == {"0", "1"}
    sim.lose(0)  # lost mid-run: its identity, and so its model's peak, stay known (as goodput_gpu_info)
    clock.advance(1)
    text = _scrape(source)
    assert value(text, "goodput_gpu_up", gpu="0") == 0
    assert value(text, "goodput_gpu_peak_flops", gpu="0", dtype="bf16") == H100_SXM["bf16"]
