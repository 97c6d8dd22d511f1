"""Which NIC ports a process's NCCL may use, read from the two variables that restrict them, and whether a GPU's
preferred ports survive them.

The variables, as NCCL documents them (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html, "System
configuration") and as it parses them (NVIDIA/nccl at commit 5067397c, after v2.30.7-1):

- NCCL_IB_HCA: a comma-separated list of `<hca>[:<port>[:<rail>[:<plane>]]]`; a leading `^` makes it an exclude
  list, a `=` after it (or alone) makes the names exact instead of prefixes. src/transport/net_ib/init.cc strips the
  `^` first and the `=` second, so `^=mlx5_1` works and `=^mlx5_1` names a device called `^mlx5_1`. A port that is
  absent or empty matches every port. At most 32 entries are read (MAX_IB_DEVS, src/transport/net_ib/common.h).
- NCCL_SOCKET_IFNAME: the same list of interface names or prefixes (no ports), parsed the same way by src/os/linux.cc
  `ncclOsFindInterfaces`, at most 16 entries (MAX_IFS, src/include/socket.h). src/misc/socket.cc reads it only when
  it is longer than one character.

src/misc/utils.cc `parseStringList` splits on `,` (empty entries vanish, as with strtok) and then on `:`, skips an
entry whose name is empty, and reads a port with atoi. `matchIfList` matches a name by prefix (strncmp over the
entry's length) or, when exact, whole; an empty list matches everything, so `^` alone excludes everything.

What each variable governs follows the transport NCCL uses: its verbs transport (NCCL_NET unset or "IB", and
NCCL_IB_DISABLE not set to a non-zero number) picks RDMA devices by NCCL_IB_HCA alone, and NCCL_SOCKET_IFNAME then
only chooses the interfaces of bootstrap and of the socket transport, i.e. the plain interfaces. With the verbs
transport off (NCCL_IB_DISABLE=1 or NCCL_NET=Socket) the socket transport carries the data, over any interface
NCCL_SOCKET_IFNAME allows, the netdevs of RDMA devices included. A network plugin (any other NCCL_NET) is governed
by neither.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .topology import Nic

IB_HCA = "NCCL_IB_HCA"
SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"
VARIABLES = (IB_HCA, SOCKET_IFNAME)

_MAX_ENTRIES = {IB_HCA: 32, SOCKET_IFNAME: 16}
_C_INT = re.compile(r"\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_C_DECIMAL = re.compile(r"\s*([+-]?[0-9]+)")


@dataclass(frozen=True)
class NameList:
    """One of NCCL's device/interface lists, parsed as NCCL parses it. `entries` are (name or prefix, port); port
    -1 means any."""

    exclude: bool
    exact: bool
    entries: tuple[tuple[str, int], ...]

    def matches(self, name: str, port: int = -1) -> bool:
        """Whether an entry of the list names `name` (and `port`): NCCL's `matchIfList`."""
        if not self.entries:
            return True
        return any((name == ref if self.exact else name.startswith(ref)) and (port == -1 or ref_port in (-1, port))
                   for ref, ref_port in self.entries)

    def allows(self, name: str, port: int = -1) -> bool:
        """Whether NCCL may use `name` (and `port`) under this list: a match, or no match of an exclude list."""
        return self.matches(name, port) != self.exclude


@dataclass(frozen=True)
class AllowedNics:
    """The variables a process sets, parsed, and which NIC ports each of them governs and allows."""

    lists: Mapping[str, NameList]
    verdicts: Mapping[tuple[str, str], Mapping[str, bool]]  # (device, port) -> {variable: allowed}, governed only

    def usable(self, device: str, port: str) -> bool:
        """Whether no variable the process sets rules the port out."""
        return all(self.verdicts.get((device, port), {}).values())


def parse(value: str, max_entries: int = 32) -> NameList:
    """A list as NCCL reads it (see the module docstring)."""
    exclude = value.startswith("^")
    if exclude:
        value = value[1:]
    exact = value.startswith("=")
    if exact:
        value = value[1:]
    entries: list[tuple[str, int]] = []
    for token in (t for t in value.split(",") if t):
        name, _, rest = token.partition(":")
        if not name:
            continue
        port_text = rest.partition(":")[0]
        entries.append((name, _atoi(port_text) if port_text else -1))
        if len(entries) == max_entries:
            break
    return NameList(exclude, exact, tuple(entries))


