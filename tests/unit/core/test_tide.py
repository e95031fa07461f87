"""tide, the default policy: stories, LRU at β = 1, and a block-level reference."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_refs import (
    BlockCache,
    RefTide,
    cached_prefix,
    chained,
    drive_one_block_at_a_time,
    general_requests,
    make_cache,
)

from kvtide.core.cache import KVCache
from kvtide.core.policies.tide import Tide
from kvtide.errors import ConfigError


def access(cache: KVCache, *paths: list[int]) -> None:
    for path in paths:
        hashes = chained(path)
        cache.access(hashes, len(hashes))


def policy(cache: KVCache) -> Tide:
    p = cache.tree.policy_for(cache.tree.root)
    assert isinstance(p, Tide)
    return p


def test_it_starts_as_lru() -> None:
    cache = make_cache("tide", 3)
    access(cache, [1], [2], [3], [1], [4])  # 2 is the least recent: probation, but so LRU
    assert [cached_prefix(cache, [x]) for x in (1, 2, 3, 4)] == [1, 0, 1, 1]
    assert policy(cache).beta == 1.0


def test_a_small_beta_drops_unproven_blocks_first() -> None:
    cache = make_cache("tide", 4, beta=0.25, min_beta=0.25, learning_rate=0.0)
    access(cache, [1], [1])  # 1 is reused: main, last used when 1 block had been stored
    access(cache, [2], [3], [4], [5])  # room for 5: 2 has age 3 >= 0.25 * 3, the age of 1
    assert [cached_prefix(cache, [x]) for x in (1, 2, 3, 4, 5)] == [1, 0, 1, 1, 1]
    access(cache, [6], [7])  # probation keeps paying while its ages exceed a quarter of 1's
    assert [cached_prefix(cache, [x]) for x in (1, 3, 4)] == [1, 0, 0]


def test_a_block_that_probation_dropped_and_that_returns_raises_beta() -> None:
    cache = make_cache("tide", 2, beta=0.5)
    access(cache, [1], [2], [3])  # 1 leaves probation for the probation ghost
    before = policy(cache).beta
    access(cache, [1])  # it comes back: probation was too short, and 1 enters main
    assert policy(cache).beta > before
    assert math.log(policy(cache).beta) == pytest.approx(math.log(before) + 4.0 / 2)


def test_a_block_that_main_dropped_and_that_returns_lowers_beta() -> None:
    cache = make_cache("tide", 2)
    access(cache, [1], [1], [2], [2], [3])  # 1 and 2 in main; 1 (least recent) goes to its ghost
    access(cache, [1])
    assert policy(cache).beta == pytest.approx(math.exp(-4.0 / 2))


@pytest.mark.parametrize(
    "options", [{"beta": 0.0}, {"beta": 8.0}, {"learning_rate": -1.0}, {"ghost_ratio": -1.0}]
)
def test_bad_options_are_config_errors(options: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="tide"):
        make_cache("tide", 4, **options)


@settings(max_examples=200, deadline=None)
@given(general_requests, st.integers(1, 20))
def test_tide_that_does_not_learn_is_lru(reqs: list[list[int]], capacity: int) -> None:
    tide = make_cache("tide", capacity, learning_rate=0.0)
    lru = make_cache("lru", capacity)
    for path in reqs:
        hashes = chained(path)
        assert (
            tide.access(hashes, len(hashes)).hit_blocks
            == lru.access(hashes, len(hashes)).hit_blocks
        )
        assert tide.num_cached_blocks == lru.num_cached_blocks


@settings(max_examples=150, deadline=None)
@given(st.data(), st.integers(1, 20))
def test_tide_tree_equals_block_level_tide_one_block_per_node(
    data: st.DataObject, capacity: int
) -> None:
    # With several blocks per node, a leaf's blocks enter main together when its first block
    # returns from a ghost, and ghosts remember runs; with one block per node it is exact.
    cache = make_cache("tide", capacity)
    ref = BlockCache(capacity, RefTide(capacity))
    drive_one_block_at_a_time(data, cache, ref)
