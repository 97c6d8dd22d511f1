"""What the health command finds on a node (exporter.health.command.assess), from the node's real nvml source as
the daemon renders it: the states it reads as they are now (NVIDIA's recovery action, the volatile uncorrected ECC
count), which clear at the GPU's reset."""

from __future__ import annotations

from conftest import ManualClock
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.exposition import TEXT, Renderer
from exporter.health.command import HealthConfig, Reading, assess
from exporter.health.risk import DRAIN
from exporter.sources.nvml.simulated import SimulatedGpus
from exporter.sources.nvml.source import NvmlSource

SLOW = 60.0  # past nvml.slow_interval: the ECC counts are slow readings


def _reading(source: NvmlSource, clock: ManualClock) -> Reading:
    text = Renderer().render(source.collect(), TEXT).decode()
    samples = [(s.name, dict(s.labels), s.value)
               for family in text_string_to_metric_families(text) for s in family.samples]
    return Reading(samples, clock.now)


def test_the_recovery_action_and_an_uncorrected_ecc_count_drain_until_the_reset() -> None:
    clock = ManualClock(1000.0)
    gpus = SimulatedGpus(3, clock=clock)
    source = NvmlSource(gpus, clock=clock)
    memory: dict = {}  # type: ignore[type-arg]
    config = HealthConfig()
    clock.advance(1)
    assert assess(_reading(source, clock), memory, config) == []
    gpus.set_recovery_action(1, 2)  # the driver: node reboot required
    gpus.inject_ecc(2, uncorrected=True)
    clock.advance(SLOW)
    found = {(f.gpu, f.reason): f for f in assess(_reading(source, clock), memory, config)}
    assert set(found) == {("1", "recovery_action"), ("2", "ecc_uncorrected")}, found
    assert all(f.level == DRAIN for f in found.values())
    assert found[("1", "recovery_action")].evidence == "goodput_gpu_recovery_action=2"
    # still there at the next run: states, not events that age out
    clock.advance(SLOW)
    assert {(f.gpu, f.reason) for f in assess(_reading(source, clock), memory, config)} == set(found)
    gpus.reset(1)
    gpus.reset(2)
    clock.advance(SLOW)
    assert assess(_reading(source, clock), memory, config) == []
