"""Virtual environments as a training image would have them: goodput-client installed from client/ on its
own (non-editable), and for the training job PyTorch too, but nothing of the daemon.

`pytest_plugins = ["job_env"]` in a test module brings its session-scoped fixtures: `job_env` (one job venv
per test session, however many modules use it) and `client_env` (the client alone). Test modules take
what they need from the fixtures rather than importing this module: a plugin imported before pytest
loads it cannot have its asserts rewritten.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "client"
TORCH = "torch==2.13.0"  # the CPU build these machines install from a local wheel (see pyproject.toml)
# Holistic Trace Analysis, to read captured profiler traces as a user would. Its wheel declares jupyterlab and
# pytest among its requirements, which `from hta.trace_analysis import TraceAnalysis` does not need: it is installed
# without them, with what it imports.
HTA = "holistictraceanalysis==0.5.0"
HTA_IMPORTS = ("numpy>=1.23.5,<3", "pandas>=1.5.2,<4", "plotly>=5.11,<8", "networkx>=3.1,<4", "pyyaml>=6,<7",
               "psutil>=5.9,<8")
DAEMON_MODULES = ("exporter", "fastapi", "httpx", "pydantic")  # none of these may reach a training job
# what would lead a child process back to the checkout or the dev venv
LEAKY_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONUSERBASE")

IMPORT_REPORT = """
import importlib, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        module = importlib.import_module(name)
    except ImportError:
        found[name] = None
    else:
        found[name] = getattr(module, "__file__", None) or ""
print(json.dumps(found))
"""


@dataclass(frozen=True)
class Venv:
    root: Path
    shipped: dict[str, str]  # the distributions `python -m venv` itself installed, by name: version
    build_seconds: float

    def bin(self, name: str) -> Path:
        return self.root / "bin" / name

    @property
    def python(self) -> Path:
        return self.bin("python")

    def environ(self, **extra: str) -> dict[str, str]:
        """This process's environment without the checkout and the dev venv, this venv's bin/ first."""
        env = {k: v for k, v in os.environ.items() if k not in LEAKY_VARIABLES and not k.startswith("GOODPUT_")}
        env["PATH"] = os.pathsep.join([str(self.root / "bin"), env.get("PATH", "")])
        return {**env, **extra}

    def imports(self, *modules: str, cwd: Path) -> dict[str, str | None]:
        """{module: its file, or None where importing it fails}, in this venv, from `cwd`."""
        result = subprocess.run([str(self.python), "-c", IMPORT_REPORT, *modules], cwd=cwd, env=self.environ(),
                                capture_output=True, text=True, timeout=120, check=True)
        return json.loads(result.stdout)

    def distributions(self) -> dict[str, str]:
        """{distribution name (normalized): version} installed in this venv."""
        result = subprocess.run([str(self.bin("pip")), "list", "--format", "json"], env=self.environ(),
                                capture_output=True, text=True, timeout=120, check=True)
        return {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(result.stdout)}


def client_source(where: Path) -> Path:
    """A copy of client/ without build leftovers: building a wheel writes next to the sources."""
    return Path(shutil.copytree(CLIENT, where / "client-src",
                                ignore=shutil.ignore_patterns("*.egg-info", "build", "dist", "__pycache__")))


def create_venv(where: Path) -> Venv:
    """`python -m venv where`: what the venv module itself installs, and nothing else."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120, capture_output=True)
    venv = Venv(where, {}, 0.0)
    return Venv(where, venv.distributions(), time.perf_counter() - started)


def install(venv: Venv, *requirements: str) -> Venv:
    """`pip install` the client (a non-editable install of a copy of client/) and `requirements`."""
    started = time.perf_counter()
    source = client_source(venv.root.parent)
    result = subprocess.run([str(venv.bin("pip")), "install", "--quiet", *requirements, str(source)],
                            env=venv.environ(), capture_output=True, text=True, timeout=600, cwd=venv.root.parent)
    if result.returncode != 0:
        pytest.fail(f"pip install {' '.join(requirements)} client failed:\n{result.stdout[-3000:]}"
                    f"{result.stderr[-3000:]}")
    return Venv(venv.root, venv.shipped, venv.build_seconds + time.perf_counter() - started)


@pytest.fixture(scope="session")
def job_env(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The training job's venv: PyTorch and goodput-client, and none of the daemon's modules."""
    top = tmp_path_factory.mktemp("job-env")
    venv = install(create_venv(top / "venv"), TORCH)
    found = venv.imports("goodput_client", "torch", *DAEMON_MODULES, cwd=top)
    assert found["goodput_client"] and Path(found["goodput_client"]).is_relative_to(venv.root), found
    assert found["torch"], found
    assert {name: found[name] for name in DAEMON_MODULES} == dict.fromkeys(DAEMON_MODULES), found
    print(f"\njob venv built in {venv.build_seconds:.1f} s")
    return venv


@pytest.fixture(scope="session")
def client_env(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh venv, then `pip install` of client/ alone, with no extra flags."""
    return install(create_venv(tmp_path_factory.mktemp("client-env") / "venv"))


@pytest.fixture(scope="session")
def hta_env(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A venv holding Holistic Trace Analysis (and nothing of this project), to load captured traces."""
    venv = create_venv(tmp_path_factory.mktemp("hta-env") / "venv")
    for args in (["--no-deps", HTA], list(HTA_IMPORTS)):
        result = subprocess.run([str(venv.bin("pip")), "install", "--quiet", *args], env=venv.environ(),
                                capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            pytest.fail(f"pip install {' '.join(args)} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return venv
