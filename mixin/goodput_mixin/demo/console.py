"""`goodput-exporter demo`: the live stack in the foreground, printing alerts as they change."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from exporter.core.settings import parse_listen_address

from .simjob import CHECKPOINT_EVERY, CRASH_AFTER, DOWN_SECONDS
from .stack import SERVING, WORKLOAD, Ports, Stack, StackError

FAULTS = ("straggler", "stall", "skip", "crash", "xid", "row_remap_pending", "pcie_degraded", "nvlink_errors",
          "link_down", "link_flap", "symbol_errors", "congestion", "link_degraded", "overload")
OVERLOAD = 8.0  # times the serving engine's normal arrival rate
ENGINE_TITLES = {"vllm": "vLLM's", "triton": "Triton's with TensorRT-LLM"}
# the GPU each GPU fault hits (ranks hold GPUs 0 to ranks-1; a fault on a held GPU shows on the job's dashboards)
FAULT_GPU = {"xid": 0, "row_remap_pending": 1, "pcie_degraded": 2, "nvlink_errors": 3}
# the NIC each fabric fault hits (NIC i shares a PCIe switch with GPU i)
FAULT_NIC = {"link_down": 0, "link_flap": 1, "symbol_errors": 2, "congestion": 3, "link_degraded": 4}
FABRIC_ALERTS = {"link_down": "GoodputFabricLinkDown", "link_flap": "GoodputFabricLinkFlapping",
                 "symbol_errors": "GoodputFabricErrors", "congestion": "GoodputFabricCongestion",
                 "link_degraded": "GoodputFabricLinkDown"}


def _inject(stack: Stack, fault: str) -> str:
    job = stack.job
    assert job is not None
    if fault == "straggler":
        job.set_straggler(stack.ranks - 1)
        return (f"rank {stack.ranks - 1} of {WORKLOAD} computes 3x slower (GoodputStraggler; every rank waits for it, "
                "the job's FLOPs per second fall: GoodputMFUDrop)")
    if fault == "stall":
        job.set_data_stall(True)
        return f"every rank of {WORKLOAD} waits 10x longer for data (GoodputDrop)"
    if fault == "skip":
        job.set_skipping(1)
        return f"rank 1 of {WORKLOAD} skips the next all_reduce (GoodputCollectiveRankMissing for its node)"
    if fault == "crash":
        at = job.crash()
        return (f"every rank of {WORKLOAD} crashes after step {at}, is down {DOWN_SECONDS:g}s, restarts from its "
                f"checkpoint of step {at - CRASH_AFTER} (one every {CHECKPOINT_EVERY} steps) and redoes "
                f"{CRASH_AFTER} steps (GoodputWastedProgress)")
    if fault == "overload":
        stack.overload(OVERLOAD)
        return (f"requests reach the serving engine {SERVING!r} {OVERLOAD:g}x as fast: its queue grows, time to first "
                "token breaks its objective (GoodputInferenceSLOBurnFast)")
    if fault in FAULT_NIC:
        nic = FAULT_NIC[fault] % len(stack.fabric.nics)
        stack.fabric.inject(fault, nic)
        if fault == "congestion":  # what congestion does to the job: every collective takes longer
            job.set_slow_network(True)
        return f"{fault} on NIC {nic} ({stack.fabric.nics[nic].device}) ({FABRIC_ALERTS[fault]})"
    gpu = FAULT_GPU[fault] % stack.gpus.count
    if fault == "row_remap_pending":
        stack.gpus.remap_row(gpu, uncorrected=True)
        return f"GPU {gpu} remaps a row after an uncorrectable error; it waits for a reset (GoodputGPUResetRequired)"
    if fault == "pcie_degraded":
        stack.gpus.degrade_pcie(gpu)
        return f"GPU {gpu}'s PCIe link trains at gen 3 x8 of gen 5 x16 (GoodputGPUPCIeLinkDegraded)"
    if fault == "nvlink_errors":
        stack.gpus.nvlink_errors(gpu, link=0, seconds=3600)
        return f"NVLink link 0 of GPU {gpu} counts CRC and replay errors (GoodputGPUNVLinkErrors)"
    stack.gpus.inject_xid(gpu, 79)
    return f"GPU {gpu} falls off the bus: XID 79 (GoodputGPUXidCritical)"


def _clear(stack: Stack, fault: str) -> str | None:
    job = stack.job
    assert job is not None
    if fault == "straggler":
        job.set_straggler(None)
    elif fault == "stall":
        job.set_data_stall(False)
    elif fault == "skip":
        job.set_skipping(None)
    elif fault == "crash":
        return None  # a crash is an event: the job restarted by itself; its alert resolves once out of the window
    elif fault == "overload":
        stack.overload(1.0)
    elif fault in FAULT_NIC:
        stack.fabric.restore(FAULT_NIC[fault] % len(stack.fabric.nics))
        if fault == "congestion":
            job.set_slow_network(False)
    elif fault == "row_remap_pending":
        stack.gpus.reset(FAULT_GPU[fault] % stack.gpus.count)
        return f"{fault} cleared: GPU {FAULT_GPU[fault] % stack.gpus.count} reset (its remapped row stays counted)"
    elif fault == "pcie_degraded":
        stack.gpus.restore_pcie(FAULT_GPU[fault] % stack.gpus.count)
    elif fault == "nvlink_errors":
        stack.gpus.stop_nvlink_errors(FAULT_GPU[fault] % stack.gpus.count)
    else:
        return None  # an XID is an event: its alert resolves by itself
    return f"{fault} cleared"


def _describe(alert: dict) -> str:  # type: ignore[type-arg]
    labels = alert["labels"]
    where = " ".join(f"{k}={labels[k]}" for k in ("workload", "model", "rank", "pg", "gpu", "xid", "reason", "degraded",
                                                    "link", "error_type", "source") if k in labels)
    return f"{labels['alertname']} [{labels.get('severity', '?')}] {where}".rstrip()


def watch(stack: Stack, stop: threading.Event, say: Callable[[str], None]) -> None:
    """Print each alert as Alertmanager starts and stops holding it."""
    active: dict[str, str] = {}
    while not stop.wait(2.0):
        try:
            alerts = stack.alerts()
        except Exception as exc:  # Alertmanager restarting or gone: say so, keep watching
            say(f"  (cannot read Alertmanager's alerts: {exc.__class__.__name__})")
            continue
        now = {alert["fingerprint"]: _describe(alert) for alert in alerts}
        for key in now.keys() - active.keys():
            say(f"{time.strftime('%H:%M:%S')}  FIRING    {now[key]}")
        for key in active.keys() - now.keys():
            say(f"{time.strftime('%H:%M:%S')}  resolved  {active[key]}")
        active = now


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="goodput-exporter demo",
        description="Run the daemon on simulated GPUs with a simulated training job, Prometheus with the rules "
                    "and Alertmanager on 127.0.0.1, and print alerts as they change. Ctrl-C stops everything.")
    parser.add_argument("--exporter-address", default="127.0.0.1:9445", help="the daemon's address")
    parser.add_argument("--prometheus-port", type=int, default=9090)
    parser.add_argument("--alertmanager-port", type=int, default=9093)
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs")
    parser.add_argument("--ranks", type=int, default=4, help="ranks of the simulated job (at most --gpus per node)")
    parser.add_argument("--nodes", type=int, default=1,
                        help="nodes, each a daemon of its own (the next free ports after the first) with --gpus "
                             "simulated GPUs, scraped by the one Prometheus; the job's ranks are spread over them in "
                             "order (default 1)")
    parser.add_argument("--faults", default="",
                        help=f"comma-separated, injected after --fault-after: {', '.join(FAULTS)}")
    parser.add_argument("--fault-after", type=float, default=30.0, help="seconds before the first fault (default 30)")
    parser.add_argument("--fault-seconds", type=float, default=60.0,
                        help="each fault lasts this long, then the next one starts (default 60)")
    parser.add_argument("--serving-engine", choices=("vllm", "triton"), default="vllm",
                        help="whose metrics the simulated serving engine serves: vLLM's, or Triton Inference "
                             "Server's with the TensorRT-LLM backend (default vllm)")
    parser.add_argument("--workdir", default="/tmp/goodput-exporter-demo",
                        help="configs, data and logs of the stack; emptied first")
    args = parser.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown or not 1 <= args.ranks <= args.gpus * args.nodes or not 1 <= args.nodes <= args.ranks:
        parser.error(f"unknown faults {unknown} (known: {', '.join(FAULTS)})" if unknown
                     else "need 1 <= nodes <= ranks <= gpus x nodes")
    host, port = parse_listen_address(args.exporter_address)
    if host not in ("127.0.0.1", "localhost"):
        parser.error("the demo stays on 127.0.0.1")
    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    ports = Ports(port, args.prometheus_port, args.alertmanager_port)  # the serving engine: any free port
    stack = Stack(workdir, ports, gpus=args.gpus, ranks=args.ranks, nodes=args.nodes,
                  serving_engines=(args.serving_engine,))
    try:
        stack.start()
    except StackError as exc:
        print(f"goodput-exporter demo: {exc}", file=sys.stderr)
        return 1
    urls = stack.urls
    gpus = f"{args.nodes} nodes of {args.gpus}" if args.nodes > 1 else f"{args.gpus}"
    print(f"""goodput-exporter demo: {gpus} simulated GPUs, simulated job {WORKLOAD!r} with {args.ranks} ranks,
