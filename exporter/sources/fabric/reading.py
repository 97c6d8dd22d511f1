"""What one collection could not read: counted per device for goodput_fabric_unreadable_files, each file
logged once (at the first failure, and again only after it was readable in between)."""

from __future__ import annotations

import logging
from collections import Counter

from .sysfs import SysfsView

log = logging.getLogger(__name__)


class Problems:
    def __init__(self) -> None:
        self.unreadable: Counter[str] = Counter()
        self._logged: set[str] = set()
        self._failed_now: set[str] = set()

    def begin(self) -> None:
        self.unreadable = Counter()
        self._failed_now = set()

    def end(self) -> None:
        self._logged &= self._failed_now  # a file readable again is logged anew if it fails later

    def failed(self, device: str, rel: str, why: object) -> None:
        self.unreadable[device] += 1
        self._failed_now.add(rel)
        if rel not in self._logged:
            self._logged.add(rel)
            log.warning("fabric: cannot read %s (%s); its series is left out", rel, why)


def read_int(view: SysfsView, rel: str, device: str, problems: Problems) -> int | None:
    """An integer file; None (and counted) when it cannot be read or holds no integer. None, not counted, for
    `N/A` (`N/A (no PMA)`: the adapter has no such counter)."""
    try:
        text = view.read(rel)
    except OSError as exc:
        problems.failed(device, rel, exc.strerror or exc.__class__.__name__)
        return None
    if text.startswith("N/A"):
        return None
    try:
        return int(text, 0) if text.startswith("0x") else int(text)
    except ValueError:
        problems.failed(device, rel, f"not an integer: {text[:40]!r}")
        return None


def read_text(view: SysfsView, rel: str, device: str, problems: Problems) -> str | None:
    try:
        return view.read(rel)
    except OSError as exc:
        problems.failed(device, rel, exc.strerror or exc.__class__.__name__)
        return None


def listdir(view: SysfsView, rel: str) -> list[str]:
    """A directory's entries; [] when it is not there (an optional directory such as hw_counters)."""
    try:
        return view.listdir(rel)
    except OSError:
        return []


def gone(view: SysfsView, rel: str) -> bool:
    """Whether a device or interface listed a moment ago has gone (its files are then not read failures)."""
    return not view.exists(rel)
