"""Dumps are parsed in a separate, memory-limited process, never in the daemon itself.

The restricted unpickler cannot run code, but CPython's C unpickler can still be made to allocate
memory out of all proportion to a file (a 9-byte pickle asks for a 32 GiB memo table: CPython
gh-115952, fixed only in late releases), and a crafted dump can make any parser spin. In the worker
such a file exhausts only the worker: its address space is capped (RLIMIT_AS), it volunteers first
for the OOM killer, a parse that runs past its time is killed, and a dead worker is restarted for the
next file. The daemon keeps serving.

Two endings are told apart. The worker that reaches its own memory limit says so itself (a MemoryError
caught in `_serve`): the file is too_large. A worker that dies without a word (SIGKILL from the OOM
killer, which it volunteers for, under memory pressure from anything on the node) says nothing about
the file: `ParserDied` is raised, and the source tries the file again later (source.PARSER_TRIES).

The worker also does the counting (`accounting.summarize`): what crosses back is a small summary,
as plain tuples and dicts through `marshal`, not the 2,000 entries of a dump.
"""

from __future__ import annotations

import logging
import marshal
import os
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from typing import Any

from .accounting import Prior, Summary, summarize
from .load import Rejected
from .read import read_dump
from .schema import Entry, Group

log = logging.getLogger(__name__)

MEMORY_BASE = 512 * 2**20  # the worker's own interpreter and modules, with room to spare
MEMORY_PER_FILE_BYTE = 16  # parsed dumps take a few times their file size; this leaves margin


def memory_limit(max_file_bytes: int) -> int:
    return MEMORY_BASE + MEMORY_PER_FILE_BYTE * max_file_bytes


def _entry(e: Entry) -> tuple[Any, ...]:
    return (e.record_id, e.pg, e.seq, e.is_p2p, e.op, e.created_ns, e.finished, e.duration_s, e.bytes, e.inflight)


def _group(g: Group) -> tuple[Any, ...]:
    return (g.name, g.desc, None if g.ranks is None else tuple(g.ranks), g.enqueued, g.started, g.completed)


def encode(summary: Summary) -> tuple[Any, ...]:
    return (summary.version, tuple(map(_group, summary.groups.values())), tuple(map(_entry, summary.inflight)),
            summary.restarted, summary.ops, summary.bytes, summary.durations, summary.duration_sums, summary.lost,
            (summary.prior.counted_to, summary.prior.last_seen, summary.prior.timed))


def decode(payload: tuple[Any, ...]) -> Summary:
    version, groups, inflight, restarted, ops, sizes, durations, sums, lost, prior = payload
    counted_to, last_seen, timed = prior
    return Summary(
        version,
        {name: Group(name, desc, None if ranks is None else frozenset(ranks), enq, started, completed)
         for name, desc, ranks, enq, started, completed in groups},
        [Entry(*fields) for fields in inflight], restarted, ops, sizes, durations, sums, lost,
        Prior(counted_to, None if last_seen is None else tuple(last_seen), frozenset(timed)))  # type: ignore[arg-type]


def _serve(conn: Connection, limit: int) -> None:
    """The worker's loop: (prior, dump bytes) in; ("ok", summary) or ("rejected", reason, message) out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the daemon; the worker ends with its pipe
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        with open("/proc/self/oom_score_adj", "w") as handle:  # the OOM killer takes the worker first
            handle.write("1000")
    except (ImportError, OSError, ValueError):
        pass
    while True:
        try:
            counted_to, last_seen, timed = marshal.loads(conn.recv_bytes())
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the daemon went away
        fatal = False
        try:
            prior = Prior(counted_to, None if last_seen is None else tuple(last_seen), frozenset(timed))
            reply: tuple[Any, ...] = ("ok", encode(summarize(read_dump(data), prior)))
        except Rejected as exc:
            reply = ("rejected", exc.reason, str(exc))
        except MemoryError:
            reply = ("rejected", "too_large", f"parsing it needs more than the parser's {limit // 2**20} MiB")
            fatal = True  # start afresh rather than go on in a process that ran out of memory
        except Exception as exc:  # anything else a hostile file provokes is still just a bad file
            reply = ("rejected", "corrupt", f"the parser failed: {exc.__class__.__name__}")
        del data
        conn.send_bytes(marshal.dumps(reply))
        if fatal:
            return


class ParserDied(Exception):
    """The worker died without replying (killed by a signal, or it exited), or could not be started: nothing
    is known of the file."""


def _ending(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class ParseWorker:
    """The daemon's side: one worker process, started on first use and restarted when it dies.

    The worker is a fresh `python -m exporter.sources.flight.worker` talking over an inherited socket pair:
    unlike multiprocessing's spawn it never re-imports the daemon's (or a user script's) main module."""

    def __init__(self, max_file_bytes: int, timeout: float) -> None:
        self.limit = memory_limit(max_file_bytes)
        self.timeout = timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self.restarts = 0
        self.parsing: int | None = None  # the worker's pid while it holds a dump (the daemon waits on it)

    def _start(self) -> Connection:
        if self._conn is not None and self._process is not None and self._process.poll() is None:
            return self._conn
        if self._process is not None:
            self.restarts += 1
            self._stop()
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "exporter.sources.flight.worker", str(theirs.fileno()), str(self.limit)],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, close_fds=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
        finally:
            theirs.close()
        self._process, self._conn = process, Connection(ours.detach())
        return self._conn

    def summarize(self, data: bytes, prior: Prior) -> Summary:
        """Parse and count one dump in the worker. Raises Rejected for a bad file, whatever it did to the
        worker, and ParserDied when the worker died without a reply (the file may be fine)."""
        try:
            conn = self._start()
        except OSError as exc:  # fork or exec failing, under memory pressure too: the file is not at fault
            raise ParserDied(f"the parser process could not start ({exc.strerror or exc})") from None
        self.parsing = self._process.pid if self._process is not None else None
        try:
            conn.send_bytes(marshal.dumps((prior.counted_to, prior.last_seen, prior.timed)))
            conn.send_bytes(data)
            if not conn.poll(self.timeout):
                self._stop()
                raise Rejected("corrupt", f"parsing it took longer than {self.timeout:g}s; the parser was stopped")
            reply = marshal.loads(conn.recv_bytes())
        except (EOFError, OSError, ValueError, TypeError):
            self._stop()
            code = self._process.returncode if self._process is not None else None
            raise ParserDied(f"the parser process died while reading it ({_ending(code)})") from None
        finally:
            self.parsing = None
        if reply[0] == "ok":
            return decode(reply[1])
        if reply[1] == "too_large":
            self._stop()
        raise Rejected(reply[1], reply[2])

    def _stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                log.warning("flight: the parser process %d did not exit", self._process.pid)
        self._conn = None

    def close(self) -> None:
        self._stop()
        self._process = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.poll() is None else None


if __name__ == "__main__":  # the worker process: python -m exporter.sources.flight.worker FD LIMIT
    _serve(Connection(int(sys.argv[1])), int(sys.argv[2]))
