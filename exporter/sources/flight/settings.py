"""Settings of the `flight` source: PyTorch flight-recorder dumps."""

from __future__ import annotations

from goodput_client.contract import FLIGHT_DUMP_PREFIX
from pydantic import Field, field_validator

from ...core.settings import Duration, SourceConfig


class FlightConfig(SourceConfig):
    interval: Duration = Field(5.0, description="How often the source collects.")
    dir: str = Field(
        "/run/goodput-exporter/flight",
        description="Directory of flight-recorder dumps: DIR/<workload>/<prefix><rank>[.pkl|.json], or "
        "DIR/<prefix><rank> for workload 'default'.")
    prefix: str = Field(
        FLIGHT_DUMP_PREFIX,
        description="File-name prefix before the rank (PyTorch's TORCH_FR_DUMP_TEMP_FILE default).")
    max_file_bytes: int = Field(64 * 2**20, ge=1024, description="Larger dump files are rejected unread.")
    max_files: int = Field(
        512, ge=1, description="Most dump files read; beyond it the most recently written are kept.")
    rank_missing_after: Duration = Field(
        10.0, description="A rank is reported missing from a collective only when its own dump was "
        "written this long after another rank enqueued it.")

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        if "/" in value or value.startswith("."):
            raise ValueError(f"{value!r} must be a plain file-name prefix")
        return value
