"""The caches and shortcuts that keep collection and scraping cheap give exactly what the plain computation gives:
the simulator's (shared patterns, kept samples, field plans), the NVML source's (label tuples kept per GPU, rows
appended straight to the batch and taken back when a GPU stops answering), the renderer's (series prefixes,
headers, the value formatter) and the store's (gzip from per-block deflate segments, compressed ahead at publish
time), and /metrics answered ahead of FastAPI's routing."""

from __future__ import annotations

import asyncio
import gzip
import math
import random
import zlib
from types import SimpleNamespace

import httpx
import pytest
from conftest import ManualClock, series, value

from exporter.core import exposition
from exporter.core.exposition import OPENMETRICS, TEXT, Batch, Renderer, format_value
from exporter.core.http import create_app
from exporter.core.store import Store
from exporter.sources.host import metrics as host_metrics
from exporter.sources.nvml import metrics as c
from exporter.sources.nvml.api import FI_NVLINK_DATA_TX_KIB, FI_PCIE_TX_BYTES, UNKNOWN
from exporter.sources.nvml.simulated import SAMPLE_PERIOD_US, Pattern, SimulatedGpus
from exporter.sources.nvml.source import NvmlSource

# --- the simulator --------------------------------------------------------------------------------------------


def reference_sample(sim: SimulatedGpus, index: int, end_us: int) -> float:
    """A utilization sample as the simulator defines it, from the pattern's integral and nothing cached."""
    gpu = sim._gpus[index]
    t1 = end_us / 1e6
    t0 = (end_us - SAMPLE_PERIOD_US) / 1e6
    busy = gpu.pattern.busy_between(t0 - sim._start + gpu.offset, t1 - sim._start + gpu.offset)
    return float(round(100.0 * busy / (t1 - t0)))


def test_busy_until_is_the_idle_integral_it_inlines() -> None:
    rng = random.Random(5)
    pattern = Pattern.training(rng)
    times = [-1.0, 0.0, *pattern.ends[:50], pattern.period, 2.5 * pattern.period,
             *(rng.uniform(0, 5 * pattern.period) for _ in range(2000))]
    for t in times:
        assert pattern.busy_until(t) == max(t, 0.0) - pattern.seconds_until(t, "idle")


def test_samples_and_utilization_are_the_uncached_values_across_polls_and_pattern_changes() -> None:
    clock = ManualClock()
    sim = SimulatedGpus(3, seed=4, clock=clock)
    since = [0, 0, 0]
    for step in range(120):
        clock.advance(0.37 if step % 5 else 3.1)  # uneven polls; now and then more than the cache holds
        if step == 60:
            sim.set_pattern(1, Pattern.square(0.05, 0.25), offset=0.003)
        for index in range(3):
            handle = sim.device_handle(index)
            samples = sim.device_utilization_samples(handle, since[index])
            assert samples == [(ts, reference_sample(sim, index, ts)) for ts, _ in samples]
            if samples:
                since[index] = samples[-1][0]
            newest = int(sim.last_sample_time() * 1e6)
            assert sim.device_utilization_percent(handle) == int(reference_sample(sim, index, newest))


def test_gpus_share_one_pattern_until_one_is_given_its_own() -> None:
    clock = ManualClock()
    sim = SimulatedGpus(4, clock=clock)
    assert len({id(gpu.pattern) for gpu in sim._gpus}) == 1
    clock.advance(30)
    energy_before = [sim.energy_millijoules(i) for i in range(4)]
    sim.set_pattern(2, Pattern.square(1.0, 1.0))
    assert sim._gpus[0].pattern is sim._gpus[3].pattern is not sim._gpus[2].pattern
    energy_after = [sim.energy_millijoules(i) for i in range(4)]
    assert energy_after[:2] == energy_before[:2] and energy_after[3] == energy_before[3]
    # GPU 2's energy is now its new pattern's from the start: 15 s busy and 15 s idle of the 30
    assert energy_after[2] - 3_600_000_000 == pytest.approx((70 * 30 + 630 * 15) * 1000, abs=1)


