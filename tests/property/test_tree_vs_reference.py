"""The radix tree under LRU against an obviously correct block-level LRU."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.types import BlockHash


class ReferenceLRU:
    """Block-level LRU over chained hashes: a dict, a logical clock, a linear scan to evict."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.stamp: dict[BlockHash, tuple[int, int]] = {}
        self.tick = 0

    def access(self, hashes: list[BlockHash]) -> int:
        self.tick += 1
        hit = 0
        while hit < len(hashes) and hashes[hit] in self.stamp:
            hit += 1
        for i in range(hit):
            self.stamp[hashes[i]] = (self.tick, -(i + 1))
        protected = set(hashes[:hit])
        want = len(hashes) - hit
        free = self.capacity - len(self.stamp)
        while free < want:
            victims = [h for h in self.stamp if h not in protected]
            if not victims:
                break
            del self.stamp[min(victims, key=self.stamp.__getitem__)]
            free += 1
        for i in range(hit, hit + min(want, free)):
            self.stamp[hashes[i]] = (self.tick, -(i + 1))
        return hit


def chained(path: list[int]) -> list[BlockHash]:
    out, acc = [], 0
    for x in path:
        acc = hash((acc, x)) & 0xFFFFFFFFFFFFFFFF
        out.append(BlockHash(acc))
    return out


requests = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=12), min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(requests, st.integers(1, 20))
def test_lru_tree_matches_reference(reqs: list[list[int]], capacity: int) -> None:
    cache = KVCache(
        CacheConfig(capacity_blocks=capacity, block_tokens=1, policy="lru"), ManualClock()
    )
    ref = ReferenceLRU(capacity)
    for path in reqs:
        hashes = chained(path)
        got = cache.access(hashes, len(hashes))
        assert got.hit_blocks == ref.access(hashes)
        assert cache.num_cached_blocks == len(ref.stamp)
        assert set(cache.tree.hashes(got.handle)) <= set(ref.stamp)
