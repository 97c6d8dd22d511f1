"""The flight source reads nothing outside flight.dir: no symbolic link is followed, not even one swapped in
between the listing and the open, and a flight.dir that is itself a symbolic link is refused unless
flight.follow_dir_symlink says so. The out-of-tree file in each test is a valid dump carrying a unique
marker as a process group's description, so it would show on /metrics as a `desc` label if it were ever
read (each test shows that it would, as its control)."""

from __future__ import annotations

import ctypes
import os
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import live_server, quick_config, value
from flight_helpers import DUMPS, copy_scenario, nccl_dump, nccl_entry, render, source_for, write_dump

from exporter.sources.base import SourceError

GOOD = (DUMPS / "healthy2" / "nccl_trace_rank_0").read_bytes()  # written by PyTorch's own flight recorder
DUMP_NAME = "nccl_trace_rank_0"
SWAPS = 1_000
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _secret(root: Path) -> tuple[str, Path]:
    """A root-only dump outside flight.dir, whose one process group is described by a unique marker."""
    marker = f"secret-{uuid.uuid4().hex}"
    path = root / "outside" / "job" / DUMP_NAME
    write_dump(path, nccl_dump([nccl_entry(0, 1, pg=("0", marker))], {"0": (1, 1, 1)},
                               groups={"0": (marker, [0, 1])}), time.time())
    path.chmod(0o600)
    return marker, path


def _exchange(a: Path, b: Path) -> None:
    """Swap two names atomically (renameat2 RENAME_EXCHANGE): each always names something."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno), str(a))


def _fresh_dump(folder: Path) -> None:
    """A new version (a new inode) of the folder's good dump, put in place by a rename as writers do."""
    partial = folder / f".{DUMP_NAME}.partial"
    partial.write_bytes(GOOD)
    os.replace(partial, folder / DUMP_NAME)


class Swapper(threading.Thread):
    """Swaps `kind` ("file", "folder" or "dir": flight.dir itself) between the real thing and a symbolic link
    to the out-of-tree dump (or its folder), until stopped; each real version is a fresh file."""

    def __init__(self, kind: str, flight: Path, secret: Path) -> None:
        super().__init__(daemon=True)
        self.kind, self.flight, self.secret = kind, flight, secret
        self.swaps = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self._swap()
                self.swaps += 1
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _swap(self) -> None:
        folder = self.flight / "job"
        if self.kind == "file":  # job/nccl_trace_rank_0: a fresh real dump, then a fresh link, by renames
            if self.swaps % 2 == 0:
                _fresh_dump(folder)
            else:
                link = folder / ".link"
                link.symlink_to(self.secret)
                os.replace(link, folder / DUMP_NAME)
        elif self.kind == "folder":  # job/: the real folder and a link to the secret's folder trade names
            real = folder if self.swaps % 2 == 0 else self.flight / ".job-link"
            _fresh_dump(real)
            _exchange(folder, self.flight / ".job-link")
        else:  # flight.dir itself and a link to the secret's flight.dir trade names
            real = self.flight if self.swaps % 2 == 0 else self.flight.with_name("flight-link")
            _fresh_dump(real / "job")
            _exchange(self.flight, self.flight.with_name("flight-link"))


def _setup(tmp_path: Path, kind: str) -> tuple[str, Path, Path]:
    marker, secret = _secret(tmp_path)
    flight = tmp_path / "flight"
    copy_scenario("healthy2", flight, "job")
    if kind == "folder":
        (flight / ".job-link").symlink_to(secret.parent, target_is_directory=True)
    elif kind == "dir":
        flight.with_name("flight-link").symlink_to(secret.parent.parent, target_is_directory=True)
    return marker, secret, flight


