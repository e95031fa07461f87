"""The tiered cache on the Mooncake conversation trace (skipped when ../shared is absent).

Device 1M tokens, host 10M, disk 20M, 512-token blocks, LRU everywhere, write-back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtide.clock import ManualClock
from kvtide.core.hashing import Namespace, request_block_hashes
from kvtide.core.tiers import TieredCache, TieredCacheConfig, TierSpec
from kvtide.types import Tier
from kvtide.workloads import open_workload

TRACE = Path(__file__).parents[2] / ".." / "shared" / "traces" / "mooncake_conversation.jsonl"
BT = 512

pytestmark = [
    pytest.mark.traces,
    pytest.mark.slow,
    pytest.mark.skipif(not TRACE.exists(), reason="../shared/traces is absent"),
]


def replay(config: TieredCacheConfig) -> TieredCache:
    clock = ManualClock()
    cache = TieredCache(config, clock)
    seed = Namespace().seed
    for request in open_workload(str(TRACE)):
        clock.set(max(request.arrival_s, clock.now()))
        cache.access(request_block_hashes(request, BT, seed), request.prompt_tokens)
    return cache


def tiers(host_admission: str) -> TieredCacheConfig:
    return TieredCacheConfig(
        TierSpec(1_000_000 // BT),
        TierSpec(10_000_000 // BT, admission=host_admission),
        TierSpec(20_000_000 // BT),
        block_tokens=BT,
    )


def test_tiers_reach_the_infinite_cache_and_the_filter_saves_host_writes() -> None:
    infinite = replay(TieredCacheConfig(TierSpec(1_000_000), block_tokens=BT)).stats()
    plain = replay(tiers("none")).stats()
    filtered = replay(tiers("seen-twice")).stats()
    assert infinite.hit_ratio == pytest.approx(0.3734, abs=1e-4)
    assert plain.hit_ratio >= 0.9 * infinite.hit_ratio
    assert filtered.hit_ratio >= 0.9 * infinite.hit_ratio
    assert filtered.written_blocks(Tier.HOST) <= 0.5 * plain.written_blocks(Tier.HOST)
    assert plain.hit_ratio - filtered.hit_ratio < 0.01
