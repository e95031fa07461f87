"""Invariants of the cache under random requests, locks, pins and time (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.clock import ManualClock
from kvtide.core.cache import Access, CacheConfig, KVCache
from kvtide.core.hashing import Namespace, hash_tokens
from kvtide.core.node import Node

SALTS = {"a": Namespace(tenant_salt=b"salt-a").seed, "b": Namespace(tenant_salt=b"salt-b").seed}

ops = st.lists(
    st.tuples(
        st.sampled_from(["access", "lock", "unlock", "pin", "tick"]),
        st.lists(st.integers(0, 2), min_size=1, max_size=10),  # tokens: a small alphabet
        st.sampled_from(["a", "b"]),
    ),
    min_size=1,
    max_size=50,
)


def check_tree(cache: KVCache) -> None:
    total = locked = 0
    stack: list[Node] = [cache.tree.root]
    while stack:
        node = stack.pop()
        for first, child in node.children.items():
            assert child.parent is node, "prefix closure: a cached block's parent is cached"
            assert child.key[:8] == first and child.num_blocks > 0
            assert child.depth == node.end_depth
            assert len(child.blocks) == child.num_blocks
            assert child.lock_ref >= child.pin_ref >= 0
            if child.lock_ref:
                assert node.parent is None or node.lock_ref, "a lock holds every ancestor"
                locked += child.num_blocks
            total += child.num_blocks
            stack.append(child)
    assert total == cache.num_cached_blocks == cache.pool.num_used
    assert cache.num_evictable_blocks == total - locked
    assert cache.num_cached_blocks <= cache.capacity_blocks
    cache.pool.check()


@settings(max_examples=200, deadline=None)
@given(ops, st.integers(1, 12), st.booleans())
def test_invariants_hold(
    operations: list[tuple[str, list[int], str]], cap: int, quotas: bool
) -> None:
    clock = ManualClock()
    config = CacheConfig(
        capacity_blocks=cap,
        block_tokens=1,
        tenant_quota_blocks={"a": max(cap // 2, 1)} if quotas else None,
        pin_budget_blocks=cap // 2,
    )
    cache = KVCache(config, clock)
    locked: list[Access] = []
    pinned: list[tuple[list[int], float]] = []
    for op, tokens, tenant in operations:
        hashes = hash_tokens(tokens, 1, SALTS[tenant])
        if op == "tick":
            clock.advance(1.0)
            cache.expire_pins()
        elif op == "unlock" and locked:
            cache.unlock(locked.pop(0).handle)
        else:
            got = cache.access(hashes, len(tokens), tenant=tenant, lock=op == "lock")
            assert got.hit_blocks <= len(hashes)
            if op == "lock":
                locked.append(got)
            elif op == "pin" and cache.pin(got.handle, 2.0):
                pinned.append((cache.tree.hashes(got.handle).tolist(), clock.now() + 2.0))
        check_tree(cache)
        for held in locked:  # a locked path is never evicted
            path = cache.tree.hashes(held.handle)
            assert cache.match(path, touch=False).num_blocks == len(path)
        for path, until in pinned:
            if clock.now() < until:
                assert cache.match(path, touch=False).num_blocks == len(path)
        assert cache.pinned_blocks <= config.effective_pin_budget_blocks
    # The O(1) count is exactly what eviction can free.
    evictable = cache.num_evictable_blocks
    assert cache.evict(cap + 1) == evictable
    assert cache.num_evictable_blocks == 0
    check_tree(cache)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=30))
def test_no_hit_across_namespaces(prompts: list[list[int]]) -> None:
    shared = KVCache(CacheConfig(capacity_blocks=512, block_tokens=1), ManualClock())
    alone = KVCache(CacheConfig(capacity_blocks=512, block_tokens=1), ManualClock())
    for tokens in prompts:
        shared.access(hash_tokens(tokens, 1, SALTS["a"]), len(tokens), tenant="a")
    for tokens in prompts:
        hashes = hash_tokens(tokens, 1, SALTS["b"])
        # Tenant b sees exactly what it would see with tenant a's blocks absent.
        assert (
            shared.access(hashes, len(tokens), tenant="b").hit_blocks
            == alone.access(hashes, len(tokens), tenant="b").hit_blocks
        )
