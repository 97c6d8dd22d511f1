"""What the fabric source costs on a node with 8 NICs x 2 ports: CPU and wall time per collection.

The sysfs tree is written to a temporary directory in the real layout (class/infiniband/mlx5_N/ports/{1,2} with
InfiniBand's counters/ and mlx5's hw_counters/ file names, the netdevs of each port with statistics/, a PCI
tree of 8 GPUs and 8 NICs, two to a PCIe switch); the source reads it exactly as it reads /sys. Reading real
sysfs costs more per file than reading a file on tmpfs or disk: each read of an InfiniBand `counters/` file is a
query to the adapter's firmware (a MAD), so the figures are a lower bound of the source's own work. Each round
times one collect() on this process's CPU clock and on the wall clock; medians of ROUNDS. Run alone with
`python bench/fabric_collect.py`.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from exporter.core.gpus import GpuIdentity, NodeGpus
from exporter.sources.fabric.counters import HW_COUNTERS, INTERFACE_COUNTERS, PORT_COUNTERS
from exporter.sources.fabric.source import FabricSource
from exporter.sources.fabric.sysfs import HostSysfs

NICS = 8
PORTS = 2
ROUNDS = 200
# mlx5 hw_counters the source does not export, present on real ports all the same (read past, not read)
OTHER_HW = ("out_of_buffer", "rx_write_requests", "rx_read_requests", "rx_atomic_requests", "resp_cqe_error",
            "req_cqe_error", "req_remote_access_errors", "resp_local_length_error", "lifespan",
            "rx_icrc_encapsulated", "roce_adp_retrans_to", "resp_cqe_flush_error", "req_cqe_flush_error")
OTHER_NET = ("multicast", "rx_compressed", "tx_compressed", "rx_length_errors", "tx_aborted_errors",
             "tx_heartbeat_errors", "tx_window_errors", "rx_nohandler")


@dataclass
class Result:
    nics: int
    ports: int
    files: int  # counter and state files per collection
    series: int
    cpu_ms: float
    wall_ms: float


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def build(root: Path) -> list[GpuIdentity]:
    gpus = []
    for i in range(NICS):
        bus = 0x18 + 0x10 * i
        rc = "pci0000:00" if i < NICS // 2 else "pci0000:80"
        switch = root / "devices" / rc / f"0000:{rc[-2:]}:{1 + i % 4:02x}.0" / f"0000:{bus - 2:02x}:00.0"
        gpu = switch / f"0000:{bus - 1:02x}:00.0" / f"0000:{bus:02x}:00.0"
        nic = switch / f"0000:{bus - 1:02x}:01.0" / f"0000:{bus + 1:02x}:00.0"
        for dev in (gpu, nic):
            _write(dev / "numa_node", str(0 if i < NICS // 2 else 1))
            link = root / "bus" / "pci" / "devices" / dev.name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(dev, link.parent))
        gpus.append(GpuIdentity(str(i), f"GPU-{i:08x}-0000-0000-0000-000000000000", f"00000000:{bus:02X}:00.0"))
        ib = nic / "infiniband" / f"mlx5_{i}"
        (ib / "device").parent.mkdir(parents=True, exist_ok=True)
        (ib / "device").symlink_to(os.path.relpath(nic, ib))
        cls = root / "class" / "infiniband" / f"mlx5_{i}"
        cls.parent.mkdir(parents=True, exist_ok=True)
        cls.symlink_to(os.path.relpath(ib, cls.parent))
        for port in range(1, PORTS + 1):
            base = ib / "ports" / str(port)
            _write(base / "state", "4: ACTIVE")
            _write(base / "phys_state", "5: LinkUp")
            _write(base / "rate", "200 Gb/sec (4X HDR)")
            _write(base / "link_layer", "Ethernet")
            for n, name in enumerate(PORT_COUNTERS):
                _write(base / "counters" / name, str(1_000_003 * (n + 1) + i))
            for n, name in enumerate((*HW_COUNTERS, *OTHER_HW)):
                _write(base / "hw_counters" / name, str(7_919 * (n + 1) + port))
            netdev = nic / "net" / f"ens{i}f{port - 1}np{port - 1}"
            _write(netdev / "dev_port", str(port - 1))
            for name, text in (("operstate", "up"), ("speed", "200000"), ("mtu", "4200"), ("carrier_changes", "2")):
                _write(netdev / name, text)
            for n, name in enumerate((*INTERFACE_COUNTERS, *OTHER_NET)):
                _write(netdev / "statistics" / name, str(104_729 * (n + 1)))
            (netdev / "device").symlink_to(os.path.relpath(nic, netdev))
            net = root / "class" / "net" / netdev.name
            net.parent.mkdir(parents=True, exist_ok=True)
            net.symlink_to(os.path.relpath(netdev, net.parent))
    return gpus


def run() -> Result:
    with tempfile.TemporaryDirectory(prefix="fabric-bench-") as tmp:
        gpus = build(Path(tmp))
        table = NodeGpus()
        table.replace({}, tuple(gpus))
        source = FabricSource(HostSysfs(tmp), table)
        batch = source.collect()  # the first collection also computes the topology
        series = sum(len(rows) for rows in batch.series.values())
        cpu, wall = [], []
        for _ in range(ROUNDS):
            c0, w0 = time.process_time(), time.perf_counter()
            source.collect()
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
        per_port = 4 + len(PORT_COUNTERS) + len(HW_COUNTERS)
        per_netdev = 4 + len(INTERFACE_COUNTERS)
        return Result(NICS, PORTS, NICS * PORTS * (per_port + per_netdev), series,
                      statistics.median(cpu) * 1000, statistics.median(wall) * 1000)


def markdown(r: Result) -> list[str]:
    return [
        "",
        "## Fabric source: one collection on 8 NICs x 2 ports",
        "",
        f"A sysfs tree in the real layout ({r.nics} mlx5 RoCE NICs x {r.ports} ports with InfiniBand's counters/ "
        "and mlx5's hw_counters/, their netdevs, a PCI tree of 8 GPUs and 8 NICs) on a temporary directory, read "
        f"by the source as it reads /sys; medians of {ROUNDS} collections. Real sysfs costs more per file (an "
        "InfiniBand counter read is a firmware query): a lower bound of the source's own work. At the default 5 s "
        "interval, CPU per minute is 12 collections. Target: < 5 ms CPU per collection.",
        "",
        "| NICs x ports | files read | series | CPU per collection | wall per collection | CPU s/min at 5 s |",
        "|---|---|---|---|---|---|",
        f"| {r.nics} x {r.ports} | {r.files} | {r.series} | {r.cpu_ms:.2f} ms | {r.wall_ms:.2f} ms | "
        f"{r.cpu_ms * 12 / 1000:.3f} |",
    ]



def section() -> str:
    """This benchmark's part of bench/results.md."""
    return "\n".join(markdown(run()))

if __name__ == "__main__":
    print("\n".join(markdown(run())))
