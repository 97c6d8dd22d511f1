"""Network interfaces under class/net/<interface>/: operstate, speed, MTU, carrier changes and statistics/.

By default only interfaces backed by a device (a `device` link: physical NICs and the netdevs of RDMA
adapters) are read; loopback, veth, bridges, bonds, VLANs and tunnels have none. A name pattern replaces that
choice when set (the `fabric.interfaces` setting)."""

from __future__ import annotations

import re

from ...core.exposition import Batch
from . import metrics as c
from .counters import INTERFACE_COUNTERS
from .reading import Problems, gone, listdir, read_int, read_text
from .sysfs import SysfsView

ROOT = "class/net"
MEGABIT_BYTES = 125_000  # sysfs `speed` is in Mb/s


def chosen(view: SysfsView, pattern: re.Pattern[str] | None) -> list[str]:
    names = listdir(view, ROOT)
    if pattern is not None:
        return [n for n in names if pattern.fullmatch(n)]
    return [n for n in names if view.exists(f"{ROOT}/{n}/device")]


def collect(view: SysfsView, batch: Batch, problems: Problems, pattern: re.Pattern[str] | None) -> None:
    for name in chosen(view, pattern):
        _interface(view, batch, problems, name)


def _interface(view: SysfsView, batch: Batch, problems: Problems, name: str) -> None:
    base = f"{ROOT}/{name}"
    labels = (name,)
    if gone(view, base):
        return  # removed since the listing (a pod's veth): not a read failure
    operstate = read_text(view, f"{base}/operstate", name, problems)
    if operstate is not None:
        batch.add(c.IFACE_UP, labels, 1 if operstate == "up" else 0)
    try:
        speed: int | None = int(view.read(f"{base}/speed"))
    except (OSError, ValueError) as exc:
        speed = None
        # the kernel refuses `speed` (EINVAL) while the link is down: absent then, and only a failure when up
        if operstate == "up":
            problems.failed(name, f"{base}/speed", exc)
    if speed is not None and speed > 0:
        batch.add(c.IFACE_SPEED, labels, speed * MEGABIT_BYTES)
    mtu = read_int(view, f"{base}/mtu", name, problems)
    if mtu is not None:
        batch.add(c.IFACE_MTU, labels, mtu)
    if view.exists(f"{base}/carrier_changes"):
        changes = read_int(view, f"{base}/carrier_changes", name, problems)
        if changes is not None:
            batch.add(c.IFACE_CARRIER_CHANGES, labels, changes)
    for stat in listdir(view, f"{base}/statistics"):
        counter = INTERFACE_COUNTERS.get(stat)
        if counter is None:
            continue
        value = read_int(view, f"{base}/statistics/{stat}", name, problems)
        if value is not None:
            batch.add(counter.metric, labels if counter.label is None else (name, counter.label), value)
