"""CacheTelemetry on constructed sequences: each miss cause, tier and tenant counted exactly."""

from __future__ import annotations

from dataclasses import dataclass

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.tiers import FreeReload, OnboardPlan, TieredCache, TieredCacheConfig, TierSpec
from kvtide.telemetry import CacheTelemetry, MemoryRecorder, TenantLabels
from kvtide.telemetry import metrics as m
from kvtide.types import Tier

BT = 16


def make(capacity: int, clock: ManualClock) -> tuple[KVCache, MemoryRecorder, CacheTelemetry]:
    cache = KVCache(CacheConfig(capacity_blocks=capacity, block_tokens=BT, policy="lru"), clock)
    rec = MemoryRecorder()
    return cache, rec, CacheTelemetry(rec, cache)


def misses(rec: MemoryRecorder) -> dict[str, float]:
    return {labels[0]: v for labels, v in rec.by_label(m.MISS_TOKENS).items()}


def test_cold_evicted_and_partial_misses_are_counted_exactly(clock: ManualClock) -> None:
    cache, rec, tel = make(2, clock)
    cache.access([1, 2], 2 * BT + 5)  # cold: 2 blocks; partial: 5 tokens
    cache.access([3, 4], 2 * BT)  # cold: 2 blocks; evicts 1, 2
    cache.access([1, 2], 2 * BT)  # evicted then wanted: 2 blocks
    tel.collect()
    assert misses(rec) == {"cold": 4 * BT, "evicted": 2 * BT, "partial_block": 5}
    assert rec.value(m.PROMPT_TOKENS) == 6 * BT + 5
    assert rec.value(m.LOOKUPS, ("device",)) == 3
    assert rec.value(m.HIT_TOKENS, ("device",)) == 0
    assert rec.value(m.EVICTED_BLOCKS, ("device",)) == 4
    assert rec.value(m.ALLOCATED_BLOCKS) == 6
    assert rec.value(m.FREED_BLOCKS) == 4
    cache.access([1, 2, 5], 3 * BT)  # hits 2, one cold block
    tel.collect()  # increments only: nothing counted twice
    assert misses(rec) == {"cold": 5 * BT, "evicted": 2 * BT, "partial_block": 5}
    assert rec.value(m.HIT_TOKENS, ("device",)) == 2 * BT
    assert rec.value(m.CACHED_BLOCKS, ("device",)) == 2
    assert rec.value(m.CAPACITY_BLOCKS, ("device",)) == 2


def test_a_block_cached_under_another_tenant_is_an_other_namespace_miss(
    clock: ManualClock,
) -> None:
    cache, rec, tel = make(8, clock)
    shadow = [101, 102]  # the same content hashed without the tenant salt
    cache.access([11, 12], 2 * BT, tenant="a", shadow_hashes=shadow)
    cache.access([21, 22], 2 * BT, tenant="b", shadow_hashes=shadow)
    tel.collect()
    assert misses(rec) == {"cold": 2 * BT, "other_namespace": 2 * BT}


@dataclass(frozen=True)
class _Plan:
    action: str
    reload_tokens: int
    time_s: float = 1.0
    recompute_s: float = 1.0


class _RecomputeAlways(FreeReload):
    """A cost model whose links are too slow: every lower-tier hit is recomputed."""

    def decide_onboard(
        self,
        cached_tokens_in_tier: int,
        tier: Tier,
        new_tokens: int = 0,
        link_load: float = 0.0,
        *,
        block_tokens: int = 1,
        with_break_even: bool = True,
    ) -> OnboardPlan:
        return _Plan("recompute", 0)


def _tiered(clock: ManualClock, cost: FreeReload) -> TieredCache:
    return TieredCache(
        TieredCacheConfig(device=TierSpec(2, "lru"), host=TierSpec(8, "lru"), block_tokens=BT),
        clock,
        cost,
    )


def test_host_hits_recomputed_because_reloading_was_slower(clock: ManualClock) -> None:
    tiers = _tiered(clock, _RecomputeAlways())
    rec = MemoryRecorder()
    tel = CacheTelemetry(rec, tiers.device, tiers=tiers)
    tiers.access([1, 2], 2 * BT)
    tiers.access([3, 4], 2 * BT)  # 1, 2 go down to the host
    tiers.access([1, 2], 2 * BT)  # found on the host, recomputed
    tel.collect()
    assert rec.value(m.HIT_TOKENS, ("host",)) == 2 * BT
    assert rec.value(m.LOOKUPS, ("host",)) == 3
    assert rec.value(m.LOOKUPS, ("device",)) == 3
    assert misses(rec)["recomputed"] == 2 * BT
    assert rec.value(m.EVICTED_BLOCKS, ("device",)) == 4


def test_reloaded_host_hits_are_not_recomputed_misses(clock: ManualClock) -> None:
    tiers = _tiered(clock, FreeReload())
    rec = MemoryRecorder()
    tel = CacheTelemetry(rec, tiers.device, tiers=tiers)
    for hashes in ([1, 2], [3, 4], [1, 2]):
        tiers.access(hashes, 2 * BT)
    tel.collect()
    assert rec.value(m.HIT_TOKENS, ("host",)) == 2 * BT
    assert "recomputed" not in misses(rec)


def test_tenant_labels_stay_bounded_and_counters_monotonic(clock: ManualClock) -> None:
    cache = KVCache(CacheConfig(capacity_blocks=64, block_tokens=BT), clock)
    rec = MemoryRecorder()
    tel = CacheTelemetry(rec, cache, tenants=TenantLabels(limit=2))
    for i, tenant in enumerate(["a", "a", "a", "b", "b", "c"]):
        cache.access([100 * i + 1], BT, tenant=tenant)
    tel.collect()
    prompt = {lv[0]: v for lv, v in rec.by_label(m.TENANT_PROMPT_TOKENS).items()}
    assert prompt == {"a": 3 * BT, "b": 2 * BT, "other": BT}
    cache.access([1], BT, tenant="a")  # a hit for a
    cache.access([999], BT, tenant="d")
    tel.collect()
    hits = {lv[0]: v for lv, v in rec.by_label(m.TENANT_HIT_TOKENS).items()}
    assert hits == {"a": BT}
    assert rec.value(m.TENANT_PROMPT_TOKENS, ("other",)) == 2 * BT
    blocks = {lv[0]: v for lv, v in rec.by_label(m.TENANT_CACHED_BLOCKS).items()}
    assert blocks == {"a": 3, "b": 2, "other": 2}


def test_pinned_share(clock: ManualClock) -> None:
    cache, rec, tel = make(8, clock)
    access = cache.access([1, 2], 2 * BT)
    assert cache.pin(access.handle, ttl_s=10)
    tel.collect()
    assert rec.value(m.PINNED_RATIO) == 2 / 8
    clock.advance(11)
    cache.expire_pins()
    tel.collect()
    assert rec.value(m.PINNED_RATIO) == 0.0