def test_field_values_follow_fields_made_unsupported_later() -> None:
    clock = ManualClock()
    sim = SimulatedGpus(1, clock=clock)
    handle = sim.device_handle(0)
    clock.advance(10)
    fields = [(FI_PCIE_TX_BYTES, 0), (FI_NVLINK_DATA_TX_KIB, 3), (FI_NVLINK_DATA_TX_KIB, 99), (12345, 0)]
    first = sim.device_field_values(handle, fields)
    assert first[0] is not None and first[1] is not None and first[2:] == [None, None]
    sim.set_unsupported(0, f"field:{FI_NVLINK_DATA_TX_KIB}")
    assert sim.device_field_values(handle, fields)[1:] == [None, None, None]
    assert sim.device_field_values(handle, fields[:1]) == [first[0]]  # another list of fields, its own plan


# --- the NVML source ------------------------------------------------------------------------------------------


def test_a_gpu_that_stops_answering_has_its_rows_taken_back_and_the_others_keep_theirs() -> None:
    clock = ManualClock()
    sim = SimulatedGpus(3, clock=clock)
    source = NvmlSource(sim, clock=clock)
    clock.advance(2)
    healthy = source.collect()
    sim.fail("*", UNKNOWN, gpu=1)  # every query of GPU 1 fails, after its counters have values
    clock.advance(1)
    batch = source.collect()
    text = Renderer().render(batch, TEXT).decode()
    uuids = [sim.uuid(i) for i in range(3)]
    assert value(text, "goodput_gpu_up", gpu="1") == 0
    assert value(text, "goodput_gpu_info", gpu="1") == 1
    gpu1 = [(name, labels) for name in {m.name for m in batch.series}
            for labels in series(text, name) if labels.get("gpu") == "1"]
    # its identity stays, and with it its capacity (the MFU denominator of the job that holds it), and its losses
    assert sorted({name for name, _ in gpu1}) == ["goodput_gpu_info", "goodput_gpu_lost_total",
                                                   "goodput_gpu_peak_flops", "goodput_gpu_up"]
    assert value(text, "goodput_gpu_lost_total", gpu="1") == 1
    for metric, rows in healthy.series.items():  # GPUs 0 and 2: every series, in GPU order
        expected = [labels[:2] for labels, _ in rows if labels[0] != "1"]
        assert [labels[:2] for labels, _ in batch.series[metric] if labels[0] != "1"] == expected
    assert [labels for labels, _ in batch.series[c.GPU_UP]] == [("0", uuids[0]), ("1", uuids[1]), ("2", uuids[2])]
    assert all(rows for rows in batch.series.values())  # no metric left without rows


def test_label_tuples_follow_a_gpu_identified_late() -> None:
    clock = ManualClock()
    sim = SimulatedGpus(2, clock=clock)
    source = NvmlSource(sim, clock=clock)
    sim.fail("device_uuid", UNKNOWN, gpu=1, calls=1)  # unreadable at start-up: placeholder labels
    clock.advance(1)
    source.collect()
    clock.advance(1)
    batch = source.collect()
    assert ("1", sim.uuid(1), "corrected") in batch.values(c.GPU_ECC_ERRORS)
    assert ("1", sim.uuid(1), "thermal") in batch.values(c.GPU_THROTTLE_SECONDS)
    assert ("1", sim.uuid(1)) in batch.values(c.GPU_IDLE_SECONDS)


# --- rendering ------------------------------------------------------------------------------------------------


def reference_format(value: float) -> str:
    if isinstance(value, int):
        return str(int(value))
    if value != value:
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def test_format_value_is_the_reference_formatting() -> None:
    rng = random.Random(3)
    values: list[float] = [0.0, -0.0, 1.0, -1.0, 0.5, 1e15, -1e15, 1e15 - 1, 999999999999999.9, 1e20, 1e-300,
                           float("nan"), float("inf"), float("-inf"), True, False, 0, 7, -3, 10**20]
    values += [rng.uniform(-1e6, 1e6) for _ in range(500)] + [float(rng.randrange(-10**16, 10**16)) for _ in range(500)]
    for v in values:
        assert format_value(v) == reference_format(v), v


