"""Settings of the `health` source."""

from __future__ import annotations

from pydantic import Field

from ...core.settings import Duration, SourceConfig


class HealthSourceConfig(SourceConfig):
    interval: Duration = Field(5.0, description="How often the source reads the health check's state file.")
    state_file: str = Field(
        "/var/lib/goodput-exporter/health-state.json",
        description="The state file `goodput-exporter health` keeps (its --state-file): its decisions are published "
        "from it. Absent until the health check first runs: no series then.")
