"""Publishing the training client this daemon ships (goodput_client, with goodput-instrument's sitecustomize) into a
node directory, for training pods to mount read-only and put on PYTHONPATH: the instrumentation then always matches
the daemon's version, with nothing installed in the jobs' images.

    DIR/<version>-<digest>/sitecustomize.py     goodput-instrument's, booting the package beside it
    DIR/<version>-<digest>/goodput_client/...   the package, as installed with the daemon, compiled for its Python
    DIR/current -> <version>-<digest>           what a pod's PYTHONPATH names: DIR/current

A version is written whole into a temporary directory and renamed into place; `current` is a symbolic link, replaced
by a rename: a pod starting at any moment sees one whole version. Processes already running keep the version they
loaded (the sitecustomize resolves `current` once); the version before stays, and so does every version published
less than KEEP_SECONDS (a week) ago: a long-running pod may still import a module of its version lazily.
"""

from __future__ import annotations

import compileall
import contextlib
import hashlib
import logging
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

import goodput_client

log = logging.getLogger(__name__)

CURRENT = "current"
KEEP_SECONDS = 7 * 86400  # a version published less than a week ago stays: pods started from it may still import
SITECUSTOMIZE = Path(goodput_client.__file__).parent / "instrument" / "autoload" / "sitecustomize.py"


def _sources(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix in (".py", ".typed"))


def version_name(package: Path | None = None) -> str:
    """`<client version>-<digest of its files>`: a new name whenever a file changes."""
    package = package or Path(goodput_client.__file__).parent
    digest = hashlib.sha256()
    for path in _sources(package):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{goodput_client.__version__}-{digest.hexdigest()[:12]}"


class UnsafeDirectory(OSError):
    """The client directory, or a folder in it, is a symbolic link or not the daemon's own: not written into."""


def _own_directory(path: Path) -> None:
    """Raise UnsafeDirectory unless `path` is a directory itself (no symbolic link) owned by this process's user:
    a pod that can write where the directory is (the socket directory, mounted writable) could otherwise point it
    elsewhere, and the daemon would write, and prune, there."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeDirectory(f"{path} is a symbolic link or not a directory: refusing to publish through it")
    if info.st_uid != os.geteuid():
        raise UnsafeDirectory(f"{path} belongs to uid {info.st_uid}, not this daemon's {os.geteuid()}: refusing to "
                              "publish into it")


def publish_client(directory: str) -> Path:
    """Publish the client into `directory` (made if missing) and point `current` at it; returns its folder. Raises
    UnsafeDirectory, before writing anything, when the directory, its parent or an existing version folder is a
    symbolic link or another user's."""
    package = Path(goodput_client.__file__).parent
    root = Path(directory)
    if not os.path.lexists(root.parent):
        root.parent.mkdir(parents=True, exist_ok=True)
    _own_directory(root.parent)
    if not os.path.lexists(root):
        root.mkdir()
    _own_directory(root)
    name = version_name(package)
    target = root / name
    if os.path.lexists(target):
        _own_directory(target)
    else:
        staging = Path(tempfile.mkdtemp(prefix=".publish-", dir=root))
        try:
            for path in _sources(package):
                destination = staging / "goodput_client" / path.relative_to(package)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, destination)
            shutil.copyfile(SITECUSTOMIZE, staging / "sitecustomize.py")
            # bytecode for this interpreter's version: a pod's read-only mount cannot cache what it compiles, and
            # compiling the client costs every Python process in a pod of that version about 10 ms at its start
            compileall.compile_dir(str(staging), quiet=1)
            for folder, _, files in os.walk(staging):
                os.chmod(folder, 0o755)
                for file in files:
                    os.chmod(os.path.join(folder, file), 0o644)
            os.rename(staging, target)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not target.is_dir():  # another daemon may have published the same version meanwhile
                raise
    link = root / CURRENT
    previous = os.readlink(link) if link.is_symlink() else None
    staged_link = root / f".{CURRENT}-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        staged_link.unlink()
    os.symlink(name, staged_link)
    os.replace(staged_link, link)
    _prune(root, {name, previous or name})
    log.info("ingest: published the training client %s in %s (PYTHONPATH=%s)", name, target, link)
    return target


def _prune(root: Path, keep: set[str]) -> None:
    """Remove versions older than KEEP_SECONDS (other than the current one and the one before) and leftovers of
    interrupted publications. A process keeps importing lazily from the version it started with (a module it
    imports first hours in): a version goes only once no pod could plausibly still be running from it."""
    now = time.time()
    for entry in root.iterdir():
        if entry.name == CURRENT or entry.name in keep or entry.is_symlink():
            continue
        with contextlib.suppress(OSError):
            if entry.lstat().st_uid != os.geteuid():
                continue  # not written by this daemon: left alone
        version = entry.name.split("-")[0][:1].isdigit()
        with contextlib.suppress(OSError):
            if version and now - entry.lstat().st_mtime < KEEP_SECONDS:
                continue
        if entry.is_dir() and (entry.name.startswith(".publish-") or version):
            shutil.rmtree(entry, ignore_errors=True)
