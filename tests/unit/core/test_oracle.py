"""Belady's MIN over blocks: stories, brute force on tiny cases, and the cache's accounting."""

from __future__ import annotations

import functools
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_refs import chained

from kvtide.core.oracle import Oracle
from kvtide.errors import ConfigError
from kvtide.types import BlockHash


def oracle_of(*paths: list[int]) -> Oracle:
    return Oracle([chained(p) for p in paths])


def test_min_evicts_the_block_used_farthest_in_the_future() -> None:
    oracle = oracle_of([1], [2], [3], [1], [2])
    # At [3] MIN drops 2 (next used at request 4), keeps 1 (request 3): one hit; LRU gets none.
    assert oracle.run(2).hit_blocks == 1
    assert oracle.run(3).hit_blocks == 2


def test_on_a_tie_the_deeper_block_goes_first() -> None:
    # Blocks 1 and 2 are next used by the same request: dropping the shallow 1 would strand 2
    # (a prefix cache can only hit 1 then 2), so MIN drops 2 and [1, 2] still hits 1 block.
    oracle = oracle_of([1, 2], [3], [1, 2])
    run = oracle.run(2)
    assert run.hit_blocks == 1
    assert run.evicted_blocks == 1 + 1


def test_the_requests_own_blocks_are_never_evicted_and_only_what_fits_is_stored() -> None:
    oracle = oracle_of([1, 2, 3, 4], [1, 2, 3, 4])
    run = oracle.run(3)
    assert run.inserted_blocks == 3
    assert run.hit_blocks == 3  # the first 3 blocks stayed; block 4 never fitted
    assert run.full_blocks == 8


def test_a_cache_as_large_as_the_trace_hits_every_repeat() -> None:
    oracle = oracle_of([1, 2], [1, 2, 3], [1], [4], [1, 2, 3])
    assert oracle.infinite_hit_blocks == 2 + 1 + 3
    assert oracle.run(100).hit_blocks == oracle.infinite_hit_blocks
    assert oracle.run(100).evicted_blocks == 0


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="positive"):
        oracle_of([1]).run(0)


def brute_force(paths: list[list[BlockHash]], capacity: int) -> int:
    """The most hits any sequence of demand evictions of leaf blocks can get."""
    parent = {h: (p[i - 1] if i else None) for p in paths for i, h in enumerate(p)}

    def closed(cached: frozenset[BlockHash]) -> bool:
        return all(parent[h] is None or parent[h] in cached for h in cached)

    @functools.cache
    def best(i: int, cached: frozenset[BlockHash]) -> int:
        if i == len(paths):
            return 0
        path = paths[i]
        hit = 0
        while hit < len(path) and path[hit] in cached:
            hit += 1
        need = len(path) - hit
        evictable = sorted(cached - set(path[:hit]))
        short = need - (capacity - len(cached))
        choices: list[frozenset[BlockHash]] = []
        if short <= 0:
            choices = [cached]
        elif short >= len(evictable):
            choices = [cached - set(evictable)]
        else:
            for gone in itertools.combinations(evictable, short):
                left = cached - set(gone)
                if closed(left):
                    choices.append(left)
        out = 0
        for left in choices:
            room = capacity - len(left)
            stored = left | set(path[hit : hit + min(need, room)])
            out = max(out, best(i + 1, frozenset(stored)))
        return hit + out

    return best(0, frozenset())


tiny = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=3), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(tiny, st.integers(1, 4))
def test_min_equals_brute_force_on_tiny_cases(paths: list[list[int]], capacity: int) -> None:
    hashes = [chained(p) for p in paths]
    assert Oracle(hashes).run(capacity).hit_blocks == brute_force(hashes, capacity)
