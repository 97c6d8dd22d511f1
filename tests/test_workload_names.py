"""One name per workload, whatever reports it (issue 22): the client writes a workload's flight-recorder folder
reversibly (goodput_client.workload_folder) and the flight source reads it back as the same name; folder names that
are not UTF-8 keep their bytes apart; every body parses with prometheus-client's OpenMetrics parser.

The end-to-end case, a real torchrun job whose ingest and flight series share `workload`, is in tests/test_client.py
(test_a_torchrun_job_named_by_its_master_address_has_one_workload_in_both_sources)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import check_openmetrics, series
from flight_helpers import copy_scenario, render, source_for
from goodput_client import workload_folder
from goodput_client.contract import WORKLOAD_PATTERN, workload_from_folder
from hypothesis import given
from hypothesis import strategies as st

from exporter.core.exposition import OPENMETRICS, Renderer, join


@given(st.from_regex(WORKLOAD_PATTERN, fullmatch=True))
def test_every_workload_name_round_trips_through_its_folder(workload: str) -> None:
    folder = workload_folder(workload)
    assert "/" not in folder and folder not in (".", "..") and not folder.startswith(".")
    assert workload_from_folder(folder) == workload


@pytest.mark.parametrize(("workload", "folder"), [
    ("node-7/localhost:29500", "node-7%2Flocalhost%3A29500"), ("run-42", "run-42"), ("a_b.c-d", "a_b.c-d")])
def test_the_folders_of_known_names(workload: str, folder: str) -> None:
    assert workload_folder(workload) == folder


def _flight_workloads(directory: Path) -> tuple[set[str], str]:
    source = source_for(directory, rank_missing_after="1h")
    try:
        text = render(source)
        body = join([Renderer().render(source.collect(), OPENMETRICS)], OPENMETRICS).decode()
    finally:
        source.close()
    return {s["workload"] for s in series(text, "goodput_collective_operations_total")}, body


def test_a_clients_folder_reads_back_as_its_workload(tmp_path: Path) -> None:
    copy_scenario("healthy2", tmp_path, workload_folder("node-7/localhost:29500"))
    workloads, body = _flight_workloads(tmp_path)
    assert workloads == {"node-7/localhost:29500"}
    check_openmetrics(body)


def test_folders_differing_only_in_bytes_that_are_not_utf8_stay_apart(tmp_path: Path) -> None:
    for raw in (b"bad\xffutf8", b"bad\xfeutf8"):
        copy_scenario("healthy2", tmp_path, os.fsdecode(raw))
    copy_scenario("healthy2", tmp_path, "ctl\x1b[0m\tname")  # control characters in a folder's name
    workloads, body = _flight_workloads(tmp_path)
    assert workloads == {"bad%FFutf8", "bad%FEutf8", "ctl\x1b[0m\tname"}
    check_openmetrics(body)  # parses, and no series twice
