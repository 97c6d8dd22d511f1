"""The real NVML backend. Without a GPU only its failure path can run here; with one, the smoke test."""

from __future__ import annotations

import ast
from pathlib import Path

import pynvml
import pytest

from exporter.sources.nvml import metrics as c
from exporter.sources.nvml.api import DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, GpuError
from exporter.sources.nvml.library import NvmlLibrary
from exporter.sources.nvml.source import NvmlSource


def _driver_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_every_pynvml_name_used_exists_in_the_installed_binding() -> None:
    source = Path(__file__).resolve().parent.parent / "exporter" / "sources" / "nvml" / "library.py"
    names = {node.attr for node in ast.walk(ast.parse(source.read_text()))
             if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "pynvml"}
    assert len(names) > 30
    assert sorted(name for name in names if not hasattr(pynvml, name)) == []


@pytest.mark.skipif(_driver_present(), reason="an NVIDIA driver is present")
def test_without_a_driver_init_raises_a_translated_error() -> None:
    with pytest.raises(GpuError) as info:
        NvmlLibrary().init()
    assert info.value.code in (LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED)


@pytest.mark.skipif(not _driver_present(), reason="no NVIDIA driver on this machine")
def test_real_gpus_smoke() -> None:
    source = NvmlSource(NvmlLibrary())
    first = source.collect()
    second = source.collect()
    assert first.values(c.GPU_UP)
    assert not [e for e in second.errors if e != "nvml_not_supported"]
    source.close()
