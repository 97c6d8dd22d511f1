"""Settings of the `host` source."""

from __future__ import annotations

from pydantic import Field

from ...core.settings import Duration, SourceConfig


class HostConfig(SourceConfig):
    interval: Duration = Field(5.0, description="How often the source collects.")
    proc_path: str = Field(
        "/proc", description="Mount point of the host's procfs (e.g. /host/proc in a pod); the process source "
        "reads it too.")
