"""LFU with dynamic aging (``lfu``): stories on a manual clock and a block-level reference."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from policy_refs import BlockCache, RefGreedyDual, chained, general_requests, make_cache, same_step

from kvtide.core.cache import KVCache


def hit(cache: KVCache, path: list[int]) -> int:
    hashes = chained(path)
    return cache.access(hashes, len(hashes)).hit_blocks


def test_the_least_frequently_used_leaf_goes_first() -> None:
    cache = make_cache("lfu", 3)
    for path in ([1], [2], [3], [1], [1], [2]):  # freq: 1 -> 3, 2 -> 2, 3 -> 1
        hit(cache, path)
    hit(cache, [4])  # evicts 3, the only block used once
    assert [hit(cache, [p]) for p in (1, 2)] == [1, 1]
    assert hit(cache, [3]) == 0


def test_ties_go_to_the_least_recent_then_the_deepest() -> None:
    cache = make_cache("lfu", 4)
    hit(cache, [1, 2])  # one request: blocks 1 and 2, same frequency and time
    hit(cache, [3, 4])
    hit(cache, [5])  # the oldest request's deeper block goes: [1, 2] -> [1]
    assert hit(cache, [1, 2]) == 1


def test_aging_lets_a_once_hot_block_go() -> None:
    # Block 1 is used 3 times early; then a stream of blocks used twice each raises the
    # inflation L until 1's priority (L0 + 3) is the lowest: LFU-DA ages it out, plain LFU
    # would not.
    cache = make_cache("lfu", 3)
    for _ in range(3):
        hit(cache, [1])
    for label in range(10, 30):
        hit(cache, [label])
        hit(cache, [label])
    assert hit(cache, [1]) == 0


@settings(max_examples=300, deadline=None)
@given(general_requests, st.integers(1, 20))
def test_lfu_tree_equals_block_level_lfu_da(reqs: list[list[int]], capacity: int) -> None:
    cache = make_cache("lfu", capacity)
    ref = BlockCache(capacity, RefGreedyDual())
    for path in reqs:
        same_step(cache, ref, path)
