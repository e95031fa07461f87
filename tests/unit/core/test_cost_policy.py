"""GDSF over recompute cost (``cost``): stories and a block-level reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_refs import (
    BlockCache,
    RefGreedyDual,
    cached_hashes,
    cached_prefix,
    chained,
    general_requests,
    make_cache,
    recompute_value,
)

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.eviction import PolicyContext, make_policy
from kvtide.core.policies import CostAware
from kvtide.errors import ConfigError


def hit(cache: KVCache, path: list[int]) -> int:
    hashes = chained(path)
    return cache.access(hashes, len(hashes)).hit_blocks


def test_deeper_blocks_are_worth_more() -> None:
    policy = make_policy("cost", PolicyContext(10, 16, ManualClock()))
    values = [policy.block_value(d) for d in (0, 1, 100, 2048)]  # type: ignore[attr-defined]
    assert values[0] == 1.0
    assert values == sorted(values)
    for bt in (1, 16, 512):
        cost = CostAware(PolicyContext(10, bt, ManualClock()))
        flops = recompute_value("llama-3-8b", bt)
        assert [cost.block_value(d) for d in range(0, 4096, 97)] == pytest.approx(
            [flops(d) for d in range(0, 4096, 97)], rel=1e-12
        )
    assert 2.0 < values[3] < 2.5  # a block 32k tokens deep costs about 2.2x a first block


def test_a_shallow_leaf_goes_before_a_deep_one_used_as_often() -> None:
    # 512-token blocks make the depth matter: [1] at depth 0 is worth 1, [2, 3]'s tail 1.07.
    cache = KVCache(CacheConfig(capacity_blocks=3, block_tokens=512, policy="cost"), ManualClock())
    for path in ([2, 3], [1]):
        hashes = chained(path)
        cache.access(hashes, len(hashes) * 512)
    hashes = chained([4])
    cache.access(hashes, 512)  # LRU would drop [2, 3]'s tail; cost drops the newer shallow [1]
    assert cached_prefix(cache, [1]) == 0
    assert cached_prefix(cache, [2, 3]) == 2


def test_frequency_outweighs_depth() -> None:
    cache = make_cache("cost", 3)
    for path in ([1], [1], [2, 3]):
        hit(cache, path)
    hit(cache, [4])
    assert hit(cache, [1]) == 1


def test_unknown_model_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown model"):
        make_cache("cost", 3, model="no-such-model")


@settings(max_examples=300, deadline=None)
@given(general_requests, st.integers(1, 20), st.sampled_from([1, 16, 512]))
def test_cost_tree_equals_block_level_gdsf(
    reqs: list[list[int]], capacity: int, block_tokens: int
) -> None:
    # The key is not monotone along a path (deeper blocks are worth more), so the reference
    # chooses among leaf blocks only, as the tree must. It takes the policy's block values
    # (checked against the FLOPs above) so that near-ties round alike.
    config = CacheConfig(capacity_blocks=capacity, block_tokens=block_tokens, policy="cost")
    cache = KVCache(config, ManualClock())
    values = CostAware(PolicyContext(capacity, block_tokens, ManualClock()))
    ref = BlockCache(capacity, RefGreedyDual(values.block_value))
    for path in reqs:
        hashes = chained(path)
        got = cache.access(hashes, len(hashes) * block_tokens)
        assert got.hit_blocks == ref.access(hashes)
        assert cached_hashes(cache) == set(ref.blocks)