def lists(env: Mapping[str, str]) -> dict[str, NameList]:
    """The variables of VARIABLES the environment sets so that NCCL reads them, parsed."""
    found: dict[str, NameList] = {}
    ib_hca = env.get(IB_HCA)
    if ib_hca is not None:
        found[IB_HCA] = parse(ib_hca, _MAX_ENTRIES[IB_HCA])
    ifname = env.get(SOCKET_IFNAME)
    if ifname is not None and len(ifname) > 1:
        found[SOCKET_IFNAME] = parse(ifname, _MAX_ENTRIES[SOCKET_IFNAME])
    return found


def allowed(env: Mapping[str, str], nics: Iterable[Nic]) -> AllowedNics | None:
    """What NCCL_IB_HCA and NCCL_SOCKET_IFNAME in a process's environment leave usable of the node's NICs; None
    when the process sets neither."""
    parsed = lists(env)
    if not parsed:
        return None
    verbs, sockets = _transports(env)
    verdicts: dict[tuple[str, str], dict[str, bool]] = {}
    for nic in nics:
        for port in nic.ports:
            verdict = _verdict(parsed, nic, port, verbs=verbs, sockets=sockets)
            if verdict:
                verdicts[(nic.device, port)] = verdict
    return AllowedNics(parsed, verdicts)


def excluded_preferred(allowed_nics: AllowedNics, preferred: Iterable[tuple[str, str]]) -> dict[str, bool]:
    """For each variable the process sets: True when it governs some of a GPU's preferred (device, port) pairs and
    allows none of them, so the GPU's traffic must take a longer path than the node offers; False otherwise."""
    ports = list(preferred)
    result: dict[str, bool] = {}
    for variable in allowed_nics.lists:
        governed = [allowed_nics.verdicts[p][variable] for p in ports
                    if variable in allowed_nics.verdicts.get(p, {})]
        result[variable] = bool(governed) and not any(governed)
    return result


# --- helpers -----------------------------------------------------------------------------------------------------

def _transports(env: Mapping[str, str]) -> tuple[bool, bool]:
    """(verbs transport on, socket transport possible) for the environment."""
    net = env.get("NCCL_NET", "").lower() or None
    ib_disabled = bool(env.get("NCCL_IB_DISABLE")) and _strtoll(env["NCCL_IB_DISABLE"]) != 0
    verbs = net in (None, "ib") and not ib_disabled
    sockets = net in (None, "socket")
    return verbs, sockets


def _verdict(parsed: Mapping[str, NameList], nic: Nic, port: str, *, verbs: bool, sockets: bool) -> dict[str, bool]:
    """{variable: allowed} for the variables that govern this NIC port."""
    verdict: dict[str, bool] = {}
    hca = parsed.get(IB_HCA)
    if hca is not None and nic.rdma and verbs:
        verdict[IB_HCA] = hca.allows(nic.device, int(port) if port.isascii() and port.isdigit() else -1)
    ifname = parsed.get(SOCKET_IFNAME)
    if ifname is not None and sockets and nic.netdevs and (not nic.rdma or not verbs):
        verdict[SOCKET_IFNAME] = any(ifname.allows(netdev) for netdev in nic.netdevs)
    return verdict


def _atoi(text: str) -> int:
    """C's atoi: the leading decimal number, 0 when there is none."""
    match = _C_DECIMAL.match(text)
    return int(match.group(1)) if match else 0


def _strtoll(text: str) -> int:
    """C's strtoll with base 0 (decimal, 0x hexadecimal, 0 octal): the leading number, 0 when there is none."""
    match = _C_INT.match(text)
    if match is None:
        return 0
    sign, digits = match.groups()
    if digits[:2].lower() == "0x":
        value = int(digits, 16)
    elif digits.startswith("0"):
        value = int(digits, 8)
    else:
        value = int(digits)
    return -value if sign == "-" else value
