"""The exporter's own metrics: each source's health, and the build."""

from __future__ import annotations

from .catalog import Declarer, Kind

_m = Declarer("exporter")

SRC = ("source",)
SOURCE_UP = _m(
    "goodput_exporter_source_up", Kind.GAUGE, "",
    "1 when the source's last collection succeeded, else 0.", SRC)
SOURCE_DURATION = _m(
    "goodput_exporter_source_collection_duration_seconds", Kind.GAUGE, "seconds",
    "Wall time of the source's last finished collection.", SRC)
SOURCE_INTERVAL = _m(
    "goodput_exporter_source_interval_seconds", Kind.GAUGE, "seconds",
    "Seconds between the source's collections now: its interval, or with adaptive the interval it adapted to "
    "(min_interval while a capture holds it there).", SRC)
SOURCE_LAST_SUCCESS = _m(
    "goodput_exporter_source_last_success_timestamp_seconds", Kind.GAUGE, "seconds",
    "Unix time of the source's last successful collection; absent before the first.", SRC)
SOURCE_COLLECTIONS = _m(
    "goodput_exporter_source_collections_total", Kind.COUNTER, "",
    "Collections the source finished, successful or not.", SRC)
SOURCE_ERRORS = _m(
    "goodput_exporter_source_errors_total", Kind.COUNTER, "",
    "Errors of the source by reason: timeout (a call hung past the source's timeout), exception, "
    "nvml_not_found, nvml_<error> for NVML errors, and source-specific reasons.",
    (*SRC, "reason"))
LIBRARY_CALLS = _m(
    "goodput_exporter_library_calls_total", Kind.COUNTER, "",
    "Calls the source made to the GPU library it reads, by function: NVML's (nvmlDeviceGetPowerUsage, ...) for the "
    "nvml source, DCGM's for the dcgm source (the simulated backends' calls count under the same names). The "
    "exporter's own cost on the node: bench/results.md has it per GPU and second.", (*SRC, "call"))
BUILD_INFO = _m(
    "goodput_exporter_build_info", Kind.INFO, "",
    "Version of the exporter and the GPU backend it uses (nvml or simulated); value is always 1.",
    ("version", "python_version", "gpu_backend"))
HTTP_CONNECTIONS = _m(
    "goodput_exporter_http_connections", Kind.GAUGE, "",
    "Connections open on the exporter's HTTP server: metrics (/metrics and the probes) or events (the ingest API).",
    ("server",))
HTTP_CONNECTIONS_CLOSED = _m(
    "goodput_exporter_http_connections_closed_total", Kind.COUNTER, "",
    "Connections the server closed by a limit, by reason: evicted (the oldest idle one of the peer holding the most, "
    "to make room for a new one), refused (503: max_connections open and none idle), header_too_large (431), "
    "idle_timeout (no whole request within keep_alive_timeout of opening or of the last response, or a response "
    "left unread that long).", ("server", "reason"))

METRICS = _m.metrics