@pytest.mark.parametrize("kind", ["file", "folder", "dir"])
def test_a_symlink_swapped_in_during_scans_never_leaks_a_byte(kind: str, tmp_path: Path) -> None:
    marker, secret, flight = _setup(tmp_path, kind)
    source = source_for(flight)
    swapper = Swapper(kind, flight, secret)
    passes = refused = read = 0
    swapper.start()
    deadline = time.monotonic() + 120
    try:
        while (swapper.swaps < SWAPS or passes < SWAPS) and time.monotonic() < deadline and swapper.is_alive():
            try:
                text = render(source)
            except SourceError as exc:  # flight.dir was a link at that instant (or at each of a few tries)
                assert exc.reason == "dir_symlink" or "keeps changing" in str(exc), exc
                refused += 1
            else:
                assert marker not in text
                assert "outside" not in text
                read += bool(value(text, "goodput_collective_operations_total", workload="job", rank="0",
                                   pg="0", op="all_reduce"))
                refused += bool(value(text, "goodput_flight_recorder_rejected_total", reason="symlink"))
            passes += 1
    finally:
        swapper.stop.set()
        swapper.join(10)
        source.close()
    assert swapper.error is None, swapper.error
    assert swapper.swaps >= SWAPS and passes >= SWAPS, (swapper.swaps, passes)
    assert read and refused  # both sides of the swap were met, many times over
    # the control: the same file, once it really is in flight.dir, is read and shows its marker
    if flight.is_symlink():
        _exchange(flight, flight.with_name("flight-link"))
    if (flight / "job").is_symlink():
        _exchange(flight / "job", flight / ".job-link")
    os.replace(secret, flight / "job" / DUMP_NAME)
    control = source_for(flight)
    assert marker in render(control)
    control.close()


def test_a_symlinked_workload_folder_or_dump_is_refused_for_what_it_is(tmp_path: Path) -> None:
    marker, secret = _secret(tmp_path)
    flight = tmp_path / "flight"
    copy_scenario("healthy2", flight, "job")
    (flight / "linked").symlink_to(secret.parent, target_is_directory=True)  # a whole workload folder
    (flight / DUMP_NAME).symlink_to(secret)  # workload "default"
    (flight / "job" / "nccl_trace_rank_7").symlink_to(secret)
    source = source_for(flight)
    for _ in range(3):
        text = render(source)
    assert marker not in text
    assert value(text, "goodput_flight_recorder_rejected_total", reason="symlink") == 3
    assert value(text, "goodput_flight_recorder_rejected_total", reason="bad_name") == 0  # not mistaken for one
    assert value(text, "goodput_collective_operations_total", workload="job", rank="1", op="all_reduce") == 4
    source.close()


def test_flight_dir_replaced_by_a_symlink_is_refused_by_the_daemon(tmp_path: Path) -> None:
    marker, secret = _secret(tmp_path)
    flight = tmp_path / "flight"
    copy_scenario("healthy2", flight, "job")
    with live_server(quick_config(flight={"dir": str(flight)})) as live:
        live.metrics_when("goodput_collective_operations_total", 4, workload="job", rank="0", op="all_reduce")
        flight.rename(tmp_path / "flight-old")  # its parent is writable: someone puts a link in its place
        flight.symlink_to(secret.parent.parent, target_is_directory=True)
        text = live.metrics_when("goodput_exporter_source_errors_total", 1, source="flight", reason="dir_symlink")
        assert value(text, "goodput_exporter_source_up", source="flight") == 0
        for _ in range(20):  # a couple of seconds of collections at 100 ms
            assert marker not in live.metrics()
            time.sleep(0.1)
    # the control, and the way to allow it: with flight.follow_dir_symlink the link is read
    with live_server(quick_config(flight={"dir": str(flight), "follow_dir_symlink": True})) as live:
        live.metrics_when("goodput_collective_group_info", 1, workload="job", rank="0", pg="0", desc=marker)
        # waited for, not read once: a collection can fall between one scrape's self-metrics refresh and its render
        live.metrics_when("goodput_exporter_source_up", 1, source="flight")


def test_a_flight_dir_that_is_not_a_directory_says_what_it_is(tmp_path: Path) -> None:
    fifo = tmp_path / "flight"
    os.mkfifo(fifo)
    source = source_for(fifo)
    with pytest.raises(SourceError) as info:
        source.collect()
    assert info.value.reason == "dir_unreadable"
    assert "FIFO" in str(info.value)
    source.close()
