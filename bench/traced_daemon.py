"""The daemon under tracemalloc, for bench/soak.py --tracemalloc: `python bench/traced_daemon.py DIR serve ...`.

Runs `goodput-exporter` with tracemalloc on (10 frames a trace) and, whenever a file `DIR/take-NAME` appears,
writes the snapshot `DIR/NAME.snap` and removes the request. Bench-only: the daemon itself carries no such hook.
"""

from __future__ import annotations

import sys
import threading
import time
import tracemalloc
from pathlib import Path


def _watch(folder: Path) -> None:
    while True:
        for request in sorted(folder.glob("take-*")):
            name = request.name.removeprefix("take-")
            snapshot = tracemalloc.take_snapshot()
            snapshot.dump(str(folder / f"{name}.snap"))
            request.unlink()
        time.sleep(1.0)


if __name__ == "__main__":
    tracemalloc.start(10)
    folder = Path(sys.argv[1])
    threading.Thread(target=_watch, args=(folder,), name="tracemalloc", daemon=True).start()
    from exporter.cli import main

    sys.argv = ["goodput-exporter", *sys.argv[2:]]
    sys.exit(main())
