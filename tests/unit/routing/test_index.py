"""GlobalPrefixIndex: per-replica longest prefixes from events, in one bisecting pass."""

from __future__ import annotations

import random

from kvtide.clock import ManualClock
from kvtide.core.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.types import BlockHash, ReplicaId, Tier

from .helpers import cached_hashes, make_caches, prompt, random_prompt, true_prefix

A, B, C = ReplicaId("a"), ReplicaId("b"), ReplicaId("c")


def test_match_reports_each_replicas_longest_prefix() -> None:
    idx = GlobalPrefixIndex()
    p = prompt(list(range(10)))
    idx.add(A, p[:10])
    idx.add(B, p[:4])
    idx.add(C, prompt([7, 7])[:2])  # another prefix altogether
    m = idx.match(p)
    assert dict(m.device) == {A: 10, B: 4}
    assert m.max_blocks == 10
    assert m == idx.match(p, exact=True)
    assert idx.match(prompt([5])).device == {}


def test_lower_tiers_extend_the_device_prefix() -> None:
    idx = GlobalPrefixIndex()
    p = prompt(list(range(12)))
    idx.add(A, p[:3])
    idx.add(A, p[3:8], Tier.HOST)
    idx.add(A, p[8:10], Tier.DISK)
    m = idx.match(p)
    assert m.tier_blocks(A) == (3, 5, 2)
    assert m.device_blocks(A) == 3 and m.cached_blocks(A) == 10


def test_events_store_remove_and_clear() -> None:
    idx = GlobalPrefixIndex()
    p = prompt(list(range(6))).tolist()
    idx.apply_all(
        A,
        [
            BlockStored(tuple(p[:3]), None, None, 16),
            BlockStored(tuple(p[3:6]), p[2], None, 16),
            BlockRemoved(tuple(p[4:6])),
        ],
    )
    assert idx.match(prompt(list(range(6)))).device == {A: 4}
    idx.apply(B, BlockStored(tuple(p[3:6]), p[2], None, 16))  # B never stored p[2]
    assert idx.counters.orphan_stores == 1
    idx.apply(A, AllBlocksCleared())
    assert idx.match(prompt(list(range(6)))).device == {}
    assert idx.holds(B, BlockHash(p[5]))


def test_removed_replica_frees_its_bit_for_the_next() -> None:
    idx = GlobalPrefixIndex()
    p = prompt([1, 2, 3])
    idx.add(A, p)
    idx.add(B, p[:1])
    idx.remove_replica(A)
    idx.add(C, p[:2])
    assert idx.bit(C) == 0
    assert dict(idx.match(p).device) == {B: 1, C: 2}


def test_index_fed_by_cache_events_predicts_what_every_cache_holds() -> None:
    rng = random.Random(7)
    caches = make_caches(5, capacity_blocks=60)
    idx = GlobalPrefixIndex()
    prompts = [random_prompt(rng) for _ in range(40)]
    for _ in range(400):
        r, cache = rng.choice(list(caches.items()))
        p = rng.choice(prompts)
        cache.access(p, 16 * len(p))
        idx.apply_all(r, cache.take_events())
    held = {r: cached_hashes(c) for r, c in caches.items()}
    for p in prompts:
        expected = {r: k for r, h in held.items() if (k := true_prefix(h, p))}
        assert dict(idx.match(p).device) == expected
        assert dict(idx.match(p, exact=True).device) == expected


def test_memory_per_entry_stays_under_80_bytes() -> None:
    """A slot is 16 bytes (key, device mask) and a rebuild leaves 0.2-0.4 of them live: 80
    bytes a block at most with one holder each (a dict would spend ~100 a (block, replica))."""
    rng = random.Random(9)
    idx = GlobalPrefixIndex()
    for i in range(64):
        idx.add(ReplicaId(f"r{i}"), random_prompt(rng, alphabet=1 << 30, max_blocks=2000))
    assert idx.num_entries() > 50_000
    assert idx.bytes_per_entry() <= 80


def test_tiered_cache_events_give_each_tiers_prefix() -> None:
    from kvtide.core.tiers import TieredCache, TieredCacheConfig, TierSpec

    rng = random.Random(1)
    tc = TieredCache(
        TieredCacheConfig(
            device=TierSpec(30), host=TierSpec(60), disk=TierSpec(120), record_events=True
        ),
        ManualClock(),
    )
    idx = GlobalPrefixIndex()
    prompts = [random_prompt(rng, alphabet=4, max_blocks=30) for _ in range(40)]
    for _ in range(300):
        p = rng.choice(prompts)
        tc.access(p, 16 * len(p))
        idx.apply_all(A, tc.take_events())
    held = {t: cached_hashes(c) for t, c in tc.caches.items()}
    for q in prompts:
        expected = tuple(
            true_prefix(set().union(*(held[u] for u in held if u <= t)), q) for t in Tier
        )
        m = idx.match(q)
        assert tuple(m.within_tier[t].get(A, 0) for t in Tier) == expected
