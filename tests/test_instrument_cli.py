"""goodput-instrument itself: the command, the sitecustomize it puts on PYTHONPATH (loaded in every Python process,
chaining to the one already there), silence in processes that do not train, and one log line when there is no
daemon. Real interpreters and real PyTorch; no daemon needed. Plus the client's Python 3.9 floor, checked statically."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, free_port, live_server, quick_config, series, value

BIN = Path(sys.executable).parent
TRAIN_ONE_STEP = ("import torch; p = torch.zeros(2, requires_grad=True); o = torch.optim.SGD([p], lr=0.1); "
                  "p.sum().backward(); o.step(); print('trained')")


def instrumented(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
                 ) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_") and k != "PYTHONPATH"}
    environment.update(env or {})
    return subprocess.run([str(BIN / "goodput-instrument"), *args], env=environment, capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_usage_without_a_command() -> None:
    result = instrumented()
    assert result.returncode == 2 and "usage: goodput-instrument COMMAND" in result.stderr
    assert instrumented("--help").returncode == 0
    missing = instrumented("no-such-command-here")
    assert missing.returncode == 127 and "cannot run 'no-such-command-here'" in missing.stderr


def test_the_sitecustomize_loads_in_every_interpreter_and_chains_to_the_images_own(tmp_path: Path) -> None:
    own = tmp_path / "image"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['IMAGE_SITECUSTOMIZE'] = 'ran'\n")
    child = ("import subprocess, sys; print(subprocess.run([sys.executable, '-c', "
             "'import os, sys; print(os.environ.get(\"IMAGE_SITECUSTOMIZE\"), "
             "\"goodput_client.instrument.boot\" in sys.modules)'], capture_output=True, text=True).stdout)")
    result = instrumented(sys.executable, "-c", child, env={"PYTHONPATH": str(own)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ran", "True"]  # in a grandchild: the image's own ran, and ours
    assert result.stderr == ""


def test_processes_that_do_not_train_stay_silent(tmp_path: Path) -> None:
    """pip, `python -c` importing torch, a DataLoader with a worker process: no connection to the daemon, nothing
    printed."""
    path = str(tmp_path / "ingest.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(8)
        server.setblocking(False)
        env = {"GOODPUT_INGEST_SOCKET_PATH": path}
        pip = instrumented(str(BIN / "pip"), "--version", env=env)
        assert pip.returncode == 0 and pip.stdout.startswith("pip ") and pip.stderr == ""
        loader = ("import torch; from torch.utils.data import DataLoader; "
                  "print(sum(len(b) for b in DataLoader(list(range(8)), batch_size=4, num_workers=1)))")
        result = instrumented(sys.executable, "-c", loader, env=env)
        assert result.returncode == 0 and result.stdout.split() == ["8"], result.stderr
        assert "goodput" not in result.stderr
        try:
            connection, _ = server.accept()
        except BlockingIOError:
            connection = None
        assert connection is None  # nobody connected


def test_no_daemon_socket_is_one_log_line_and_the_job_runs(tmp_path: Path) -> None:
    result = instrumented(sys.executable, "-c", TRAIN_ONE_STEP,
                          env={"GOODPUT_INGEST_SOCKET_PATH": str(tmp_path / "absent.sock")})
    assert result.returncode == 0 and result.stdout.split() == ["trained"]
    lines = [line for line in result.stderr.splitlines() if "goodput" in line]
    assert lines == [f"goodput-instrument: no goodput-exporter socket at {tmp_path / 'absent.sock'}; this process "
                     "is not instrumented"]


def test_turned_off_it_loads_nothing() -> None:
    result = instrumented(sys.executable, "-c", "import sys; print('goodput_client' in sys.modules)",
                          env={"GOODPUT_INSTRUMENT": "0"})
    assert result.stdout.split() == ["False"]


def test_the_client_is_python_3_9_code() -> None:
    """No 3.9 interpreter here: mypy checks the client against 3.9's standard library and syntax, vermin finds the
    lowest version each construct needs."""
    client = str(ROOT / "client" / "goodput_client")
    mypy = subprocess.run([str(BIN / "mypy"), "--python-version", "3.9", "--no-incremental", "--no-site-packages",
                           "--ignore-missing-imports", client], capture_output=True, text=True, timeout=300)
    assert mypy.returncode == 0, mypy.stdout[-3000:]
    vermin = subprocess.run([str(BIN / "vermin"), "--no-tips", "--violations", "--eval-annotations", "-t=3.9-",
                             client], capture_output=True, text=True, timeout=300)
    assert vermin.returncode == 0, vermin.stdout[-3000:]
    assert "Minimum required versions: 3.9" in subprocess.run(
        [str(BIN / "vermin"), "--no-tips", "--eval-annotations", client], capture_output=True, text=True,
        timeout=300).stdout


SPAWNED = """
import os, torch, torch.distributed as dist, torch.multiprocessing as mp

