"""Invariants of the cache under every registered eviction policy (hypothesis).

Random accesses, locks, pins, explicit evictions, discards, time, two salted tenants with or without
quotas: prefix closure, no locked or pinned block evicted, capacity, pool consistency, no hit
across namespaces, and each policy's own bookkeeping agreeing with the tree.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.clock import ManualClock
from kvtide.core.cache import Access, CacheConfig, KVCache
from kvtide.core.eviction import POLICIES, EvictionPolicy
from kvtide.core.hashing import Namespace, hash_tokens
from kvtide.core.node import Node
from kvtide.core.policies import S3FIFO, SLRU, Tide

SALTS = {"a": Namespace(tenant_salt=b"salt-a").seed, "b": Namespace(tenant_salt=b"salt-b").seed}

ops = st.lists(
    st.tuples(
        st.sampled_from(["access", "access", "lock", "unlock", "pin", "tick", "evict", "discard"]),
        st.lists(st.integers(0, 2), min_size=1, max_size=10),
        st.sampled_from(["a", "b"]),
    ),
    min_size=1,
    max_size=50,
)


def nodes(cache: KVCache) -> list[Node]:
    out: list[Node] = []
    stack = [cache.tree.root]
    while stack:
        node = stack.pop()
        for first, child in node.children.items():
            assert child.parent is node, "prefix closure: a cached block's parent is cached"
            assert child.key[:8] == first and child.num_blocks > 0
            assert child.depth == node.end_depth
            out.append(child)
            stack.append(child)
    return out


def check_policy(policy: EvictionPolicy, mine: list[Node]) -> None:
    """A policy's view of its partition agrees with the tree."""
    blocks = sum(n.num_blocks for n in mine)
    if isinstance(policy, S3FIFO):
        assert policy.small.num_blocks + policy.main.num_blocks == blocks
        assert len(policy.small) + len(policy.main) == len(mine)
    elif isinstance(policy, SLRU):
        assert policy.probation.num_blocks + policy.protected.num_blocks == blocks
        assert len(policy.probation) + len(policy.protected) == len(mine)
    elif isinstance(policy, Tide):
        assert policy.num_live == sum(n.is_evictable for n in mine)
        assert policy.min_log_beta <= policy.log_beta <= policy.max_log_beta


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(max_examples=120, deadline=None)
@given(operations=ops, cap=st.integers(1, 12), quotas=st.booleans())
def test_invariants_hold_under_every_policy(
    policy: str, operations: list[tuple[str, list[int], str]], cap: int, quotas: bool
) -> None:
    clock = ManualClock()
    config = CacheConfig(
        capacity_blocks=cap,
        block_tokens=1,
        policy=policy,
        tenant_quota_blocks={"a": max(cap // 2, 1)} if quotas else None,
        pin_budget_blocks=cap // 2,
    )
    cache = KVCache(config, clock)
    locked: list[Access] = []
    pinned: list[tuple[list[int], float]] = []
    stored_by: dict[str, set[int]] = {"a": set(), "b": set()}
    for op, tokens, tenant in operations:
        hashes = hash_tokens(tokens, 1, SALTS[tenant])
        if op == "tick":
            clock.advance(1.0)
            cache.expire_pins()
        elif op == "unlock" and locked:
            cache.unlock(locked.pop(0).handle)
        elif op == "evict":
            cache.evict(len(tokens))
        elif op == "discard":  # drop a block (and what hangs below it) as if found corrupt
            k = 1 + sum(tokens) % len(hashes)
            cache.discard(hashes[:k])
            handle = cache.tree.match(hashes[:k], touch=False)[0]
            if handle.end_depth == k:
                assert handle.lock_ref > 0, "an unlocked discarded block is still cached"
        else:
            got = cache.access(hashes, len(tokens), tenant=tenant, lock=op == "lock")
            hit = hashes[: got.hit_blocks].tolist()
            assert set(hit) <= stored_by[tenant], "a hit on a block another namespace stored"
            stored_by[tenant].update(cache.tree.hashes(got.handle).tolist())
            if op == "lock":
                locked.append(got)
            elif op == "pin" and cache.pin(got.handle, 2.0):
                pinned.append((cache.tree.hashes(got.handle).tolist(), clock.now() + 2.0))
        all_nodes = nodes(cache)
        total = sum(n.num_blocks for n in all_nodes)
        assert total == cache.num_cached_blocks == cache.pool.num_used <= cap
        cache.pool.check()
        for held in locked:  # a locked path is never evicted
            path = cache.tree.hashes(held.handle)
            assert cache.match(path, touch=False).num_blocks == len(path)
        for path, until in pinned:
            if clock.now() < until:
                assert cache.match(path, touch=False).num_blocks == len(path)
        by_policy: dict[int, tuple[EvictionPolicy, list[Node]]] = {}
        for node in all_nodes:
            p = cache.tree.policy_for(node)
            by_policy.setdefault(id(p), (p, []))[1].append(node)
        for p, mine in by_policy.values():
            check_policy(p, mine)
