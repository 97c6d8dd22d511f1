"""The NVML source on a real driver: NVML calls per GPU per second, by call, and CPU per collection.

Runs the nvml source's own code (exporter/sources/nvml/source.py over library.py, nvidia-ml-py against the driver's
libnvidia-ml.so.1) in this process, collecting at the source's default intervals for --seconds (default 60), with no
daemon and no HTTP. Counts each call twice:

* at the source's backend interface, as goodput_exporter_library_calls_total counts them (one per NVML function the
  source asks for);
* at the C boundary, every libnvidia-ml function call pynvml makes (its wrappers call some functions twice: once for
  the size of the answer, once for the answer).

Then, once per GPU, it asks for fields that could replace calls side by side with those calls (`probe`): the
violation counters' fields against nvmlDeviceGetViolationStatus, the NVLink error totals against the links' counters
summed; the JSON keeps both answers.

CPU per collection is the collecting thread's CPU time (user and system: the driver's ioctls included) around each
collection, as the daemon's source thread spends it.

Run from the repository's root on a GPU node:

    python3 bench/nvml_real.py --out DIR [--seconds 60]

It writes DIR/nvml-real.json and DIR/nvml-real.md. Its only third-party import is nvidia-ml-py (`pynvml`): the
source's modules are loaded without the `exporter.sources` package's registry, which would import every source's
settings (pydantic). Copy the JSON into bench/data/ as nvml-real-<gpu model>.json and `make bench` (its nvml_calls
section) shows it as rows of their own.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def load_source_modules() -> None:
    """Make `exporter.sources.nvml.source` importable without running `exporter/sources/__init__.py` (the registry)
    and `exporter/sources/nvml/__init__.py` (the spec): empty packages with the real directories stand in for them.
    Only for a process that runs nothing else of the exporter."""
    for path in (ROOT, ROOT / "client"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    for name, directory in (("exporter.sources", ROOT / "exporter" / "sources"),
                            ("exporter.sources.nvml", ROOT / "exporter" / "sources" / "nvml")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(directory)]
            sys.modules[name] = package


class _CountedFunction:
    """A libnvidia-ml function as pynvml looked it up, counting its calls and the calling thread's CPU time inside
    them (the driver's ioctls included); attributes pass through (pynvml sets `restype` on some)."""

    def __init__(self, name: str, function: Any, calls: Counter[str], cpu: dict[str, float]) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_function", function)
        object.__setattr__(self, "_calls", calls)
        object.__setattr__(self, "_cpu", cpu)

    def __call__(self, *args: Any) -> Any:
        self._calls[self._name] += 1
        started = time.thread_time()
        try:
            return self._function(*args)
        finally:
            self._cpu[self._name] = self._cpu.get(self._name, 0.0) + time.thread_time() - started

    def __getattr__(self, name: str) -> Any:
        return getattr(self._function, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._function, name, value)


def count_c_calls(pynvml: Any) -> tuple[Counter[str], dict[str, float]]:
    """Count every C function call pynvml makes from now on (it looks each function up per call), and the CPU
    seconds spent inside each function."""
    calls: Counter[str] = Counter()
    cpu: dict[str, float] = {}
    lookup = pynvml._nvmlGetFunctionPointer
    wrapped: dict[str, _CountedFunction] = {}

    def counted_lookup(name: str) -> Any:
        function = wrapped.get(name)
        if function is None:
            function = wrapped[name] = _CountedFunction(name, lookup(name), calls, cpu)
        return function

    pynvml._nvmlGetFunctionPointer = counted_lookup
    return calls, cpu


def measure(source: Any, seconds: float, interval: float, sleep: Callable[[float], None] = time.sleep,
            clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Collect every `interval` seconds for `seconds` (the first collection discovers the GPUs and is left out of the
    figures, as start-up): per collection its CPU and wall time, and the source's calls over the steady part."""
    first = source.collect()
    if first.errors:
        print(f"first collection's errors: {sorted(set(first.errors))}", file=sys.stderr)
    gpus = len(source._gpus or [])
    before = Counter(source.library_calls())
    cpu: list[float] = []
    wall: list[float] = []
    errors: Counter[str] = Counter()
    began = clock()
    tick = began
    while True:
        tick += interval
        if tick - began > seconds:
            break
        sleep(max(0.0, tick - clock()))
        started, started_cpu = clock(), time.thread_time()
        batch = source.collect()
        cpu.append(time.thread_time() - started_cpu)
        wall.append(clock() - started)
        errors.update(batch.errors)
    elapsed = tick - interval - began
    calls = Counter(source.library_calls())
    calls.subtract(before)
    return {"gpus": gpus, "collections": len(cpu), "elapsed_s": elapsed, "calls": dict(+calls), "cpu_s": cpu,
            "wall_s": wall, "errors": dict(errors)}


# Fields asked side by side with the calls they replace (or could) on the real GPU: NVML_FI_DEV_PERF_POLICY_* against
# nvmlDeviceGetViolationStatus (the source reads the fields since an H200 showed them in the same nanoseconds), and
# NVML_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL against the active links' counters summed (72 calls on an H100; not used by
# the source yet).
PROBE_POLICY_FIELDS = {0: 74, 1: 75, 2: 76, 3: 77, 4: 78, 5: 79}  # violation policy -> its field
PROBE_NVLINK_TOTALS = {0: 52, 1: 59, 2: 38, 3: 45}  # NVLink error counter (replay, recovery, CRC flit, data) -> total


def probe(pynvml: Any, source: Any) -> list[dict[str, Any]]:
    from exporter.sources.nvml.library import _field_int

    def answer(call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except pynvml.NVMLError as exc:
            return f"error: {exc}"

    def violation(handle: Any, policy: int) -> int:
        return int(pynvml.nvmlDeviceGetViolationStatus(handle, policy).violationTime)

    def link_errors(handle: Any, links: list[int], counter: int) -> int:
        return sum(int(pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter)) for link in links)

    def fields(handle: Any, ids: list[int]) -> dict[str, Any]:
        values = {str(f.fieldId): _field_int(f) for f in pynvml.nvmlDeviceGetFieldValues(handle, [(i, 0) for i in ids])}
        return {k: v if v is None or isinstance(v, int) else f"error: {v}" for k, v in values.items()}

    out = []
    ids = [*PROBE_POLICY_FIELDS.values(), *PROBE_NVLINK_TOTALS.values()]
    for gpu in source._gpus or []:
        calls = {f"violation_ns_{policy}": answer(violation, gpu.handle, policy) for policy in PROBE_POLICY_FIELDS}
        calls.update({f"nvlink_errors_{counter}": answer(link_errors, gpu.handle, gpu.links, counter)
                      for counter in PROBE_NVLINK_TOTALS})
        out.append({"gpu": gpu.index, "links": len(gpu.links), "calls": calls,
                    "fields": answer(fields, gpu.handle, ids)})
    return out


def per_gpu_second(calls: dict[str, int], gpus: int, elapsed: float) -> dict[str, float]:
    if not gpus or elapsed <= 0:
        return {}
    return {name: count / gpus / elapsed for name, count in sorted(calls.items(), key=lambda kv: -kv[1])}


def markdown(result: dict[str, Any]) -> list[str]:
    """The run as rows: calls per GPU per second (backend and C calls), CPU per collection, then each call's rate."""
    backend = per_gpu_second(result["calls"], result["gpus"], result["elapsed_s"])
    c_calls = per_gpu_second(result["c_calls"], result["gpus"], result["elapsed_s"])
    cpu = sorted(result["cpu_s"]) or [0.0]
    lines = [
        f"{result['gpus']} x {result['model']}, driver {result['driver']}, nvidia-ml-py {result['pynvml']}, "
        f"Python {result['python']}; {result['collections']} collections every {result['interval_s']:g} s "
        f"(slow_interval {result['slow_interval_s']:g} s) over {result['elapsed_s']:.0f} s; commit "
        f"{result['commit']}, {result['date']}.",
        "",
        "| calls per GPU per second (source) | C calls per GPU per second | CPU per collection, median | worst | "
        "CPU per GPU per collection |",
        "|---|---|---|---|---|",
        f"| {sum(backend.values()):.2f} | {sum(c_calls.values()):.2f} | {cpu[len(cpu) // 2] * 1000:.2f} ms | "
        f"{cpu[-1] * 1000:.2f} ms | {cpu[len(cpu) // 2] * 1000 / max(1, result['gpus']):.2f} ms |",
        "",
        "| NVML function | calls per GPU per second (source) | C calls per GPU per second | CPU per C call | "
        "share of the CPU in C calls |",
        "|---|---|---|---|---|",
    ]
    c_cpu = result.get("c_cpu_s", {})
    total_cpu = sum(c_cpu.values()) or 1.0
    for name in sorted(set(backend) | set(c_calls), key=lambda n: -max(backend.get(n, 0.0), c_calls.get(n, 0.0))):
        count = result["c_calls"].get(name, 0)
        per_call = f"{c_cpu[name] / count * 1000:.3f} ms" if count and name in c_cpu else "-"
        share = f"{c_cpu[name] / total_cpu:.0%}" if name in c_cpu else "-"
        lines.append(f"| `{name}` | {backend.get(name, 0.0):.3f} | {c_calls.get(name, 0.0):.3f} | {per_call} | "
                     f"{share} |")
    if result["errors"]:
        lines += ["", "Errors counted: " + ", ".join(f"{k} x{v}" for k, v in sorted(result["errors"].items()))]
    for entry in result.get("probe", []):
        lines += ["", f"Probe, GPU {entry['gpu']} ({entry['links']} active NVLink links): calls "
                  + ", ".join(f"{k} {v}" for k, v in entry["calls"].items()) + f"; fields {entry['fields']}"]
    return lines


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(seconds: float, sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """`sleep`, `clock` and `wall_clock` (the source's): a manual clock's in tests."""
    load_source_modules()
    import pynvml

    from exporter.sources.nvml.cadence import INTERVAL, SLOW_INTERVAL
    from exporter.sources.nvml.library import NvmlLibrary
    from exporter.sources.nvml.source import NvmlSource

    c_calls, c_cpu = count_c_calls(pynvml)
    source = NvmlSource(NvmlLibrary(), clock=wall_clock)
    c_before: Counter[str] = Counter()
    cpu_before: dict[str, float] = {}

    def measured_collect(original: Callable[[], Any] = source.collect) -> Any:
        if not c_before and source._gpus is not None:  # the first collection is over: C calls count from here
            c_before.update(c_calls)
            cpu_before.update(c_cpu)
        return original()

    source.collect = measured_collect  # type: ignore[method-assign]
    try:
        result = measure(source, seconds, INTERVAL, sleep, clock)
        c_steady = Counter(c_calls)  # before the probe's calls
        cpu_steady = {name: seconds - cpu_before.get(name, 0.0) for name, seconds in c_cpu.items()}
        result["probe"] = probe(pynvml, source)
        gpus = source._gpus or []
        model = gpus[0].info[2] if gpus else "no GPU"
        driver = source._driver or "unknown"
    finally:
        source.close()
    c_steady.subtract(c_before)
    c_steady.pop("nvmlShutdown", None)
    cpu_steady.pop("nvmlShutdown", None)
    result.update(c_calls=dict(+c_steady), c_cpu_s={k: v for k, v in cpu_steady.items() if c_steady.get(k)},
                  model=model, driver=driver, interval_s=INTERVAL,
                  slow_interval_s=SLOW_INTERVAL, pynvml=_version("nvidia-ml-py"), python=platform.python_version(),
                  commit=_commit(), date=datetime.date.today().isoformat())
    return result


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="directory for nvml-real.json and nvml-real.md")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to collect (default 60)")
    parser.add_argument("--commit", help="the commit measured, where the checkout has no git history (default: HEAD)")
    args = parser.parse_args()
    load_source_modules()
    from exporter.core.source import SourceError

    try:
        result = run(args.seconds)
        if args.commit:
            result["commit"] = args.commit
    except SourceError as exc:
        sys.exit(f"nvml_real: the NVML source cannot collect: {exc}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nvml-real.json").write_text(json.dumps(result, indent=1) + "\n")
    text = "\n".join(markdown(result)) + "\n"
    (args.out / "nvml-real.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
