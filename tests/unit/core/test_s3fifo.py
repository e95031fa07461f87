"""S3-FIFO on the tree (``s3fifo``): stories and a block-level reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_refs import (
    BlockCache,
    RefS3FIFO,
    cached_hashes,
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


def cached(cache: KVCache) -> set[tuple[int, ...]]:
    """The cached blocks as label paths (only for the small paths used below)."""
    have = cached_hashes(cache)
    labels = range(10)
    out = set()
    for a in labels:
        for tail in ([], *([b] for b in labels), *([b, c] for b in labels for c in labels)):
            path = [a, *tail]
            if chained(path)[-1] in have:
                out.add(tuple(path))
    return out


def test_a_block_reused_in_small_moves_to_main_and_a_one_hit_wonder_goes() -> None:
    cache = make_cache("s3fifo", 3)  # small target: 1 block
    access(cache, [1], [1], [2], [3])
    access(cache, [4])  # small head 1 was reused: to main; 2 was not: evicted, to the ghost
    assert cached(cache) == {(1,), (3,), (4,)}
    access(cache, [5])  # small still over target: 3 goes
    assert cached(cache) == {(1,), (4,), (5,)}
    access(cache, [2])  # 2 is in the ghost: straight into main; 4 leaves small
    assert cached(cache) == {(1,), (2,), (5,)}


def test_main_reinserts_a_reused_node_and_evicts_one_with_no_credit() -> None:
    cache = make_cache("s3fifo", 3)
    access(cache, [1], [1], [2], [3], [4], [5], [2])  # as above: main = [1, 2], small = [5]
    access(cache, [1])  # 1 earns a credit in main
    access(cache, [6])  # small is at target: main's head 1 spends its credit, 2 goes
    assert cached(cache) == {(1,), (5,), (6,)}


def test_a_node_with_cached_children_is_passed_over() -> None:
    cache = make_cache("s3fifo", 4)
    access(cache, [1, 2], [1, 2, 3], [1, 2, 3], [4])
    access(cache, [5])  # small: [1, 2] and [3] were reused -> main; [4] goes
    assert cached(cache) == {(1,), (1, 2), (1, 2, 3), (5,)}
    access(cache, [6])  # main's head [1, 2] has a cached child: passed over, [3] goes
    assert cached(cache) == {(1,), (1, 2), (5,), (6,)}


@pytest.mark.parametrize("options", [{"small_ratio": 0.0}, {"ghost_ratio": -1.0}])
def test_bad_options_are_config_errors(options: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="s3fifo"):
        make_cache("s3fifo", 4, **options)


@settings(max_examples=150, deadline=None)
@given(st.data(), st.integers(1, 20))
def test_s3fifo_tree_equals_block_level_s3fifo_one_block_per_node(
    data: st.DataObject, capacity: int
) -> None:
    # With several blocks per node the tree moves a whole run between queues and takes a
    # leaf's ghost status from its first block; with one block per node it must be exact.
    cache = make_cache("s3fifo", capacity)
    ref = BlockCache(capacity, RefS3FIFO(capacity))
    drive_one_block_at_a_time(data, cache, ref)
