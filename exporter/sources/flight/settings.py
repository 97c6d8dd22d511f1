"""Settings of the `flight` source: PyTorch flight-recorder dumps."""

from __future__ import annotations

from typing import Annotated, Any

from goodput_client.contract import FLIGHT_DUMP_PREFIXES
from pydantic import BeforeValidator, Field, field_validator, model_validator

from ...core.settings import Duration, SourceConfig, parse_duration


def check_prefix(value: str) -> str:
    """A dump file's name is <prefix><rank>[.pkl|.json]: the prefix is a plain file name's beginning."""
    if not value or "/" in value or "\0" in value or value.startswith("."):
        raise ValueError(f"{value!r} is not a plain file-name prefix (not empty, no '/', not starting with '.'), "
                         "e.g. comm_lib_trace_rank_")
    return value


def _duration_or_never(value: Any) -> float:
    """A duration, or 0 (also "0s"): never."""
    if type(value) in (int, float, str) and str(value).strip() in ("0", "0.0", "0s"):
        return 0.0
    return parse_duration(value)


DurationOrNever = Annotated[float, BeforeValidator(_duration_or_never)]


class FlightConfig(SourceConfig):
    interval: Duration = Field(5.0, description="How often the source collects.")
    dir: str = Field(
        "/run/goodput-exporter/flight",
        description="Directory of flight-recorder dumps: DIR/<workload>/<prefix><rank>[.pkl|.json], or "
        "DIR/<prefix><rank> for workload 'default'.")
    prefixes: list[str] = Field(
        list(FLIGHT_DUMP_PREFIXES),
        description="File-name prefixes before the rank (comma-separated in a flag or variable): the file-name "
        "part of the jobs' TORCH_FR_DUMP_TEMP_FILE. By default PyTorch's own, comm_lib_trace_rank_, and its "
        "earlier nccl_trace_rank_. Where several fit a name, the longest wins.")
    prefix: str = Field(
        "", description="Deprecated, removed in the next release: use prefixes. One prefix; when set, "
        "prefixes is [prefix] (a warning is logged).")
    max_file_bytes: int = Field(64 * 2**20, ge=1024, description="Larger dump files are rejected unread.")
    max_files: int = Field(
        512, ge=1, description="Most dump files read; beyond it the most recently written are kept.")
    max_series: int = Field(
        100_000, ge=1_000, description="Most series the source exports, all dumps together (its own few "
        "included). Ranks' dumps are taken most recently written first; one whose series do not fit in what "
        "is left is not exported (rejected as too_many_series, its counters kept for when it fits again) and "
        "older, smaller ones may still fit. Missing-rank series are taken first.")
    follow_dir_symlink: bool = Field(
        False, description="Read flight.dir even when it is a symbolic link. Off, such a flight.dir is refused "
        "(source error dir_symlink): whoever can write its parent folder could point it anywhere. Symbolic "
        "links below flight.dir are never followed.")
    rank_missing_after: Duration = Field(
        10.0, description="A rank is reported missing from a collective only when its own dump was "
        "written this long after another rank enqueued it.")
    stale_after: DurationOrNever = Field(
        120.0, ge=0, description=(
            "Seconds (or a duration: 2m): a rank's dump file not rewritten for this long ends the rank's "
            "flight-recorder series and state, though the file stays (a job that ended or died); the file is read"
            " again once it is rewritten. A rank whose process the daemon saw exit (the process that reported for"
            " it over the events socket) ends at once, and one that sent its `end` a minute later, whatever this "
            "says. Set it to at least twice the jobs' dump interval (goodput_client's dump_flight_recorder: 60 s "
            "by default; one late dump is not a rank gone): a live rank, hung or not, keeps rewriting its dump. "
            "The default, two dump intervals, also ends the collective alerts of a job whose death the daemon "
            "cannot see within about 2 minutes. 0: never (dumps are read however old)."))
    hang_after: Duration = Field(
        300.0, gt=0, description="A collective in flight this long in a rank's dump is a hang: the workload's ranks "
        "on this node are asked for captures (ingest.capture_dir, ingest.capture_workloads), once per dump.")

    @field_validator("prefixes")
    @classmethod
    def _check_prefixes(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("name at least one file-name prefix, e.g. comm_lib_trace_rank_")
        return list(dict.fromkeys(check_prefix(prefix) for prefix in value))

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        return check_prefix(value) if value else value

    @model_validator(mode="after")
    def _deprecated_prefix(self) -> FlightConfig:
        if self.prefix:
            if "prefixes" in self.model_fields_set and self.prefixes != [self.prefix]:
                raise ValueError("flight.prefix is deprecated and flight.prefixes is set too: keep only "
                                 f"flight.prefixes (e.g. [{self.prefix}])")
            self.prefixes = [self.prefix]
        return self
