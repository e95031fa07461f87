"""Declarations and recorders: names, the Prometheus text format, promtool's linter."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.routing.consistency import IndexHealth
from kvtide.telemetry import (
    CacheTelemetry,
    EarlyWarning,
    NullRecorder,
    PrometheusRecorder,
    RouterTelemetry,
)
from kvtide.telemetry import metrics as m

PROMTOOL = shutil.which("promtool")


def test_declarations_follow_the_naming_rules() -> None:
    assert len(m.BY_NAME) == len(m.ALL) >= 25
    with pytest.raises(ValueError, match="_total"):
        m.Metric("kvtide_cache_things_blocks", m.Kind.COUNTER, "blocks", "x")
    with pytest.raises(ValueError, match="subsystem"):
        m.Metric("cache_hits_total", m.Kind.COUNTER, "x", "x")
    with pytest.raises(ValueError, match="bounded"):
        m.Metric("kvtide_cache_x_total", m.Kind.COUNTER, "x", "x", ("request_id",))


def _scraped(clock: ManualClock) -> PrometheusRecorder:
    cache = KVCache(CacheConfig(capacity_blocks=4, block_tokens=16), clock)
    rec = PrometheusRecorder()
    tel = CacheTelemetry(rec, cache)
    health = IndexHealth()
    health.lag("r0", 0.25)
    health.gap("r0", 3)
    health.report("r0", 64, 32)
    router = RouterTelemetry(rec, health, lambda block: 2)
    for i in range(12):
        clock.advance(1.0)
        cache.access([i % 3 + 1, i % 3 + 10], 40, tenant=f"t{i % 2}")
        router.routed([i % 3 + 1, i % 3 + 10])
    tel.collect()
    router.collect()
    EarlyWarning(recorder=rec).recorder.set(m.ALERT_ACTIVE, 0.0, ("pool_undersized",))
    return rec


def test_every_family_parses_with_prometheus_clients_text_parser(clock: ManualClock) -> None:
    text = _scraped(clock).exposition().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for metric in m.ALL:
        assert metric.name.removesuffix("_total") in families, metric.name
    lifetime = families["kvtide_cache_block_lifetime_seconds"]
    buckets = [s for s in lifetime.samples if s.name.endswith("_bucket")]
    assert [s.value for s in buckets] == sorted(s.value for s in buckets)  # cumulative
    assert buckets[-1].labels["le"] == "+Inf"
    count = next(s.value for s in lifetime.samples if s.name.endswith("_count"))
    assert count == buckets[-1].value > 0
    lost = next(s.value for s in families["kvtide_router_events_lost"].samples)
    assert lost == 3
    replication = families["kvtide_router_prefix_replication_replicas"].samples[0]
    assert replication.value == 2


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian's prometheus) not installed")
def test_exposition_passes_promtool_check_metrics(clock: ManualClock) -> None:
    assert PROMTOOL is not None
    text = _scraped(clock).exposition()
    proc = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_null_recorder_takes_every_call() -> None:
    rec = NullRecorder()
    rec.inc(m.LOOKUPS, 1, ("device",))
    rec.set(m.USED_BLOCKS, 3)
    rec.observe(m.BLOCK_IDLE, 1.0)
    rec.observe_buckets(m.BLOCK_IDLE, [1] * (len(m.SECONDS_BUCKETS) + 1), 5.0)


def test_hot_prefixes_keep_the_heavy_hitters() -> None:
    from kvtide.telemetry import HotPrefixes

    hot = HotPrefixes(capacity=3, depth_blocks=2)
    for _ in range(10):
        hot.add([1, 2, 3])
    for i in range(6):
        hot.add([100 + i, 200 + i])  # one-offs churn through the other counters
    for _ in range(5):
        hot.add([7])
    assert hot.top(1) == [(1, 2)]
    assert (7,) in hot.top(3)
    assert len(hot.counts) == len(hot.paths) == 3
