"""The flight source on real NCCL dumps: NVIDIA nvidia-resiliency-ext's 16-rank Megatron-LM hangs with faults injected
on known ranks (tests/flight/nvrx, PROVENANCE.md there).

What the source reports is checked against what the dumps say, worked out here without the source's own analysis:
each rank's pg_status tied to its process groups, and, per group, which member ranks have not enqueued the
collective that another member waits in."""

from __future__ import annotations

import os
import re
import shutil
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, samples
from flight_helpers import render, source_for

from exporter.sources.flight.load import load_bytes

NVRX = ROOT / "tests" / "flight" / "nvrx"
SCENARIOS = ("gpu_error_1st", "gpu_error_2nd", "lock_gil_1st", "lock_gil_2nd")
RANKS = range(16)
TIMEOUT_S = 180.0  # every entry's timeout_ms: the watchdog dumped this long into the hang
WIDTH = {"Byte": 1, "BFloat16": 2, "Float": 4, "Long": 8}  # the dtypes these dumps hold


@cache
def raw(scenario: str) -> dict[int, dict[str, Any]]:
    """Each rank's dump as plain data (the safe loader: no global is ever looked up)."""
    return {rank: load_bytes((NVRX / scenario / f"comm_lib_trace_rank_{rank}").read_bytes())[1] for rank in RANKS}


def faulty(scenario: str) -> set[int]:
    """The ranks fault_injection.log says were made faulty."""
    log = (NVRX / scenario / "fault_injection.log").read_text()
    match = re.search(r"Fault ranks: \[([\d, ]+)\]", log)
    assert match is not None, log
    return {int(r) for r in match.group(1).split(",")}


def written(scenario: str) -> float:
    """Git keeps no write times: date every dump the watchdog's timeout after the scenario's newest entry."""
    newest = max(e["time_created_ns"] for dump in raw(scenario).values() for e in dump["entries"])
    return newest / 1e9 + TIMEOUT_S


def copy_nvrx(scenario: str, root: Path) -> Path:
    target = root / scenario
    target.mkdir(parents=True)
    when = written(scenario)
    for rank in RANKS:
        name = f"comm_lib_trace_rank_{rank}"
        shutil.copyfile(NVRX / scenario / name, target / name)
        os.utime(target / name, (when, when))
    return target


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each scenario's dumps read by the real flight source (its parser process included), as /metrics text."""
    texts = {}
    for scenario in SCENARIOS:
        root = tmp_path_factory.mktemp(scenario)
        copy_nvrx(scenario, root)
        source = source_for(root)
        try:
            texts[scenario] = render(source)
        finally:
            source.close()
    return texts


parsed = cache(samples)  # each scenario's text is looked into hundreds of times


