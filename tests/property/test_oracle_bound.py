"""No eviction policy beats Belady's MIN, with the cache's own hit accounting (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.eviction import POLICIES
from kvtide.core.hashing import hash_tokens
from kvtide.core.oracle import Oracle

requests = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=12), min_size=1, max_size=60)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(max_examples=150, deadline=None)
@given(reqs=requests, capacity=st.integers(1, 16))
def test_oracle_hits_at_least_as_much_as_every_policy(
    policy: str, reqs: list[list[int]], capacity: int
) -> None:
    hashes = [hash_tokens(tokens, 1, seed=7) for tokens in reqs]
    cache = KVCache(
        CacheConfig(capacity_blocks=capacity, block_tokens=1, policy=policy), ManualClock()
    )
    for h in hashes:
        cache.access(h, len(h))
    best = Oracle(hashes).run(capacity)
    assert best.hit_blocks >= cache.stats().hit_blocks
    assert best.full_blocks == cache.stats().full_blocks
