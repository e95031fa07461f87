"""Block lifetime, idle time before eviction and reuse gaps, over every block."""

from __future__ import annotations

import math

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.telemetry import CacheTelemetry, MemoryRecorder
from kvtide.telemetry import metrics as m


def test_lifetime_idle_and_reuse_gap_of_each_block(clock: ManualClock) -> None:
    cache = KVCache(CacheConfig(capacity_blocks=3, block_tokens=4, policy="lru"), clock)
    rec = MemoryRecorder()
    tel = CacheTelemetry(rec, cache)
    cache.access([1, 2, 3], 12)  # stored at t=0
    clock.advance(5)
    cache.access([1, 2], 8)  # reuse gap 5 s for blocks 1, 2 (one node of 2 after the split)
    clock.advance(7)
    cache.access([9, 8, 7], 12)  # t=12: evicts all three
    tel.collect()
    gaps = rec.histogram(m.BLOCK_REUSE_GAP)
    assert gaps.count == 2 and gaps.sum == 10.0
    life = rec.histogram(m.BLOCK_LIFETIME)
    assert life.count == 3 and life.sum == 36.0  # every block lived 12 s
    idle = rec.histogram(m.BLOCK_IDLE)
    assert idle.count == 3 and idle.sum == 7 + 7 + 12  # blocks 1, 2 last used at 5; block 3 at 0
    assert idle.quantile(0.5) == 10.0  # the bucket bound holding 7 s
    assert idle.counts[m.SECONDS_BUCKETS.index(30.0)] == 1  # 12 s falls in (10, 30]


def test_buckets_include_their_upper_bound(clock: ManualClock) -> None:
    cache = KVCache(CacheConfig(capacity_blocks=1, block_tokens=4), clock)
    rec = MemoryRecorder()
    tel = CacheTelemetry(rec, cache)
    cache.access([1], 4)
    clock.advance(60.0)
    cache.access([2], 4)
    tel.collect()
    h = rec.histogram(m.BLOCK_LIFETIME)
    assert h.counts[m.SECONDS_BUCKETS.index(60.0)] == 1
    assert math.isnan(rec.histogram(m.BLOCK_REUSE_GAP).quantile(0.5))
