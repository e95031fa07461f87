"""HotPrefixes against a plain Space-Saving reference: a scan for the smallest counter, ties to
the counter that reached its count first, checked after every add."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.telemetry import HotPrefixes


class _Reference:
    def __init__(self, capacity: int, depth_blocks: int) -> None:
        self.capacity = capacity
        self.depth_blocks = depth_blocks
        self.counts: dict[int, int] = {}
        self.reached: dict[int, int] = {}  # key -> when it reached its count
        self.paths: dict[int, tuple[int, ...]] = {}
        self.clock = 0

    def add(self, hashes: list[int]) -> None:
        depth = min(len(hashes), self.depth_blocks)
        if not depth:
            return
        self.clock += 1
        key = hashes[depth - 1]
        if key in self.counts:
            self.counts[key] += 1
        elif len(self.counts) < self.capacity:
            self.counts[key] = 1
            self.paths[key] = tuple(hashes[:depth])
        else:
            victim = min(self.counts, key=lambda k: (self.counts[k], self.reached[k]))
            self.counts[key] = self.counts.pop(victim) + 1
            del self.reached[victim], self.paths[victim]
            self.paths[key] = tuple(hashes[:depth])
        self.reached[key] = self.clock


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(1, 6),
    depth=st.integers(1, 3),
    prompts=st.lists(st.lists(st.integers(0, 12), max_size=4), max_size=120),
)
def test_the_same_counters_as_a_scan_for_the_smallest(
    capacity: int, depth: int, prompts: list[list[int]]
) -> None:
    hot = HotPrefixes(capacity=capacity, depth_blocks=depth)
    ref = _Reference(capacity, depth)
    for hashes in prompts:
        hot.add(hashes)
        ref.add(hashes)
        assert hot.counts == ref.counts
        assert hot.paths == ref.paths
    adds = sum(1 for h in prompts if h)
    assert sum(hot.counts.values()) == adds  # every add counted once, replacements included


def test_a_heavy_hitter_survives_one_off_traffic() -> None:
    """Space-Saving's guarantee: a prefix asked more than N / capacity times of N is held, and
    its count is at least its true count."""
    hot = HotPrefixes(capacity=8, depth_blocks=1)
    n = 0
    for i in range(2000):
        hot.add([1_000_000 + i])  # one-offs
        n += 1
        if i % 4 == 0:
            hot.add([7])
            n += 1
    assert hot.counts[7] >= 500 > n / 8
    assert hot.top(1) == [(7,)]
