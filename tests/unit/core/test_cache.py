"""Stories of one cache: which block goes, when, and why; on a ManualClock, block_tokens=1."""

from __future__ import annotations

import pytest

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvtide.core.hashing import BlockHashes
from kvtide.errors import ConfigError
from kvtide.types import BlockHash, Tier


def H(*xs: int) -> BlockHashes:
    return BlockHashes.from_ints(xs)


def make(capacity: int, clock: ManualClock | None = None, **kw: object) -> KVCache:
    cfg = CacheConfig(capacity_blocks=capacity, block_tokens=1, record_events=True, **kw)  # type: ignore[arg-type]
    return KVCache(cfg, clock or ManualClock())


def removed(cache: KVCache) -> list[tuple[BlockHash, ...]]:
    return [e.block_hashes for e in cache.take_events() if isinstance(e, BlockRemoved)]


def test_lru_evicts_the_least_recent_path_deepest_block_first() -> None:
    cache = make(4)
    cache.access(H(1, 2), 2)
    cache.access(H(3, 4), 2)
    cache.access(H(1, 2), 2)  # A is now more recent than B
    cache.take_events()
    got = cache.access(H(5, 6), 2)
    assert got.new_blocks == 2
    assert removed(cache) == [(3, 4)]  # one trim of B's leaf, listed in prefix order
    assert cache.access(H(1, 2), 2, insert=False).hit_blocks == 2
    assert cache.access(H(3, 4), 2, insert=False).hit_blocks == 0


def test_eviction_takes_exactly_what_is_needed_from_a_leaf_tail() -> None:
    cache = make(4)
    cache.access(H(1, 2, 3), 3)
    cache.take_events()
    cache.access(H(9, 8), 2)
    assert removed(cache) == [(3,)]
    assert cache.match(H(1, 2, 3), touch=False).num_blocks == 2


def test_partial_match_splits_a_node() -> None:
    cache = make(10)
    cache.access(H(1, 2, 3, 4), 4)
    got = cache.access(H(1, 2, 9), 3)
    assert got.hit_blocks == 2 and got.new_blocks == 1
    root = cache.tree.root
    (head,) = root.children.values()
    assert head.num_blocks == 2 and len(head.children) == 2
    assert cache.tree.hashes(got.handle) == [1, 2, 9]


def test_a_locked_path_is_never_evicted_and_insert_takes_what_fits() -> None:
    cache = make(3)
    held = cache.access(H(1, 2, 3), 3, lock=True)
    got = cache.access(H(4, 5), 2)
    assert got.new_blocks == 0
    assert cache.num_cached_blocks == 3
    cache.unlock(held.handle)
    cache.take_events()
    got = cache.access(H(4, 5), 2)
    assert got.new_blocks == 2
    assert removed(cache) == [(2, 3)]


def test_an_emptied_leaf_makes_its_parent_evictable() -> None:
    cache = make(3)
    cache.access(H(1, 2), 2)
    cache.access(H(1, 3), 2)  # 1 is now an internal node with leaves 2 and 3
    cache.take_events()
    cache.access(H(7, 8, 9), 3)
    assert removed(cache) == [(2,), (3,), (1,)]


def test_block_ids_follow_the_path_and_come_from_the_pool() -> None:
    cache = make(5)
    a = cache.access(H(1, 2, 3), 3)
    b = cache.access(H(1, 2, 4), 3)
    assert a.block_ids[:2] == b.block_ids[:2]
    assert len(set(a.block_ids + b.block_ids)) == 4
    cache.pool.check()


def test_events_name_parent_and_tier() -> None:
    cache = KVCache(
        CacheConfig(4, block_tokens=16, record_events=True, namespace="ns"), ManualClock()
    )
    cache.access(H(1, 2), 32)
    cache.access(H(1, 2, 3), 48)
    first, second = cache.take_events()
    assert first == BlockStored((1, 2), None, None, 16, Tier.DEVICE, "ns")  # type: ignore[arg-type]
    assert second == BlockStored((3,), 2, None, 16, Tier.DEVICE, "ns")  # type: ignore[arg-type]
    cache.clear()
    assert cache.take_events()[-1] == AllBlocksCleared()
    assert cache.num_cached_blocks == 0


def test_misses_are_classified() -> None:
    cache = make(2)
    cache.access(H(1, 2), 3)  # 2 cold blocks + 1 partial token
    cache.access(H(5, 6), 2)  # evicts 1 and 2
    cache.access(H(1), 1)  # 1 was evicted: a regretted eviction
    s = cache.stats()
    assert s.miss_tokens_partial == 1
    assert s.miss_tokens_cold == 4
    assert s.miss_tokens_evicted == 1
    assert s.prompt_tokens == 6 and s.hit_tokens == 0


def test_a_miss_on_another_tenants_block_is_blamed_on_the_namespace() -> None:
    cache = make(8)
    cache.access(H(10, 11), 2, tenant="a", shadow_hashes=H(1, 2))
    cache.access(H(20, 21), 2, tenant="b", shadow_hashes=H(1, 2))
    s = cache.stats()
    assert s.miss_tokens_other_namespace == 2
    assert s.hit_tokens == 0


def test_hit_ratio_counts_tokens_and_blocks() -> None:
    cache = KVCache(CacheConfig(8, block_tokens=4), ManualClock())
    cache.access(H(1, 2), 10)
    cache.access(H(1, 2, 3), 12)
    s = cache.stats()
    assert s.hit_tokens == 8 and s.prompt_tokens == 22
    assert s.hit_ratio == pytest.approx(8 / 22)
    assert s.block_hit_ratio == pytest.approx(2 / 5)


