"""goodput-instrument's settings: GOODPUT_* environment variables, read once per process at interpreter start.

    GOODPUT_INSTRUMENT          "0" (or false, no, off): load nothing in this process and its children
    GOODPUT_INSTRUMENT_PROBES_OFF  comma-separated probe names to leave off (e.g. "eval,comm_wait"; "flight": no
                                periodic flight-recorder dumps; "nccl_timing": TORCH_NCCL_ENABLE_TIMING left as it is)
    GOODPUT_INGEST_SOCKET_PATH  the daemon's events socket (the client's own variable)
    GOODPUT_FLIGHT_DIR          the node's flight-recorder directory (the daemon's flight.dir)
    GOODPUT_FLIGHT_INTERVAL     seconds between periodic flight-recorder dumps
    GOODPUT_FLOPS               "measure": count one step's model FLOPs with FlopCounterMode (plain loops)
    GOODPUT_WORKLOAD, GOODPUT_RANK  the identity, where the launcher's variables name none
    GOODPUT_FLOPS_DTYPE         the data type the measured FLOPs run in (default bf16)

docs/instrument.md has the table users read. Standard library only; nothing here imports PyTorch.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

ENABLE_ENV = "GOODPUT_INSTRUMENT"
PROBES_OFF_ENV = "GOODPUT_INSTRUMENT_PROBES_OFF"
FLIGHT_DIR_ENV = "GOODPUT_FLIGHT_DIR"
FLIGHT_INTERVAL_ENV = "GOODPUT_FLIGHT_INTERVAL"
FLOPS_ENV = "GOODPUT_FLOPS"
FLOPS_DTYPE_ENV = "GOODPUT_FLOPS_DTYPE"
WORKLOAD_ENV = "GOODPUT_WORKLOAD"
RANK_ENV = "GOODPUT_RANK"
DEFAULT_FLIGHT_DIR = "/run/goodput-exporter/flight"  # the daemon's flight.dir default
DEFAULT_FLIGHT_INTERVAL = 30.0
_OFF = frozenset({"0", "false", "no", "off"})


class Settings:
    __slots__ = ("enabled", "flight_dir", "flight_interval", "flops_dtype", "measure_flops", "probes_off", "rank",
                 "workload")

    def __init__(self, env: Mapping[str, str]) -> None:
        self.enabled = (env.get(ENABLE_ENV) or "1").strip().lower() not in _OFF
        self.probes_off = frozenset(p.strip() for p in env.get(PROBES_OFF_ENV, "").split(",") if p.strip())
        self.flight_dir = env.get(FLIGHT_DIR_ENV) or DEFAULT_FLIGHT_DIR
        self.flight_interval = _seconds(env.get(FLIGHT_INTERVAL_ENV), DEFAULT_FLIGHT_INTERVAL)
        self.measure_flops = (env.get(FLOPS_ENV) or "").strip().lower() == "measure"
        self.flops_dtype = env.get(FLOPS_DTYPE_ENV) or "bf16"
        self.workload = env.get(WORKLOAD_ENV) or None
        rank = env.get(RANK_ENV, "")
        self.rank = int(rank) if rank.isdigit() else None


def _seconds(text: str | None, default: float) -> float:
    try:
        value = float(text) if text else default
    except ValueError:
        return default
    return value if 0.0 < value < 86_400.0 else default


def from_environment() -> Settings:
    return Settings(os.environ)
