"""The fabric source on this machine's real /sys/class/net.

The default interface filter is checked against what the kernel says over netlink (`ip -details`: the parent
bus of device-backed interfaces, the kind of virtual ones), not against sysfs, which the source itself reads.
Then a veth pair between two network namespaces made by the test carries a known number of UDP datagrams, and
the source, run inside one namespace with the filter widened to its end of the pair, must count exactly those
bytes and packets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator

import pytest

from exporter.core.gpus import NodeGpus
from exporter.sources.fabric import metrics as c
from exporter.sources.fabric.source import FabricSource
from exporter.sources.fabric.sysfs import HostSysfs

ETHERNET_IPV4_UDP_HEADERS = 14 + 20 + 8  # what a veth counts per datagram beyond its payload (no FCS)


def _links() -> list[dict]:  # type: ignore[type-arg]
    out = subprocess.run(["ip", "-json", "-details", "link", "show"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2's `ip` is not installed")
def test_the_default_filter_reads_the_device_backed_interfaces_and_skips_loopback() -> None:
    links = _links()
    if any("parentbus" in link for link in links):  # the kernel names each interface's parent device
        expected = {link["ifname"] for link in links if link.get("parentbus")}
    else:  # older kernels: every interface that is neither loopback nor of a virtual kind
        expected = {link["ifname"] for link in links
                    if link.get("link_type") != "loopback" and "info_kind" not in link.get("linkinfo", {})}
    batch = FabricSource(HostSysfs("/sys"), NodeGpus()).collect()
    read = {labels[0] for labels, _ in batch.series.get(c.IFACE_MTU, [])}
    assert read == expected
    assert "lo" not in read
    mtus = {link["ifname"]: link["mtu"] for link in links}
    assert {labels[0]: v for labels, v in batch.series.get(c.IFACE_MTU, [])} == {n: mtus[n] for n in expected}


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def veth() -> Iterator[tuple[str, str, str]]:
    """Namespaces A and B joined by a veth pair (gpxa in A, gpxb in B), IPv6 off and static neighbours, so
    nothing but what the test sends crosses the pair."""
    if shutil.which("ip") is None:
        pytest.skip("iproute2's `ip` is not installed")
    tag = uuid.uuid4().hex[:6]
    ns_a, ns_b = f"gpx-a-{tag}", f"gpx-b-{tag}"
    try:
        _run("ip", "netns", "add", ns_a)
        _run("ip", "netns", "add", ns_b)
    except (subprocess.CalledProcessError, OSError) as exc:
        stderr = getattr(exc, "stderr", "") or exc
        for ns in (ns_a, ns_b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot make network namespaces here: {stderr}")
    try:
        _run("ip", "link", "add", "gpxa", "netns", ns_a, "type", "veth", "peer", "name", "gpxb", "netns", ns_b)
        for ns, ifname, addr in ((ns_a, "gpxa", "10.231.0.1"), (ns_b, "gpxb", "10.231.0.2")):
            _run("ip", "netns", "exec", ns, "sysctl", "-q", f"net.ipv6.conf.{ifname}.disable_ipv6=1")
            _run("ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", ifname)
            _run("ip", "-n", ns, "link", "set", ifname, "up")
        macs = {}
        for ns, ifname in ((ns_a, "gpxa"), (ns_b, "gpxb")):
            out = subprocess.run(["ip", "-n", ns, "-json", "link", "show", ifname], capture_output=True, text=True,
                                 check=True)
            macs[ifname] = json.loads(out.stdout)[0]["address"]
        _run("ip", "-n", ns_a, "neigh", "replace", "10.231.0.2", "lladdr", macs["gpxb"], "dev", "gpxa", "nud",
             "permanent")
        _run("ip", "-n", ns_b, "neigh", "replace", "10.231.0.1", "lladdr", macs["gpxa"], "dev", "gpxb", "nud",
             "permanent")
        yield ns_a, ns_b, "10.231.0.1"
    finally:
        for ns in (ns_a, ns_b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# Run inside namespace A (`ip netns exec` mounts that namespace's own sysfs): read gpxa with the fabric source,
# have namespace B send the datagrams to a socket bound here (so no ICMP answer goes back), read again.
INSIDE_A = textwrap.dedent("""
    import json, socket, subprocess, sys
    from exporter.core.gpus import NodeGpus
    from exporter.sources.fabric.source import FabricSource
    from exporter.sources.fabric.sysfs import HostSysfs

    ns_b, addr, count, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind((addr, 40999))
    source = FabricSource(HostSysfs("/sys"), NodeGpus(), interfaces="gpx[ab]")

    def read():
        return [[m.name, list(labels), v] for m, rows in source.collect().series.items() for labels, v in rows]

    before = read()
    send = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\\n"
            f"for _ in range({count}): s.sendto(b'x' * {size}, ('{addr}', 40999))")
    subprocess.run(["ip", "netns", "exec", ns_b, sys.executable, "-c", send], check=True)
    listener.settimeout(0.5)
    try:  # drain (the interface counted every datagram on arrival; the socket may have dropped some)
        while True:
            listener.recv(65536)
    except TimeoutError:
        pass
    print(json.dumps({"before": before, "after": read()}))
""")


def _values(rows: list, name: str) -> dict[tuple[str, ...], float]:  # type: ignore[type-arg]
    return {tuple(labels): value for metric, labels, value in rows if metric == name}


def test_a_widened_filter_counts_exactly_what_crossed_a_veth_pair(veth: tuple[str, str, str]) -> None:
    ns_a, ns_b, addr = veth
    count, size = 200, 1000
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(["ip", "netns", "exec", ns_a, sys.executable, "-c", INSIDE_A, ns_b, addr, str(count),
                          str(size)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    before, after = result["before"], result["after"]
    # only the widened filter's interface is there: gpxb lives in the other namespace, lo is not matched
    assert {k for k in _values(after, c.IFACE_MTU.name)} == {("gpxa",)}
    assert _values(after, c.IFACE_UP.name) == {("gpxa",): 1}

    def delta(metric: str) -> float:
        return _values(after, metric)[("gpxa",)] - _values(before, metric)[("gpxa",)]

    assert delta(c.IFACE_RX_PACKETS.name) == count
    assert delta(c.IFACE_RX_BYTES.name) == count * (size + ETHERNET_IPV4_UDP_HEADERS)
    assert delta(c.IFACE_TX_PACKETS.name) == 0  # nothing went back: no ARP (static neighbours), no ICMP
    assert delta(c.IFACE_TX_BYTES.name) == 0