def test_pins_hold_until_their_ttl() -> None:
    clock = ManualClock()
    cache = make(3, clock, pin_budget_blocks=2)
    a = cache.access(H(1, 2), 2)
    assert cache.pin(a.handle, ttl_s=10.0)
    cache.access(H(3, 4), 2)  # only one free block: 4 does not fit
    assert cache.match(H(1, 2), touch=False).num_blocks == 2
    assert cache.pinned_blocks == 2
    clock.advance(10.0)
    cache.access(H(3, 4), 2)
    assert cache.pinned_blocks == 0
    assert cache.match(H(3, 4), touch=False).num_blocks == 2


def test_pins_beyond_a_budget_are_refused() -> None:
    cache = make(10, pin_budget_blocks=3, tenant_pin_budget_blocks={"t": 1})
    a = cache.access(H(1, 2), 2)
    b = cache.access(H(3, 4), 2)
    t = cache.access(H(5, 6), 2, tenant="t")
    assert cache.pin(a.handle, 5.0)
    assert not cache.pin(b.handle, 5.0)  # 2 + 2 > 3
    assert not cache.pin(t.handle, 5.0)  # tenant t may pin 1 block
    assert cache.pin(a.handle, 5.0)  # already pinned blocks cost nothing more
    assert cache.pinned_blocks == 2


def test_quotas_keep_a_bursting_tenant_from_flushing_another() -> None:
    cache = make(8, tenant_quota_blocks={"a": 4, "b": 4})
    cache.access(H(1, 2, 3, 4), 4, tenant="a")
    for i in range(20):
        cache.access(H(100 + i, 200 + i), 2, tenant="b")
    assert cache.access(H(1, 2, 3, 4), 4, tenant="a").hit_blocks == 4
    assert cache.tree.usage_blocks == {"a": 4, "b": 4}


def test_without_quotas_the_burst_flushes_it() -> None:
    cache = make(8)
    cache.access(H(1, 2, 3, 4), 4, tenant="a")
    for i in range(20):
        cache.access(H(100 + i, 200 + i), 2, tenant="b")
    assert cache.access(H(1, 2, 3, 4), 4, tenant="a").hit_blocks == 0


def test_an_idle_tenant_lends_its_share() -> None:
    cache = make(8, tenant_quota_blocks={"a": 4, "b": 4})
    cache.access(H(*range(1, 9)), 8, tenant="b")  # b may use a's idle share
    assert cache.num_cached_blocks == 8
    cache.access(H(50, 51), 2, tenant="a")  # and gives it back under pressure
    assert cache.tree.usage_blocks == {"a": 2, "b": 6}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"capacity_blocks": 0},
        {"capacity_blocks": -5},
        {"capacity_blocks": 4, "block_tokens": 0},
        {"capacity_blocks": 4, "tenant_quota_blocks": {"a": 5}},
        {"capacity_blocks": 4, "policy": "nope"},
    ],
)
def test_bad_configs_are_config_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        KVCache(CacheConfig(**kwargs), ManualClock())  # type: ignore[arg-type]


def test_bad_pin_ttl_is_a_config_error() -> None:
    cache = make(2)
    a = cache.access(H(1), 1)
    with pytest.raises(ConfigError):
        cache.pin(a.handle, 0.0)


def test_insert_after_a_shorter_match_walks_on_instead_of_storing_twice() -> None:
    cache = make(8)
    cache.insert(H(1, 2, 3))
    m = cache.match(H(1, 2))
    got = cache.insert(H(1, 2, 3, 4), match=m)
    assert got.new_blocks == 1
    assert cache.num_cached_blocks == 4
    assert cache.evict(100) == 4
    cache.pool.check()


def test_the_ghost_forgets_in_generations() -> None:
    cache = make(2, ghost_blocks=4)
    cache.access(H(1, 2), 2)
    for i in range(10, 40, 2):
        cache.access(H(i, i + 1), 2)  # evicts everything before it
    cache.access(H(1, 2), 2)
    assert cache.stats().miss_tokens_evicted == 0  # long forgotten: cold
    cache.access(H(38, 39), 2)  # evicted by the access just above: remembered
    assert cache.stats().miss_tokens_evicted == 2


def test_discard_drops_a_block_and_its_subtree_leaving_recency_alone() -> None:
    cache = make(10)
    cache.access(H(1, 2, 3, 4), 4)
    cache.access(H(1, 2, 3, 9), 4)
    cache.access(H(5, 6), 2)  # the most recent path
    cache.take_events()
    assert cache.discard(H(1, 2)) == 4  # block 2 lies inside a node: split there, then 2-4, 9
    assert sorted(removed(cache)) == [(2, 3), (4,), (9,)]  # one event per node trimmed
    assert cache.match(H(1, 2, 3, 4), touch=False).num_blocks == 1
    assert cache.num_cached_blocks == cache.pool.num_used == 3
    assert cache.discard(H(7)) == 0 and cache.discard(H(5, 7)) == 0  # not cached: no-op
    cache.evict(1)  # LRU order is untouched: block 1 (older than 5-6) goes first
    assert cache.match(H(1), touch=False).num_blocks == 0
    assert cache.match(H(5, 6), touch=False).num_blocks == 2


def test_discard_keeps_blocks_in_use() -> None:
    cache = make(10)
    cache.access(H(1, 2, 3), 3)
    held = cache.access(H(1, 2, 4), 3, lock=True)
    assert cache.discard(H(1, 2)) == 1  # only block 3: 2 and 4 are on a locked path
    assert cache.match(H(1, 2, 4), touch=False).num_blocks == 3
    assert cache.match(H(1, 2, 3), touch=False).num_blocks == 2
    cache.unlock(held.handle)
    assert cache.discard(H(1, 2)) == 2