def test_renderer_caches_give_a_fresh_renderers_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exposition, "PREFIX_CACHE_SLACK", 0)  # forget gone series many times on the way
    kept = Renderer()
    for round_ in range(30):
        batch = Batch()
        for i in range(10):
            batch.add(host_metrics.HOST_PROC_THREADS, (str(i + 3 * round_), f"cmd{i % 3}"), i * 0.5)
            batch.add(c.GPU_UP, (str(i), f"GPU-{i}"), i % 2)
        for fmt in (TEXT, OPENMETRICS):
            assert kept.render(batch, fmt) == Renderer().render(batch, fmt)
        # sized by what is live: the 20 series rendered, and at most as many of those gone
        assert sum(len(p) for p in kept._prefixes.values()) == kept._cached <= 2 * 20


# --- the store and /metrics -----------------------------------------------------------------------------------


def nvml_batch(clock: ManualClock, source: NvmlSource) -> Batch:
    clock.advance(1)
    return source.collect()


def decompress_one_member(body: bytes) -> bytes:
    """As httpx does: one gzip member, anything after it ignored (so there must be nothing)."""
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = decompressor.decompress(body) + decompressor.flush()
    assert decompressor.eof and not decompressor.unused_data
    return out


def test_gzip_from_block_segments_is_one_member_of_the_plain_body() -> None:
    clock = ManualClock()
    source = NvmlSource(SimulatedGpus(4, clock=clock), clock=clock)
    extra = [0]  # the process metrics' stand-in: new each step, rendered anew by every scrape
    store = Store(extra=lambda fmt: f"extra_series {extra[0]}\n".encode(), extra_ttl=0.0, order=("nvml",))
    for step in range(6):
        extra[0] = step
        store.publish("nvml", nvml_batch(clock, source))
        batch = Batch()
        batch.add(c.GPU_UP, ("9", f"GPU-{step}"), 1)
        store.publish("other" if step != 3 else "withdrawn", batch)
        if step == 4:
            store.publish("withdrawn", None)
        for fmt in (TEXT, OPENMETRICS):
            zipped = store.exposition(fmt, compress=True)
            plain = store.exposition(fmt)
            assert gzip.decompress(zipped) == decompress_one_member(zipped) == plain
            assert plain.endswith(b"# EOF\n") == (fmt == OPENMETRICS)


def test_a_block_is_compressed_at_publish_once_its_predecessor_was_served_compressed() -> None:
    clock = ManualClock()
    source = NvmlSource(SimulatedGpus(2, clock=clock), clock=clock)
    store = Store()
    store.publish("nvml", nvml_batch(clock, source))
    store.publish("nvml", nvml_batch(clock, source))
    assert store._blocks["nvml"].deflated == {}  # nobody asked for gzip yet
    store.exposition(TEXT)
    store.publish("nvml", nvml_batch(clock, source))
    assert store._blocks["nvml"].deflated == {}
    store.exposition(OPENMETRICS, compress=True)
    store.publish("nvml", nvml_batch(clock, source))
    assert set(store._blocks["nvml"].deflated) == {OPENMETRICS}
    body = store.exposition(OPENMETRICS, compress=True)
    assert gzip.decompress(body) == store.exposition(OPENMETRICS)


OPENMETRICS_ACCEPT = "application/openmetrics-text; version=1.0.0"


@pytest.mark.parametrize("headers", [{}, {"accept-encoding": "gzip"}, {"accept": OPENMETRICS_ACCEPT},
                                     {"accept": OPENMETRICS_ACCEPT, "accept-encoding": "gzip, deflate"}])
def test_metrics_fast_path_answers_as_the_route(headers: dict[str, str]) -> None:
    clock = ManualClock()
    store = Store()
    store.publish("nvml", nvml_batch(clock, NvmlSource(SimulatedGpus(2, clock=clock), clock=clock)))
    daemon = SimpleNamespace(store=store)
    fast = create_app(daemon)  # type: ignore[arg-type]
    routed = create_app(daemon)  # type: ignore[arg-type]
    routed.user_middleware.clear()  # FastAPI's route alone

    async def ask(app: object, method: str = "GET") -> httpx.Response:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://exporter") as client:
            return await client.request(method, "/metrics", headers=headers)

    ours, theirs = asyncio.run(ask(fast)), asyncio.run(ask(routed))
    assert ours.status_code == theirs.status_code == 200
    assert ours.headers.multi_items() == theirs.headers.multi_items()
    assert ours.content == theirs.content
    assert asyncio.run(ask(fast, "POST")).status_code == 405  # other methods: the route's answer
