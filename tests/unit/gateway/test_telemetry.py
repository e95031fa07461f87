"""The gateway's kvtide_* families: router telemetry from the intake's health and the index,
the fleet early warning from the engines' scraped kvtide_cache_* counters."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from prometheus_client.parser import text_string_to_metric_families

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.gateway.intake import EventIntake
from kvtide.gateway.telemetry import GatewayTelemetry, parse_cache_samples
from kvtide.routing import GlobalPrefixIndex
from kvtide.routing.consistency import IndexHealth
from kvtide.telemetry import CacheTelemetry, PrometheusRecorder
from kvtide.telemetry import metrics as m
from kvtide.telemetry.detector import DetectorConfig, Sample
from kvtide.types import BlockHash, ReplicaId

R0, R1 = ReplicaId("r0"), ReplicaId("r1")


def _families(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text.decode()):
        out[fam.name] = [(s.labels, s.value) for s in fam.samples]
    return out


def _engine_exposition(clock: ManualClock, accesses: int) -> tuple[bytes, PrometheusRecorder]:
    cache = KVCache(CacheConfig(capacity_blocks=4, block_tokens=16), clock)
    rec = PrometheusRecorder()
    tel = CacheTelemetry(rec, cache)
    for i in range(accesses):
        cache.access([i % 5 + 1, i % 5 + 10], 40)
    tel.collect()
    return rec.exposition(), rec


def test_scraped_cache_counters_read_back_as_the_engine_recorded_them() -> None:
    clock = ManualClock()
    body, rec = _engine_exposition(clock, 20)
    samples = parse_cache_samples(b"vllm:num_requests_running 1.0\n" + body)
    expected = Sample.of(0.0, [rec])
    tel = GatewayTelemetry(IndexHealth(), GlobalPrefixIndex(), clock)
    tel.scraped(R0, body)
    got = Sample.of(0.0, [tel.engines[R0].recorder])
    assert got == expected and got.prompt_tokens > 0 and got.miss_evicted_tokens > 0
    assert samples[("kvtide_cache_capacity_blocks", ("device",))] == 4


def test_an_engine_restart_does_not_make_fleet_counters_go_back() -> None:
    clock = ManualClock()
    tel = GatewayTelemetry(IndexHealth(), GlobalPrefixIndex(), clock)
    before, _ = _engine_exposition(clock, 30)
    after, _ = _engine_exposition(clock, 5)  # a fresh process: its counters start again
    tel.scraped(R0, before)
    first = Sample.of(0.0, [tel.engines[R0].recorder]).prompt_tokens
    tel.scraped(R0, after)
    second = Sample.of(0.0, [tel.engines[R0].recorder]).prompt_tokens
    assert second == first + 5 * 40


def test_router_families_from_intake_health_regret_and_the_index() -> None:
    clock = ManualClock()
    index = GlobalPrefixIndex()
    health = IndexHealth()
    tel = GatewayTelemetry(health, index, clock)
    path = [BlockHash(h) for h in (11, 12, 13, 14)]
    index.add(R0, path)
    index.add(R1, path[:2])  # a shorter prefix: does not hold the hot one
    with ThreadPoolExecutor(1) as pool:
        intake = EventIntake(
            R0, "tcp://127.0.0.1:9", None, 16, lambda s: 0, index, pool, health=health
        )
        try:
            # what the worker's ingest counted, moved into the router's health on the loop
            intake.ingest.health.lag(R0, 0.3)
            intake.ingest.health.gap(R0, 4)
            intake.ingest.health.repaired(R0, resync=True)
            intake.publish_health()
            intake.publish_health()  # nothing new: nothing added twice
        finally:
            intake.close()
    health.report(R0, 64, 48)
    health.report(R0, 64, 32, evicted_queued=True)  # the engine evicted 32 while it queued
    for _ in range(3):
        tel.routed(path)
    fams = _families(tel.exposition())
    assert fams["kvtide_router_events_lost"] == [({}, 4.0)]
    assert fams["kvtide_router_resyncs"] == [({}, 1.0)]
    assert fams["kvtide_router_index_lag_seconds"] == [({}, 0.3)]
    assert fams["kvtide_router_index_max_lag_seconds"] == [({}, 0.3)]
    assert fams["kvtide_router_predicted_cached_tokens"] == [({}, 128.0)]
    assert fams["kvtide_router_reported_cached_tokens"] == [({}, 80.0)]
    assert fams["kvtide_router_regret_tokens"] == [({}, 48.0)]
    assert fams["kvtide_router_evicted_queued_tokens"] == [({}, 32.0)]
    assert fams["kvtide_router_prefix_replication_replicas"] == [({}, 1.0)]
    assert health.is_trusted  # the gap was repaired within its poll: trust untouched


def test_counters_exist_at_zero_before_anything_happened() -> None:
    tel = GatewayTelemetry(IndexHealth(), GlobalPrefixIndex(), ManualClock())
    fams = _families(tel.exposition())
    for name in (
        "kvtide_router_events_lost",
        "kvtide_router_resyncs",
        "kvtide_router_evicted_queued_tokens",
    ):
        assert fams[name] == [({}, 0.0)]


def test_the_fleet_detector_fires_from_scraped_engines_and_sets_its_metric() -> None:
    clock = ManualClock()
    config = DetectorConfig(fast_s=10.0, slow_s=30.0, interval_s=1.0, for_s=0.0)
    tel = GatewayTelemetry(IndexHealth(), GlobalPrefixIndex(), clock, config)
    engines = [KVCache(CacheConfig(capacity_blocks=64, block_tokens=16), clock) for _ in range(2)]
    recs = [PrometheusRecorder() for _ in engines]
    tels = [CacheTelemetry(r, c) for r, c in zip(recs, engines, strict=True)]
    fired = []
    for step in range(40):  # first uses only, a pool still filling: a cold start
        clock.advance(1.0)
        for k, (cache, ct, rec) in enumerate(zip(engines, tels, recs, strict=True)):
            cache.access([1000 * k + step * 2 + 1, 1000 * k + step * 2 + 2], 40)
            ct.collect()
            tel.scraped(ReplicaId(f"r{k}"), rec.exposition())
        fired += tel.tick()
    assert [a.name for a in fired] == ["cold_start"]
    assert tel.recorder.value(m.ALERT_ACTIVE, ("cold_start",)) == 1.0
