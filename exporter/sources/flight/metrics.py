"""Metrics of the `flight` source: collectives, from PyTorch flight-recorder dumps."""

from __future__ import annotations

from ...core.catalog import Declarer, Kind

_m = Declarer("flight")

FR = ("workload", "rank")
PG = (*FR, "pg")
COLLECTIVE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0)
COLLECTIVE_GROUP_INFO = _m(
    "goodput_collective_group_info", Kind.INFO, "",
    "A process group the rank's flight recorder knows, with its description (default_pg, or the name "
    "given to new_group); value is always 1.", (*PG, "desc"))
COLLECTIVE_LAST_SEQ = _m(
    "goodput_collective_last_seq", Kind.GAUGE, "",
    "Sequence number of the last collective the rank enqueued, started or completed on the process "
    "group (state). enqueued and completed are 0 before the first; started is absent where the backend "
    "does not track starts (gloo) and before the first start. completed is the dump's pg_status, or its "
    "last retired collective where that is later (pg_status can lag its entries). Compare across ranks "
    "to see who is behind.", (*PG, "state"))
COLLECTIVE_INFLIGHT = _m(
    "goodput_collective_inflight", Kind.GAUGE, "",
    "Collectives and point-to-point ops of the process group that the rank enqueued and that had not "
    "completed when it dumped.", PG)
COLLECTIVE_OLDEST_INFLIGHT = _m(
    "goodput_collective_oldest_inflight_seconds", Kind.GAUGE, "seconds",
    "How long the oldest in-flight op of the process group had been waiting when the rank dumped (0 "
    "when none). Add time() - goodput_flight_recorder_dump_timestamp_seconds for its age now.",
    PG)
COLLECTIVE_OPS = _m(
    "goodput_collective_operations_total", Kind.COUNTER, "",
    "Collective and point-to-point ops the rank enqueued, by op (all_reduce, broadcast, send, ...), "
    "counted once each as dumps reveal them.", (*PG, "op"))
COLLECTIVE_BYTES = _m(
    "goodput_collective_bytes_total", Kind.COUNTER, "bytes",
    "Bytes of the rank's ops as they are enqueued: the larger of each op's input and output buffers "
    "(tensor sizes times dtype width), by op; an op with a dtype of unknown width adds 0.",
    (*PG, "op"))
COLLECTIVE_DURATION = _m(
    "goodput_collective_duration_seconds", Kind.HISTOGRAM, "seconds",
    "Duration of each completed op as timed by the backend (NCCL with TORCH_NCCL_ENABLE_TIMING=1; "
    "gloo records none).", (*PG, "op"), COLLECTIVE_BUCKETS)
COLLECTIVE_MISSING_RANK = _m(
    "goodput_collective_missing_rank", Kind.GAUGE, "",
    "1 for each rank that has not enqueued the oldest unfinished collective (seq, op) of the process "
    "group while other ranks on this node wait in it; only ranks whose dumps are on this node are "
    "checked.", ("workload", "pg", "rank", "seq", "op"))
FR_DUMP_TIMESTAMP = _m(
    "goodput_flight_recorder_dump_timestamp_seconds", Kind.GAUGE, "seconds",
    "Unix time the rank's dump file was last written; its age is time() minus this.", FR)
FR_ENTRIES_LOST = _m(
    "goodput_flight_recorder_entries_lost_total", Kind.COUNTER, "",
    "Entries that left the rank's ring buffer between two dumps before the exporter saw them (dump "
    "more often, or raise TORCH_FR_BUFFER_SIZE).", FR)
FR_FILES = _m(
    "goodput_flight_recorder_files", Kind.GAUGE, "",
    "Dump files the flight source currently reads.", ())
FR_REJECTED = _m(
    "goodput_flight_recorder_rejected_total", Kind.COUNTER, "",
    "Dump files rejected, each version of a file counted once, by reason: empty, truncated, corrupt, "
    "unsafe (a pickle asking to run code), bad_schema, unknown_version, too_large (on disk, or for the "
    "parser's own memory limit), parser_died (the parser process was killed while reading it, on every "
    "try), symlink (a symbolic link in flight.dir or a workload folder: never followed), not_regular (a "
    "FIFO, socket, device or directory), unreadable (permission denied, ...), bad_name, duplicate_rank (a "
    "second file for one rank), too_many_files (over flight.max_files), too_many_series (read, but its "
    "series do not fit in flight.max_series).", ("reason",))
FR_SERIES = _m(
    "goodput_flight_recorder_series", Kind.GAUGE, "",
    "Series the flight source exports now, its own included; at most flight.max_series (a histogram counts "
    "as its buckets, sum and count).", ())
FR_WITHHELD_FILES = _m(
    "goodput_flight_recorder_withheld_files", Kind.GAUGE, "",
    "Dump files read but not exported now because their series would pass flight.max_series (the most "
    "recently written are exported first); above 0, the cap is hit.", ())
FR_PARSER_DEATHS = _m(
    "goodput_flight_recorder_parser_deaths_total", Kind.COUNTER, "",
    "Times the parser process died while reading a dump without replying (killed by a signal: the OOM "
    "killer, which takes it first, or a kill -9), or could not be started for it. The dump is read again "
    "later; after every try fails it is rejected as parser_died.", ())

METRICS = _m.metrics
