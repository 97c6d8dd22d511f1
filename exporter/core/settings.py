"""The building blocks of every settings model: durations, listen addresses, the strict section base, the
fields every source has, and the error a configuration problem raises.

Each source's own settings model lives in its folder (`sources/<name>/settings.py`) and derives from
`SourceConfig`; `exporter.config` assembles the root model from the registry and layers file, environment and
flags over it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

DEFAULT_PORT = 9445
MAX_DURATION = 86_400.0


class ConfigError(Exception):
    """A configuration problem, phrased for the person who wrote the config."""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any) -> float:
    """`500ms`, `1s`, `1.5s`, `2m`, `1h`, or a bare number of seconds -> seconds (float)."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r} (use e.g. 500ms, 1s, 2m)")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            try:
                seconds = float(value)
            except ValueError:
                raise ValueError(f"invalid duration {value!r} (use e.g. 500ms, 1s, 2m)") from None
        else:
            seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        raise ValueError(f"invalid duration {value!r} (use e.g. 500ms, 1s, 2m)")
    if not seconds > 0:
        raise ValueError(f"duration must be positive, got {value!r}")
    if not seconds <= MAX_DURATION:
        raise ValueError(f"duration {value!r} is longer than the maximum of 24h")
    return seconds


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    if seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


Duration = Annotated[float, BeforeValidator(parse_duration)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


def parse_listen_address(value: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` (all interfaces) or `[v6]:PORT` -> (host, port)."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(
            f"invalid listen address {value!r} (want HOST:PORT, e.g. 0.0.0.0:{DEFAULT_PORT})")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} out of range 0-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        ipaddress.IPv6Address(host)
    elif host == "":
        host = "0.0.0.0"
    return host, port


class WebConfig(Section):
    listen_address: str = Field(
        f"0.0.0.0:{DEFAULT_PORT}",
        description="Address the HTTP server (/metrics, /healthz, /readyz) binds.")
    max_connections: int = Field(
        256, ge=1, le=1_000_000, description="Most connections the HTTP server keeps open. A connection over it "
        "closes the oldest idle one of the client (address) holding the most, or is answered 503 when none is idle; "
        "all servers together also leave 256 of the open-files limit to the sources.")
    keep_alive_timeout: Duration = Field(
        75.0, description="A connection that has not sent a whole request this long after it opened or after its "
        "last response is closed: idle keep-alive connections (keep it above the scrape interval to reuse them), "
        "slow senders, clients that stopped reading.")
    max_header_bytes: int = Field(
        65_536, ge=1024, le=2**30, description="Largest request line and headers accepted; a larger request is "
        "answered 431 and its connection closed.")
    shutdown_timeout: Duration = Field(
        5.0, description="On SIGTERM, how long requests in progress and responses still being sent get to finish "
        "before their connections are cut.")

    @field_validator("listen_address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        parse_listen_address(value)
        return value


class LogConfig(Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    format: Literal["text", "json"] = Field("text", description="Log line format.")


MIN_INTERVAL_SHARE = 0.25  # default min_interval: interval / 4
MAX_INTERVAL_FACTOR = 4.0  # default max_interval: interval * 4


class SourceConfig(Section):
    enabled: bool = Field(True, description="Run this source.")
    interval: Duration = Field(1.0, description="How often the source collects.")
    timeout: Duration = Field(
        5.0, description="A collection running longer than this marks the source down (it is left to finish).")
    adaptive: bool = Field(
        False, description="Adapt the interval to the source's data: halve it (down to min_interval) while its "
        "series change fast or a capture runs, grow it (up to max_interval) while they hold steady. Off: always "
        "interval.")
    # None is never validated: _derive_bounds fills both from interval first
    min_interval: Duration = Field(  # type: ignore[assignment]
        None, description="With adaptive, the shortest interval; default: interval / 4.")
    max_interval: Duration = Field(  # type: ignore[assignment]
        None, description="With adaptive, the longest interval; default: interval x 4 (at most 24h).")

    @model_validator(mode="before")
    @classmethod
    def _derive_bounds(cls, data: Any) -> Any:
        """min_interval and max_interval not given: from the interval the section ends up with."""
        if not isinstance(data, dict) or ("min_interval" in data and "max_interval" in data):
            return data
        try:
            interval = parse_duration(data.get("interval", cls.model_fields["interval"].default))
        except ValueError:
            interval = 1.0  # placeholder bounds: the interval's own error is the one reported
        data = dict(data)
        data.setdefault("min_interval", interval * MIN_INTERVAL_SHARE)
        data.setdefault("max_interval", min(interval * MAX_INTERVAL_FACTOR, MAX_DURATION))
        return data

    @model_validator(mode="after")
    def _check_bounds(self) -> SourceConfig:
        interval = format_duration(self.interval)
        if self.min_interval > self.interval:
            raise ValueError(f"min_interval {format_duration(self.min_interval)} is longer than interval {interval} "
                             "(need min_interval <= interval <= max_interval)")
        if self.max_interval < self.interval:
            raise ValueError(f"max_interval {format_duration(self.max_interval)} is shorter than interval {interval} "
                             "(need min_interval <= interval <= max_interval)")
        return self


def loopback_address(value: str) -> str:
    if value:
        host, _ = parse_listen_address(value)
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"{value!r} is not a loopback address: the ingest API must not leave the node")
    return value
