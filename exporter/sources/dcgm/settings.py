"""Settings of the `dcgm` source: DCGM's profiling fields, from its bindings or a dcgm-exporter."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from ...core.settings import Duration, SourceConfig

DCGM_BINDINGS_PATHS = ("/usr/share/datacenter-gpu-manager-4/bindings/python3", "/usr/local/dcgm/bindings/python3")


class DcgmConfig(SourceConfig):
    enabled: bool = Field(
        False, description="Run this source (off by default: it needs DCGM, or a dcgm-exporter on the node).")
    interval: Duration = Field(
        1.0, description="How often the source collects; with mode=bindings also DCGM's sampling period.")
    mode: Literal["bindings", "exporter"] = Field(
        "bindings", description="bindings: DCGM's Python bindings and its host engine; exporter: read the "
        "DCGM_FI_PROF_* series of a dcgm-exporter running on the node.")
    bindings_path: str = Field(
        "", description="Directory holding DCGM's Python bindings (pydcgm.py); empty: the first of "
        + " and ".join(DCGM_BINDINGS_PATHS) + " that exists.")
    hostengine: str = Field(
        "localhost", description="For mode=bindings, the nv-hostengine to connect to: HOST or HOST:PORT "
        "(TCP, port 5555 by default), unix:PATH (its Unix socket), or embedded (start DCGM's engine "
        "inside this process; needs root for profiling fields).")
    exporter_url: str = Field(
        "http://127.0.0.1:9400/metrics", description="For mode=exporter, the /metrics URL of the dcgm-exporter "
        "on this node; series are matched to this node's GPUs by UUID.")

    @field_validator("hostengine")
    @classmethod
    def _check_hostengine(cls, value: str) -> str:
        if not value or (value.startswith("unix:") and len(value) == len("unix:")):
            raise ValueError(f"{value!r}: want HOST, HOST:PORT, unix:PATH or embedded")
        return value

    @field_validator("exporter_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+(/\S*)?$", value):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value
