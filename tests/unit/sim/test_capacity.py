from __future__ import annotations

from kvtide.core.hashing import BlockHashes
from kvtide.sim.capacity import capacity_curve


def H(*xs: int) -> BlockHashes:
    return BlockHashes.from_ints(xs)


def test_the_policy_stays_under_the_optimum_under_the_infinite_cache() -> None:
    # a b c a b c with room for two: LRU always evicts what comes next; MIN keeps a, then c.
    prompts = [(H(1), 1), (H(2), 1), (H(3), 1), (H(1), 1), (H(2), 1), (H(3), 1)]
    curve = capacity_curve(prompts, 1, "lru", [2, 100])
    assert curve.infinite_hit_ratio == 3 / 6
    assert curve.policy_hit_ratio == [0.0, 3 / 6]
    assert curve.optimum_hit_ratio == [2 / 6, 3 / 6]
