"""The part of sysfs the fabric source reads, behind one small interface: the host's sysfs (under a mount
point, as node_exporter's --path.sysfs) or a simulated fabric. Both take paths relative to the sysfs root,
such as `class/infiniband/mlx5_0/ports/1/counters/symbol_error`, and raise OSError for what is not there or
cannot be read."""

from __future__ import annotations

import os
from typing import Protocol


class SysfsView(Protocol):
    name: str  # for the log: "sysfs at /host/sys", "simulated fabric"

    def listdir(self, rel: str) -> list[str]:
        """Entry names of a directory, sorted."""

    def read(self, rel: str) -> str:
        """A file's content, stripped of surrounding whitespace."""

    def resolve(self, rel: str) -> str:
        """Where a path leads once every symlink is followed, relative to the sysfs root (e.g.
        `devices/pci0000:00/0000:00:01.0/0000:01:00.0` for `bus/pci/devices/0000:01:00.0`)."""

    def exists(self, rel: str) -> bool:
        """Whether the path (followed through symlinks) exists."""


class HostSysfs:
    """The sysfs mounted at `root` (read-only is enough)."""

    def __init__(self, root: str = "/sys") -> None:
        # resolved, so that resolve() of a path below it is relative to the same real directory
        self.root = os.path.realpath(root)
        self.name = f"sysfs at {self.root}"

    def _path(self, rel: str) -> str:
        return f"{self.root}/{rel}"  # rel is always relative: plain concatenation, cheaper than os.path.join

    def listdir(self, rel: str) -> list[str]:
        return sorted(os.listdir(self._path(rel)))

    def read(self, rel: str) -> str:
        # a sysfs attribute is at most a page, returned by one read(); plain os calls skip the io layer's buffers,
        # which cost more than the read itself on ~1000 files per collection
        fd = os.open(self._path(rel), os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.read(fd, 65536).decode("utf-8", "replace").strip()
        finally:
            os.close(fd)

    def resolve(self, rel: str) -> str:
        real = os.path.realpath(self._path(rel))
        return os.path.relpath(real, self.root)

    def exists(self, rel: str) -> bool:
        return os.path.exists(self._path(rel))
