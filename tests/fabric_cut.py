"""A fault in the fabric between one rank and its peers, on one machine: the kernel drops every packet of the TCP
connections between the rank's process and its peers' (iptables, by each connection's exact addresses and ports).
The connections stay open and every byte sent on them is lost, as on a dead link or a failed switch port: a
collective every rank entered never completes, while each process (and its flight-recorder dumps) lives on.

Needs root and iptables-legacy (`make deps` installs iptables); `unavailable()` says why not where it cannot run.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

COMMENT = "goodput-test-fabric-cut"  # every rule this module adds carries it
ESTABLISHED = "01"

Endpoint = tuple[str, int]  # (address, port)


def unavailable() -> str | None:
    """Why this machine cannot cut a connection (None: it can)."""
    if os.geteuid() != 0:
        return "cutting connections needs root (iptables)"
    for tool in ("iptables-legacy", "ip6tables-legacy"):
        if shutil.which(tool) is None:
            return f"no {tool} on the PATH (make deps installs the iptables package)"
    probe = subprocess.run(["iptables-legacy", "-w", "-n", "-L", "OUTPUT"], capture_output=True, text=True, timeout=30)
    if probe.returncode:
        return f"iptables-legacy cannot list the filter table: {probe.stderr.strip()}"
    return None


def _address(text: str) -> str:
    """/proc/net/tcp{,6}'s hex address (32-bit words in the host's order, little-endian here) as text; an IPv4 address
    mapped into IPv6 as the IPv4 address it is on the wire."""
    raw = bytes.fromhex(text)
    ordered = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(ordered)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def connections(pid: int) -> set[tuple[Endpoint, Endpoint]]:
    """The process's established TCP connections, as (its end, the other end)."""
    inodes: set[str] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found: set[tuple[Endpoint, Endpoint]] = set()
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != ESTABLISHED or fields[9] not in inodes:
                continue
            (local, local_port), (remote, remote_port) = (f.split(":") for f in fields[1:3])
            found.add(((_address(local), int(local_port, 16)), (_address(remote), int(remote_port, 16))))
    return found


class FabricCut:
    """`with FabricCut(pid, peers):` every packet between process `pid` and the processes `peers` is dropped;
    leaving the block (or `restore()`) lets them through again. Connections opened after entering are not cut."""

    def __init__(self, pid: int, peers: Iterable[int]) -> None:
        theirs = {own for peer in peers for own, _ in connections(peer)}
        self.links = sorted((own, other) for own, other in connections(pid) if other in theirs)
        self._rules: list[tuple[str, list[str]]] = []

    def __enter__(self) -> FabricCut:
        if not self.links:
            raise RuntimeError("no TCP connection between the process and its peers to cut")
        try:
            for (address, port), (peer_address, peer_port) in self.links:
                tool = "ip6tables-legacy" if ":" in address else "iptables-legacy"
                for source, sport, destination, dport in ((address, port, peer_address, peer_port),
                                                          (peer_address, peer_port, address, port)):
                    rule = ["OUTPUT", "-p", "tcp", "-s", source, "--sport", str(sport), "-d", destination,
                            "--dport", str(dport), "-m", "comment", "--comment", COMMENT, "-j", "DROP"]
                    subprocess.run([tool, "-w", "-I", *rule], check=True, capture_output=True, timeout=30)
                    self._rules.append((tool, rule))
        except BaseException:
            self.restore()
            raise
        return self

    def restore(self) -> None:
        """Every rule this cut added removed (each once, whatever failed before)."""
        while self._rules:
            tool, rule = self._rules.pop()
            subprocess.run([tool, "-w", "-D", *rule], capture_output=True, timeout=30)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.restore()