def rank_main(rank):
    dist.init_process_group("gloo", rank=rank, world_size=2)
    p = torch.zeros(4, requires_grad=True)
    optimizer = torch.optim.SGD([p], lr=0.1)
    for _ in range(3):
        p.sum().backward(); optimizer.step(); optimizer.zero_grad()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(rank_main, nprocs=2)
"""


def test_ranks_started_by_multiprocessing_spawn_are_ranks(tmp_path: Path) -> None:
    """torch.multiprocessing.spawn's ranks have a multiprocessing parent and no RANK variable: they are measured,
    named by the process group's rank; the parent, which trains nothing, is not."""
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED)
    config = quick_config()
    port = free_port()
    with live_server(config) as live:
        result = instrumented(sys.executable, str(script), cwd=tmp_path, env={
            "GOODPUT_INGEST_SOCKET_PATH": config.ingest.socket_path, "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)})
        assert result.returncode == 0, result.stderr[-3000:]
        text = live.metrics_when("goodput_steps_total", 3, rank="1")
    rows = series(text, "goodput_steps_total")
    assert sorted(row["rank"] for row in rows) == ["0", "1"]
    assert {row["workload"] for row in rows} == {f"{socket.gethostname().partition('.')[0]}/127.0.0.1:{port}"}
    assert value(text, "goodput_steps_total", rank="0") == 3


FORKED = """
import multiprocessing, torch, torch.distributed as dist
from torch.optim.optimizer import Optimizer
from torch.serialization import save

def rank_main():
    p = torch.zeros(2, requires_grad=True)
    torch.optim.SGD([p], lr=0.1).step()
    torch.optim.SGD([p], lr=0.1)

if __name__ == "__main__":
    for f in (dist.all_reduce, Optimizer.__init__, save, torch.no_grad.__enter__, dist.distributed_c10d.Work.wait):
        inner = f.__wrapped__
        assert f is not inner and f.__doc__ == inner.__doc__ and f.__qualname__ == inner.__qualname__, f
        assert f.__name__ == inner.__name__ and f.__module__ == inner.__module__, f
    children = [multiprocessing.get_context("fork").Process(target=rank_main) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join()
    print(*(child.exitcode for child in children))
"""


def test_patched_functions_keep_their_names_and_ranks_started_by_fork_say_they_are_not_measured(tmp_path: Path,
                                                                                              ) -> None:
    """One interpreter for two checks. Each patch is the library's function to whoever reads it (LightningCLI
    reads Trainer.__init__'s docstring, inspect.signature follows __wrapped__). Lightning's ddp_fork: a forked child
    that trains is not measured (it inherits the parent's half-set-up state), and says so once per process; the
    parent, which trains nothing, is silent."""
    result = instrumented(sys.executable, "-c", FORKED, env={"GOODPUT_INGEST_SOCKET_PATH": str(tmp_path / "none")})
    assert result.returncode == 0 and result.stdout.split() == ["0", "0"], result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if "goodput" in line]
    assert len(lines) == 2 and all("started by fork" in line and "not measured" in line for line in lines), lines


def test_a_rank_has_nccls_collective_timing_on_unless_it_chose() -> None:
    """In a rank (RANK set by the launcher), TORCH_NCCL_ENABLE_TIMING=1 so the flight recorder's entries carry each
    collective's GPU time; a job's own value is kept; `nccl_timing` in GOODPUT_INSTRUMENT_PROBES_OFF leaves it unset;
    outside a rank nothing is set."""
    show = "import os; print(os.environ.get('TORCH_NCCL_ENABLE_TIMING'))"
    rank = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    cases = [(rank, "1"), ({**rank, "TORCH_NCCL_ENABLE_TIMING": "0"}, "0"),
             ({**rank, "GOODPUT_INSTRUMENT_PROBES_OFF": "nccl_timing"}, "None"), ({}, "None")]
    for env, expected in cases:
        environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                      "SLURM_PROCID", "TORCH_NCCL_ENABLE_TIMING")}
        environment.update(env)
        result = subprocess.run([str(BIN / "goodput-instrument"), str(BIN / "python"), "-c", show], env=environment,
                                capture_output=True, text=True, timeout=60, check=True)
        assert result.stdout.strip() == expected, (env, result.stdout, result.stderr[-500:])
