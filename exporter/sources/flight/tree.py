"""flight.dir, walked through directory file descriptors so that no path is ever resolved through a
symbolic link.

The daemon often runs as root while the folders under flight.dir belong to the jobs' users, who can
rename, replace and symlink anything there at any moment. Checking a path and then opening it by
name leaves a window in which a folder can become a symbolic link to a root-only place (O_NOFOLLOW
guards only a path's last component). So flight.dir is opened once per pass, and everything below it
is listed and opened relative to its parent's descriptor (`os.scandir(fd)`, `os.open(name,
dir_fd=fd)`), always with O_NOFOLLOW: a component swapped for a symbolic link fails to open instead of
being followed. Files are opened with O_NONBLOCK (a FIFO cannot block the pass) and O_NOCTTY, then
checked on the open descriptor (`fstat`) to be regular files, and read from that same descriptor.
flight.dir itself is refused when it is a symbolic link, unless flight.follow_dir_symlink says so.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .load import Rejected

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
_KINDS = (
    (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"),
)


class DirRefused(Exception):
    """flight.dir itself cannot be read; `reason` labels the source's errors."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class Vanished(Exception):
    """The name went away (or changed type) between the listing and the open: nothing to report, the next
    pass sees what is there now."""


def describe(mode: int) -> str:
    """What a file of this mode is, in words: "a symbolic link", "a FIFO (named pipe)", ..."""
    for check, words in _KINDS:
        if check(mode):
            return words
    return "not a regular file"


def refusal(mode: int) -> Rejected:
    """The rejection of something that is not a regular file, with its true reason."""
    if stat.S_ISLNK(mode):
        return Rejected("symlink", "a symbolic link, not followed (it could point anywhere)")
    return Rejected("not_regular", f"{describe(mode)}, not a regular file")


def _failure(exc: OSError, dir_fd: int, name: str, folder: bool) -> Exception:
    """Why opening `name` under `dir_fd` failed, told from what the name is now (lstat, never followed). Only
    names listed as a folder (`folder`) or as a regular file are opened: one that is something else by now
    changed since the listing (Vanished), and the next pass judges what it has become."""
    if exc.errno == errno.ENOENT:
        return Vanished(name)
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return Vanished(name)
    if folder and stat.S_ISLNK(mode):
        return refusal(mode)  # rejected by its path: the folder's name, whatever version
    if exc.errno in (errno.ELOOP, errno.ENOTDIR) or not (stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode)):
        return Vanished(name)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return Rejected("unreadable", "permission denied")
    return Rejected("unreadable", exc.strerror or str(exc))


class DumpDir:
    """flight.dir, open for one pass. Use as a context manager; `open` returns None when it does not exist."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def open(cls, path: Path, follow_symlink: bool) -> DumpDir | None:
        """Raises DirRefused: a symbolic link (unless `follow_symlink`), not a directory, not readable."""
        flags = _DIR | (0 if follow_symlink else os.O_NOFOLLOW)
        for _ in range(3):  # an open that fails on what lstat then finds a directory met a swap: again
            try:
                fd = os.open(path, flags)
                break
            except FileNotFoundError:
                return None
            except OSError as exc:
                try:
                    mode = os.lstat(path).st_mode
                except FileNotFoundError:
                    return None
                except OSError:
                    mode = 0
                if stat.S_ISDIR(mode) and exc.errno in (errno.ENOTDIR, errno.ELOOP):
                    continue
                if stat.S_ISLNK(mode) and not follow_symlink:
                    raise DirRefused("dir_symlink", f"{path} is a symbolic link (to {_target(path)}); it is not "
                                     "followed, since whoever can write its parent folder could point it anywhere: "
                                     "set flight.dir to the real folder, or flight.follow_dir_symlink") from None
                if mode and not stat.S_ISDIR(mode) and not stat.S_ISLNK(mode):
                    raise DirRefused("dir_unreadable", f"{path} is {describe(mode)}, not a directory") from None
                raise DirRefused("dir_unreadable", f"cannot open {path}: {exc.strerror or exc}") from None
        else:
            raise DirRefused("dir_unreadable", f"cannot open {path}: it keeps changing between a directory and "
                             "something else")
        return cls(path, fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> DumpDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _folder(self, folder: str) -> int:
        """A descriptor of the workload folder `folder` (a name in flight.dir), opened without following it.
        Raises Rejected (a symbolic link, permission denied) or Vanished."""
        try:
            return os.open(folder, _DIR | os.O_NOFOLLOW, dir_fd=self.fd)
        except OSError as exc:
            raise _failure(exc, self.fd, folder, folder=True) from None

    def listing(self, folder: str | None = None) -> list[tuple[str, os.stat_result]]:
        """(name, lstat) of what flight.dir (folder None) or one of its folders holds, names starting with '.'
        left out. Raises Rejected or Vanished for a folder that cannot be opened."""
        fd = self.fd if folder is None else self._folder(folder)
        try:
            found = []
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        continue
                    try:  # fstatat on the folder's descriptor, before it is closed
                        found.append((entry.name, entry.stat(follow_symlinks=False)))
                    except OSError:
                        continue  # gone since it was listed
            return found
        except OSError as exc:
            raise Rejected("unreadable", f"cannot list it: {exc.strerror or exc}") from None
        finally:
            if fd != self.fd:
                os.close(fd)

    def read(self, folder: str | None, name: str, limit: int) -> tuple[bytes, os.stat_result]:
        """The bytes and fstat of `name`, listed as a regular file in flight.dir or one of its folders, at most
        `limit` bytes (flight.max_file_bytes). Raises Rejected (its folder is a symbolic link, too large,
        unreadable) or Vanished (it is no longer a regular file there)."""
        dir_fd = self.fd if folder is None else self._folder(folder)
        try:
            try:
                fd = os.open(name, _FILE, dir_fd=dir_fd)
            except OSError as exc:
                raise _failure(exc, dir_fd, name, folder=False) from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise Vanished(name)  # listed as a regular file, something else now: the next pass judges it
                if st.st_size > limit:
                    raise Rejected("too_large", f"{st.st_size} bytes, over flight.max_file_bytes={limit}")
                chunks, left = [], limit + 1
                while left > 0:
                    chunk = os.read(fd, min(left, 1 << 20))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    left -= len(chunk)
                if left <= 0:
                    raise Rejected("too_large", f"grew past flight.max_file_bytes={limit} while it was read")
                return b"".join(chunks), st
            except OSError as exc:
                raise Rejected("unreadable", exc.strerror or str(exc)) from None
            finally:
                os.close(fd)
        finally:
            if dir_fd != self.fd:
                os.close(dir_fd)


def _target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"