def found(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of each series of `name` that has `labels`."""
    wanted = set(labels.items())
    return [(dict(ls), v) for (n, ls), v in parsed(text).items() if n == name and wanted <= ls]


def value(text: str, name: str, **labels: str) -> float | None:
    """The value of the one series of `name` with `labels`; None when there is none."""
    matches = found(text, name, **labels)
    assert len(matches) <= 1, (name, labels)
    return matches[0][1] if matches else None


def ranks_of(text: str) -> list[int]:
    return [int(r) for r in re.findall(r"\d+", text)]


def membership(scenario: str) -> dict[str, tuple[str, list[int]]]:
    """Group name -> (Megatron's description, member ranks), from every rank's pg_config."""
    groups: dict[str, tuple[str, list[int]]] = {}
    for dump in raw(scenario).values():
        for name, config in dump["pg_config"].items():
            assert groups.setdefault(name, (config["desc"], ranks_of(config["ranks"]))) == (
                config["desc"], ranks_of(config["ranks"]))  # every member records a group alike
    return groups


def status_names(dump: dict[str, Any]) -> dict[str, str]:
    """pg_status key (the rank's own pg_id) -> group name. An entry ties its pg_id to its group; a group with no entry
    in the dump is tied by order: the rank creates its groups in one order, numbering pg_ids and names alike (checked
    against every tie the entries give)."""
    by_order = dict(zip(sorted(dump["pg_status"], key=int), sorted(dump["pg_config"], key=int), strict=True))
    by_entry = {str(e["pg_id"]): e["process_group"][0] for e in dump["entries"]}
    assert by_entry.items() <= by_order.items()
    return by_order


def progress(scenario: str) -> dict[tuple[str, int], tuple[int, int]]:
    """(group, rank) -> (last enqueued, last completed) as the rank's pg_status says."""
    out = {}
    for rank, dump in raw(scenario).items():
        names = status_names(dump)
        for pg_id, status in dump["pg_status"].items():
            out[(names[pg_id], rank)] = (status["last_enqueued_collective"], status["last_completed_collective"])
    return out


def p2p_groups(scenario: str) -> set[str]:
    """Groups with point-to-point ops: their pg_status counts those too (see test_pg_status_counts_the_newest_op)."""
    return {e["process_group"][0] for dump in raw(scenario).values() for e in dump["entries"] if e["is_p2p"]}


def truth(scenario: str) -> set[tuple[str, int, int]]:
    """(group, rank, seq): `rank` has not enqueued collective `seq` of the group, which another member waits in (its
    oldest unfinished one). Groups with point-to-point ops are left out: their pg_status numbers mix the two
    sequences, and no member waits in a collective there (test_no_one_waits_in_a_collective_of_a_p2p_group)."""
    seqs = progress(scenario)
    found = set()
    for name, (_, members) in membership(scenario).items():
        if name in p2p_groups(scenario):
            continue
        for waiter in members:
            enqueued, completed = seqs[(name, waiter)]
            if enqueued > completed:
                found |= {(name, r, completed + 1) for r in members if seqs[(name, r)][0] < completed + 1}
    return found


def op_of(profiling_name: str) -> str:
    """`nccl:_all_gather_base` -> all_gather_base, `nccl:send 0->3` -> send."""
    return profiling_name.removeprefix("nccl:").split(" ")[0].strip("_")


# What goodput_collective_missing_rank names, worked out by hand from the dumps (and by truth() below):
# {group: (rank, seq, op)}. The groups are the faulty ranks' TP, TP+DP, TP+CP, EP and ETP groups.
MISSING = {
    "gpu_error_1st": {"41": (12, 42818, "reduce_scatter_base"), "58": (12, 6872, "all_reduce"),
                      "69": (12, 3456, "all_reduce"), "74": (12, 20537, "all_to_all"),
                      "94": (12, 3430, "all_gather_base")},
    "gpu_error_2nd": {"37": (9, 87761, "reduce_scatter_base"), "38": (14, 87761, "reduce_scatter_base"),
                      "64": ({9, 14}, 14960, "all_reduce"), "69": (9, 7503, "all_reduce"),
                      "70": (14, 7503, "all_reduce"), "72": ({9, 14}, 44791, "all_to_all"),
                      "90": ({9, 14}, 7474, "all_gather_base")},
    "lock_gil_1st": {"37": (9, 88684, "reduce_scatter_base"), "38": (14, 88684, "reduce_scatter_base"),
                     "64": ({9, 14}, 15118, "all_reduce"), "72": ({9, 14}, 45265, "all_to_all")},
    "lock_gil_2nd": {"40": (10, 31443, "reduce_scatter_base"), "42": (15, 43672, "reduce_scatter_base"),
                     "57": (10, 7010, "all_reduce"), "58": (15, 7010, "all_reduce"),
                     "68": (10, 3527, "all_reduce"), "70": (15, 3526, "all_reduce"),
                     "73": (10, 20947, "all_to_all"), "74": (15, 20947, "all_to_all"),
                     "93": (10, 3500, "all_gather_base"), "94": (15, 3499, "all_gather_base")},
}


def expected_missing(scenario: str) -> set[tuple[str, int, int, str]]:
    out = set()
    for pg, (ranks, seq, op) in MISSING[scenario].items():
        for rank in ranks if isinstance(ranks, set) else {ranks}:
            out.add((pg, rank, seq, op))
    return out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_dump_is_read_with_its_megatron_groups(scenario: str, scraped: dict[str, str]) -> None:
    text = scraped[scenario]
    assert value(text, "goodput_flight_recorder_files") == 16
    assert sum(v for _, v in found(text, "goodput_flight_recorder_rejected_total")) == 0
    for rank, dump in raw(scenario).items():
        assert dump["version"] == "2.9" and dump["nccl_version"] == "2.27.3"
        labels = {"workload": scenario, "rank": str(rank)}
        assert value(text, "goodput_flight_recorder_dump_timestamp_seconds", **labels) == written(scenario)
        # every group of pg_config, by its name, with Megatron's description of it
        shown = {(s["pg"], s["desc"]) for s, _ in found(text, "goodput_collective_group_info", **labels)}
        assert shown == {(name, config["desc"]) for name, config in dump["pg_config"].items()}
    descs = {desc for _, (desc, _) in membership(scenario).items()}
    assert {"default_pg", "TENSOR_MODEL_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP", "DATA_PARALLEL_GROUP_WITH_CP",
            "EXPERT_MODEL_PARALLEL_GROUP", "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP"} <= descs


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_in_flight_ops_bytes_and_progress_per_group(scenario: str, scraped: dict[str, str]) -> None:
    """Every entry of these dumps is still in flight ("scheduled"): each one counts as in flight and as an op."""
    text = scraped[scenario]
    seqs = progress(scenario)
    for rank, dump in raw(scenario).items():
        labels = {"workload": scenario, "rank": str(rank)}
        entries = dump["entries"]
        assert all(e["state"] == "scheduled" and not e["retired"] and "duration_ms" not in e for e in entries)
        per_group = Counter(e["process_group"][0] for e in entries)
        for name in dump["pg_config"]:
            pg = {**labels, "pg": name}
            assert value(text, "goodput_collective_inflight", **pg) == per_group[name]
            if per_group[name]:  # pg_status tied to the group by its entries' pg_id
                oldest = min(e["time_created_ns"] for e in entries if e["process_group"][0] == name) / 1e9
                assert value(text, "goodput_collective_oldest_inflight_seconds", **pg) == pytest.approx(
                    written(scenario) - oldest, abs=1e-3)
                enqueued, completed = seqs[(name, rank)]
                assert value(text, "goodput_collective_last_seq", state="enqueued", **pg) == enqueued
                assert value(text, "goodput_collective_last_seq", state="completed", **pg) == completed
                assert value(text, "goodput_collective_last_seq", state="started", **pg) is None  # -1: not tracked
        ops: Counter[tuple[str, str]] = Counter()
        sizes: Counter[tuple[str, str]] = Counter()
        for e in entries:
            key = (e["process_group"][0], op_of(e["profiling_name"]))
            ops[key] += 1
            sizes[key] += max(sum(WIDTH[t] * _numel(s) for s, t in zip(e[f"{d}_sizes"], e[f"{d}_dtypes"], strict=True))
                              for d in ("input", "output"))
        shown = {(s["pg"], s["op"]): v for s, v in found(text, "goodput_collective_operations_total", **labels)}
        assert shown == dict(ops)
        for (pg, op), size in sizes.items():
            assert value(text, "goodput_collective_bytes_total", pg=pg, op=op, **labels) == size
    # point-to-point ops by their real names: "nccl:send 0->3" (group ranks) is a send of the pipeline group
    first = raw(scenario)[0]["entries"]
    p2p = [e for e in first if e["is_p2p"]]
    assert p2p and all(re.fullmatch(r"nccl:(send \d+->\d+|recv \d+<-\d+)", e["profiling_name"]) for e in p2p)
    pipeline = {s["op"] for s, _ in found(text, "goodput_collective_operations_total", workload=scenario, rank="0",
                                       pg=p2p[0]["process_group"][0])}
    assert pipeline <= {"send", "recv"} and pipeline


def _numel(shape: list[int]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_missing_ranks_are_what_the_dumps_say(scenario: str, scraped: dict[str, str]) -> None:
    named = {(s["pg"], int(s["rank"]), int(s["seq"]), s["op"])
             for s, _ in found(scraped[scenario], "goodput_collective_missing_rank", workload=scenario)}
    assert named == expected_missing(scenario)
    assert {(pg, rank, seq) for pg, rank, seq, _ in named} == truth(scenario)
    for pg, _, _, _ in named:  # the faulty ranks' own groups, by Megatron's names
        assert membership(scenario)[pg][0] in {
            "TENSOR_MODEL_PARALLEL_GROUP", "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP",
            "TENSOR_AND_CONTEXT_PARALLEL_GROUP", "EXPERT_MODEL_PARALLEL_GROUP",
            "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP"}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_named_ranks_against_the_injected_faults(scenario: str, scraped: dict[str, str]) -> None:
    named = {int(s["rank"]) for s, _ in found(scraped[scenario], "goodput_collective_missing_rank")}
    assert named <= faulty(scenario)  # nobody healthy is accused
    if scenario != "gpu_error_1st":
        assert named == faulty(scenario)
        return
    # gpu_error_1st: rank 12 is named, rank 14 (GPU_ERROR too) is not, and cannot be by this check: it enqueued every
    # collective its peers did. Its fault shows in its completions instead: on each of its groups its last completed
    # collective is behind another member's, and that member cannot have completed a collective without it.
    assert named == {12}
    seqs = progress(scenario)
    for name, (_, members) in membership(scenario).items():
        if 14 not in members or name in p2p_groups(scenario) or len(members) < 2:
            continue
        enqueued, completed = seqs[(name, 14)]
        assert enqueued >= max(seqs[(name, r)][0] for r in members if r != 12)
        if enqueued > completed:
            assert completed < max(seqs[(name, r)][1] for r in members), name


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pg_status_counts_the_newest_op_collective_or_p2p(scenario: str) -> None:
    """PyTorch's pg_status holds the sequence number of the group's newest op, the p2p one for a send or a recv: on a
    pipeline group its numbers are p2p counts, which differ between stages by design (not a collective sequence to
    compare across ranks)."""
    for dump in raw(scenario).values():
        newest: dict[str, dict[str, Any]] = {}
        for e in dump["entries"]:
            if e["record_id"] > newest.get(e["process_group"][0], {"record_id": -1})["record_id"]:
                newest[e["process_group"][0]] = e
        for e in newest.values():
            enqueued = dump["pg_status"][str(e["pg_id"])]["last_enqueued_collective"]
            assert enqueued == (e["p2p_seq_id"] if e["is_p2p"] else e["collective_seq_id"])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_one_waits_in_a_collective_of_a_p2p_group(scenario: str, scraped: dict[str, str]) -> None:
    """The pipeline groups (and default_pg, which the TP4 x PP2 runs send over) hold only sends and recvs in flight,
    and each member's entries carry one collective sequence number: nobody is missing from a collective there."""
    for name in p2p_groups(scenario):
        entries = [e for dump in raw(scenario).values() for e in dump["entries"] if e["process_group"][0] == name]
        assert all(e["is_p2p"] for e in entries)
        assert len({e["collective_seq_id"] for e in entries}) == 1
    named = {s["pg"] for s, _ in found(scraped[scenario], "goodput_collective_missing_rank")}
    assert not named & p2p_groups(scenario)
