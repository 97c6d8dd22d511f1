"""goodput-instrument on a real GPU: a tiny CUDA training loop (model.cuda(), AdamW, a DataLoader with workers, an
evaluation pass, one torch.save), unmodified, run under goodput-instrument against a goodput-exporter daemon started
from this tree; prints what the daemon recorded next to the job's own counts and timings, and exits 1 when they
disagree (steps differ, a phase missing, or off by more than 5%).

    python tests/gpu/instrument_cuda_job.py [--steps 40]

Self-contained: needs PyTorch with CUDA and this checkout, nothing downloaded. The daemon runs with its NVML source
on (real GPUs) when its own dependencies import; where they do not (a bare image with only PyTorch), the events are
received by a stand-in that sums them the way the daemon's accounting does, and the output says so.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("compute", "data_wait", "comm_wait", "checkpoint_save", "checkpoint_restore", "compile", "startup", "eval",
          "other", "untracked")

JOB = r'''
import json, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

STEPS = int(os.environ["STEPS"])
DEVICE = os.environ.get("DEVICE", "cuda")

class Records(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, 256, generator=g), torch.randn(n, 1, generator=g)
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        time.sleep(0.001)
        return self.x[i], self.y[i]

def main():
    assert DEVICE != "cuda" or torch.cuda.is_available(), "no CUDA device"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train = DataLoader(Records(STEPS * 16, 1), batch_size=16, num_workers=2)
    val = DataLoader(Records(64, 2), batch_size=16)
    own = {"steps": 0, "data_wait": 0.0, "checkpoint_save": 0.0, "eval": 0.0, "losses": []}
    it = iter(train)
    for step in range(STEPS):
        t = time.perf_counter(); x, y = next(it); own["data_wait"] += time.perf_counter() - t
        x, y = x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        own["steps"] += 1
        own["losses"].append(loss.item())
    model.eval()
    t = time.perf_counter()
    with torch.no_grad():
        for vx, vy in val:
            torch.nn.functional.mse_loss(model(vx.to(DEVICE)), vy.to(DEVICE)).item()
    own["eval"] += time.perf_counter() - t
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter(); torch.save(state, os.path.join(os.environ["OUT_DIR"], "ckpt.pt"))
    own["checkpoint_save"] += time.perf_counter() - t
    own["device"] = torch.cuda.get_device_name(0) if DEVICE == "cuda" else DEVICE
    with open(os.path.join(os.environ["OUT_DIR"], os.environ["RUN_NAME"] + ".json"), "w") as f:
        json.dump(own, f)

main()
'''


class StandIn:
    """Receives the events over the Unix socket (HTTP, as the daemon does) and sums them per rank."""

    def __init__(self, path: str) -> None:
        self.totals: dict[tuple[str, int], dict[str, float]] = {}
        totals = self.totals

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                for event in body.get("events", []):
                    key = (event.get("workload"), event.get("rank"))
                    rank = totals.setdefault(key, {"steps": 0.0, "elapsed": 0.0})
                    if event["type"] == "step":
                        rank["steps"] += 1
                    elif event["type"] == "phase":
                        rank[event["phase"]] = rank.get(event["phase"], 0.0) + event["seconds"]
                    rank["elapsed"] = max(rank["elapsed"], event.get("elapsed_seconds", 0.0))
                answer = json.dumps({"accepted": len(body.get("events", []))}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def address_string(self) -> str:
                return "local"

            def log_message(self, *args: object) -> None:
                pass

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(path, Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def recorded(self) -> dict[str, float]:
        (rank,) = self.totals.values()
        tracked = sum(rank.get(phase, 0.0) for phase in PHASES if phase != "untracked")
        return {**rank, "untracked": max(0.0, rank["elapsed"] - tracked)}  # as the daemon counts it


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def daemon_metrics(url: str, workload: str) -> dict[str, float]:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or f'workload="{workload}"' not in line or 'rank="0"' not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith("goodput_steps_total"):
            found["steps"] = float(value)
        elif name.startswith("goodput_elapsed_seconds_total"):
            found["elapsed"] = float(value)
        elif name.startswith("goodput_phase_seconds_total"):
            found[name.split('phase="')[1].split('"')[0]] = float(value)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--cpu", action="store_true", help="a dry run of this script on the CPU (no GPU needed)")
    parser.add_argument("--stand-in", action="store_true", help="receive the events with the stand-in, no daemon")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gp-gpu-"))
    sock, flight = str(work / "ingest.sock"), work / "flight"
    flight.mkdir()
    (work / "job.py").write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "client"), env.get("PYTHONPATH", "")]))
    daemon = stand_in = None
    url = ""
    try:
        if args.stand_in:
            raise ImportError("--stand-in")
        import exporter.cli  # noqa: F401 - are the daemon's dependencies here?
    except ImportError as exc:
        print(f"no daemon ({exc}): a stand-in receives the events")
        stand_in = StandIn(sock)
    else:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        daemon = subprocess.Popen(
            [sys.executable, "-m", "exporter", "serve", f"--web.listen-address=127.0.0.1:{port}",
             f"--ingest.socket-path={sock}", f"--flight.dir={flight}", "--kubelet.enabled=false"],
            cwd=ROOT, env={**env, "PYTHONPATH": os.pathsep.join([str(ROOT), env["PYTHONPATH"]])},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(sock):
            if daemon.poll() is not None or time.monotonic() > deadline:
                print(daemon.stdout.read() if daemon.stdout else "")
                print("the daemon did not start")
                return 1
            time.sleep(0.2)
    try:
        job_env = {**env, "OUT_DIR": str(work), "RUN_NAME": "instrumented", "STEPS": str(args.steps),
                   "DEVICE": "cpu" if args.cpu else "cuda",
                   "GOODPUT_INGEST_SOCKET_PATH": sock, "GOODPUT_FLIGHT_DIR": str(flight),
                   "GOODPUT_WORKLOAD": "gpu-check"}
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "goodput_client.instrument.cli", sys.executable,
                                 str(work / "job.py")], env=job_env, cwd=work, capture_output=True, text=True)
        print(f"job under goodput-instrument: exit {result.returncode} in {time.perf_counter() - started:.1f} s")
        if result.returncode != 0:
            print(result.stdout[-3000:], result.stderr[-3000:])
            return 1
        if result.stderr.strip():
            print("job stderr:", result.stderr.strip()[-2000:])
        bare = subprocess.run([sys.executable, str(work / "job.py")], cwd=work, capture_output=True, text=True,
                              env={**job_env, "RUN_NAME": "bare"})
        own = json.loads((work / "instrumented.json").read_text())
        bare_own = json.loads((work / "bare.json").read_text()) if bare.returncode == 0 else None
        time.sleep(1.5)  # the daemon's ingest publishes on its interval
        recorded = stand_in.recorded() if stand_in else daemon_metrics(url, "gpu-check")
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(10)
    print(f"device: {own['device']}; receiver: {'stand-in' if stand_in else 'goodput-exporter daemon ' + url}")
    print(f"{'':18}{'daemon':>12}{'job':>12}")
    print(f"{'steps':18}{recorded.get('steps', 0):>12.0f}{own['steps']:>12}")
    problems = [] if recorded.get("steps") == own["steps"] else ["steps differ"]
    for phase in ("data_wait", "eval", "checkpoint_save"):
        got, want = recorded.get(phase, 0.0), own[phase]
        print(f"{phase:18}{got:>12.4f}{want:>12.4f}")
        if not (got > 0 and abs(got - want) <= 0.05 * want):
            problems.append(f"{phase} off by more than 5%")
    for phase in ("compute", "comm_wait", "compile", "startup", "untracked"):
        print(f"{phase:18}{recorded.get(phase, 0.0):>12.4f}")
    total = sum(recorded.get(p, 0.0) for p in PHASES)
    print(f"{'phases (sum)':18}{total:>12.4f}   elapsed {recorded.get('elapsed', 0.0):.4f}")
    if bare_own is not None:
        same = bare_own["losses"] == own["losses"]
        print(f"losses with and without goodput-instrument: {'bit-identical' if same else 'DIFFERENT'}")
        if not same:
            problems.append("losses differ")
    print("OK" if not problems else "PROBLEMS: " + ", ".join(problems))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
