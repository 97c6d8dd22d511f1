"""RDMA ports (InfiniBand, RoCE, EFA) under class/infiniband/<device>/ports/<port>/: state, rate, link layer,
the network interface behind the port, and the counters of counters/ and hw_counters/ (see counters.py)."""

from __future__ import annotations

import re

from ...core.exposition import Batch
from . import metrics as c
from .counters import HW_COUNTERS, HW_FALLBACKS, PORT_COUNTERS, Counter, Wraps, saturated
from .reading import Problems, gone, listdir, read_int, read_text
from .sysfs import SysfsView

ROOT = "class/infiniband"
_STATE = re.compile(r"^\s*(\d+)\s*(?::.*)?$")  # "4: ACTIVE"
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec\b")  # "200 Gb/sec (4X HDR)"


def parse_state(text: str) -> int | None:
    match = _STATE.match(text)
    return int(match.group(1)) if match else None


def parse_rate(text: str) -> float | None:
    """sysfs `rate` -> bytes per second (the kernel prints Gb/s, 10^9 bits)."""
    match = _RATE.match(text)
    return float(match.group(1)) * 1e9 / 8 if match else None


def netdevs(view: SysfsView, device: str) -> dict[str, str]:
    """port -> the network interface of the device's PCI function serving it, by the interface's dev_port (0 for
    port 1). Used for RoCE ports only: an InfiniBand port's IPoIB interface is not the port's netdev (the kernel's
    own port-to-netdev link, gid_attrs/ndevs, is refused on an InfiniBand port)."""
    out: dict[str, str] = {}
    for netdev in listdir(view, f"{ROOT}/{device}/device/net"):
        try:
            dev_port = int(view.read(f"{ROOT}/{device}/device/net/{netdev}/dev_port"))
        except (OSError, ValueError):
            continue  # which port it serves is unknown: no netdev is named rather than a guessed one
        out.setdefault(str(dev_port + 1), netdev)
    return out


def collect(view: SysfsView, batch: Batch, wraps: Wraps, problems: Problems) -> None:
    for device in listdir(view, ROOT):
        ports = listdir(view, f"{ROOT}/{device}/ports")
        behind = netdevs(view, device) if ports else {}
        for port in ports:
            _port(view, batch, wraps, problems, device, port, behind.get(port, ""))


def _port(view: SysfsView, batch: Batch, wraps: Wraps, problems: Problems, device: str, port: str,
          netdev: str) -> None:
    base = f"{ROOT}/{device}/ports/{port}"
    labels = (device, port)
    if gone(view, f"{ROOT}/{device}/ports/{port}"):
        return  # the device went away since it was listed (a driver unload): nothing to count
    link_layer = read_text(view, f"{base}/link_layer", device, problems)
    if link_layer is not None:  # unreadable: counted; an info series without it would break the joins on it
        batch.add(c.PORT_INFO, (*labels, link_layer, netdev if link_layer == "Ethernet" else ""), 1)
    for name, metric in (("state", c.PORT_STATE), ("phys_state", c.PORT_PHYS_STATE)):
        text = read_text(view, f"{base}/{name}", device, problems)
        if text is not None:
            value = parse_state(text)
            if value is None:
                problems.failed(device, f"{base}/{name}", f"unexpected content {text[:40]!r}")
            else:
                batch.add(metric, labels, value)
    text = read_text(view, f"{base}/rate", device, problems)
    if text is not None:
        rate = parse_rate(text)
        if rate is None:
            problems.failed(device, f"{base}/rate", f"unexpected content {text[:40]!r}")
        else:
            batch.add(c.PORT_RATE, labels, rate)

    listed = listdir(view, f"{base}/counters")
    present = set(listed)  # EFA's hw_counters stand in only for counters this port does not have at all
    for name in listed:
        counter = PORT_COUNTERS.get(name)
        if counter is None:
            continue
        raw = read_int(view, f"{base}/counters/{name}", device, problems)
        if raw is None:
            continue
        _emit(batch, counter, labels, raw * counter.scale)
        if saturated(counter, raw):
            batch.add(c.PORT_SATURATED, (*labels, name), 1)
    for name in listdir(view, f"{base}/hw_counters"):
        counter: Counter | None = HW_COUNTERS.get(name)
        if counter is None:
            stand_in = HW_FALLBACKS.get(name)
            if stand_in is None or stand_in[0] in present:
                continue
            counter = stand_in[1]
        key = (device, port, name)
        if counter.wraps:
            wraps.keep(key)
        raw = read_int(view, f"{base}/hw_counters/{name}", device, problems)
        if raw is None:
            continue
        value = wraps.value(key, raw) if counter.wraps else raw
        _emit(batch, counter, labels, value * counter.scale)


def _emit(batch: Batch, counter: Counter, labels: tuple[str, str], value: int) -> None:
    batch.add(counter.metric, labels if counter.label is None else (*labels, counter.label), value)
