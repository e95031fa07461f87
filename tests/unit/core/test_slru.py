"""Segmented LRU on the tree (``slru``): stories and a block-level reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_refs import (
    BlockCache,
    RefSLRU,
    cached_prefix,
    chained,
    drive_one_block_at_a_time,
    make_cache,
)

from kvtide.core.cache import KVCache
from kvtide.errors import ConfigError


def access(cache: KVCache, *paths: list[int]) -> None:
    for path in paths:
        hashes = chained(path)
        cache.access(hashes, len(hashes))


def test_probation_goes_first_even_when_more_recent() -> None:
    cache = make_cache("slru", 5)
    access(cache, [1], [1], [2], [3], [4], [5])  # 1 protected; 2..5 on probation
    access(cache, [6])  # probation's least recent goes: 2; the older 1 is protected
    assert [cached_prefix(cache, [x]) for x in (1, 2, 3)] == [1, 0, 1]


def test_protected_overflow_is_demoted_to_probation() -> None:
    cache = make_cache("slru", 3)  # protected holds at most 2.4 blocks
    access(cache, [1], [1], [2], [2], [3], [3])  # 1, 2, 3 protected in turn: 1 demoted
    access(cache, [4])  # probation = [1]: the demoted block goes
    assert [cached_prefix(cache, [x]) for x in (1, 2, 3, 4)] == [0, 1, 1, 1]


def test_bad_ratio_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="slru"):
        make_cache("slru", 4, protected_ratio=1.0)


@settings(max_examples=150, deadline=None)
@given(st.data(), st.integers(1, 20))
def test_slru_tree_equals_block_level_slru_one_block_per_node(
    data: st.DataObject, capacity: int
) -> None:
    # With several blocks per node the tree demotes a whole node at once; with one block per
    # node it must be exact.
    cache = make_cache("slru", capacity)
    ref = BlockCache(capacity, RefSLRU(capacity))
    drive_one_block_at_a_time(data, cache, ref)
