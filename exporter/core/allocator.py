"""The C allocator's settings for a daemon that runs for weeks (glibc; elsewhere nothing is changed).

The daemon allocates and frees large blocks all the time: each /metrics page and each source's batch is rendered
anew (about 1.5 MB at 15,000 series), beside long-lived objects, from a dozen threads. glibc's defaults suit that
badly: its mmap threshold rises to the largest block freed, so after the first page every page comes from the heap,
where freed blocks fragment it; and each thread may get an arena of its own (up to 8 per core). Under an hour of
workload churn the daemon's Python objects stayed flat while its RSS grew (bench/soak.py). So, once at start:

- M_MMAP_THRESHOLD fixed at 256 KiB: pages and batches are mapped and unmapped whole, never left in the heap;
- M_ARENA_MAX 2: the threads share two arenas (they hold the GIL to allocate Python objects anyway);

and a thread (`trim_every`) calls malloc_trim every TRIM_SECONDS to hand the heap's free pages back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
M_ARENA_MAX = -8
MMAP_THRESHOLD = 256 * 1024
ARENA_MAX = 2
TRIM_SECONDS = 60.0


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None  # musl has neither


def tune() -> bool:
    """Set the thresholds above; False where the C library is not glibc (nothing changed)."""
    libc = _libc()
    if libc is None:
        log.debug("allocator: not glibc, left as it is")
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_ARENA_MAX, ARENA_MAX) == 1
    if not ok:
        log.warning("allocator: glibc refused the daemon's malloc settings; its defaults stay")
    return ok


def trim_every(seconds: float, stop: threading.Event) -> threading.Thread | None:
    """A thread that trims the heap every `seconds` until `stop` is set; None where the C library is not glibc."""
    libc = _libc()
    if libc is None:
        return None

    def loop() -> None:
        while not stop.wait(seconds):
            libc.malloc_trim(0)

    thread = threading.Thread(target=loop, name="malloc-trim", daemon=True)
    thread.start()
    return thread
