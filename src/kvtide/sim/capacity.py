"""Hit ratio against cache capacity: the chosen eviction policy on one shared cache (routing
that loses nothing) beside Belady's optimum at the same capacity and the infinite cache, the
ceiling no policy or router can pass."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.hashing import BlockHashes
from kvtide.core.oracle import Oracle


@dataclass(frozen=True, slots=True)
class CapacityCurve:
    capacity_tokens: list[int]
    policy_hit_ratio: list[float]
    infinite_hit_ratio: float
    optimum_hit_ratio: list[float]  # Belady/MIN at each capacity


def capacity_curve(
    prompts: Sequence[tuple[BlockHashes, int]],
    block_tokens: int,
    eviction: str,
    capacity_tokens: Sequence[int],
) -> CapacityCurve:
    """Replays ``prompts`` (hashes, prompt tokens) in order through one cache per capacity."""
    ratios = []
    total = sum(tokens for _, tokens in prompts)
    for capacity in capacity_tokens:
        cache = KVCache(
            CacheConfig(max(1, capacity // block_tokens), block_tokens, eviction, ghost_blocks=0),
            ManualClock(),
        )
        for hashes, tokens in prompts:
            cache.access(hashes, tokens)
        ratios.append(cache.stats().hit_ratio)
    # Chained hashes: a block seen before has its whole prefix seen, so the oracle's count of
    # repeated blocks is exactly what an unbounded prefix cache hits.
    oracle = Oracle(hashes for hashes, _ in prompts)
    hits = oracle.infinite_hit_blocks * block_tokens
    optimum = [
        oracle.run(max(1, c // block_tokens)).hit_blocks * block_tokens / total if total else 0.0
        for c in capacity_tokens
    ]
    return CapacityCurve(list(capacity_tokens), ratios, hits / total if total else 0.0, optimum)