simulated serving engine {SERVING!r} ({ENGINE_TITLES[args.serving_engine]} metrics) on the next GPUs
  metrics        {'  '.join(f"{node.url}/metrics" for node in stack.nodes)}
  serving        {urls['serving']}/metrics
  prometheus     {urls['prometheus']}/alerts   (rules: {workdir}/rules, fast demo settings)
  alertmanager   {urls['alertmanager']}/#/alerts
  your own job   GOODPUT_INGEST_SOCKET_PATH={workdir}/ingest.sock ; flight dumps: {workdir}/flight/<workload>/
  logs           {workdir}/*.log""", flush=True)
    schedule: list[tuple[float, str, str]] = []  # (at, inject|clear, fault)
    for i, fault in enumerate(faults):
        at = args.fault_after + i * (args.fault_seconds + 15)
        schedule += [(at, "inject", fault), (at + args.fault_seconds, "clear", fault)]
    if faults:
        print(f"faults one after another from {args.fault_after:g}s, {args.fault_seconds:g}s each: "
              f"{', '.join(faults)}", flush=True)
    else:
        print(f"no faults injected: try --faults {','.join(FAULTS)}  (make demo DEMO_FAULTS=...)", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    watcher = threading.Thread(target=watch, args=(stack, stop, lambda line: print(line, flush=True)), daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        while not stop.wait(0.5):
            while schedule and time.monotonic() - started >= schedule[0][0]:
                _, action, fault = schedule.pop(0)
                said = _inject(stack, fault) if action == "inject" else _clear(stack, fault)
                if said:
                    print(f"{time.strftime('%H:%M:%S')}  {action:<9} {said}", flush=True)
    except KeyboardInterrupt:
        pass  # Ctrl-C: stop everything below
    finally:
        stop.set()
        print("stopping the demo stack ...", flush=True)
        stack.stop()
    return 0
