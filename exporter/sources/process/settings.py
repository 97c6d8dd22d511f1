"""Settings of the `process` source."""

from __future__ import annotations

from pydantic import Field

from ...core.settings import Duration, SourceConfig


class ProcessConfig(SourceConfig):
    interval: Duration = Field(5.0, description="How often the source collects.")
