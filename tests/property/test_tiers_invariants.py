"""TieredCache invariants on random request streams, against per-tier hash sets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.clock import ManualClock
from kvtide.core.hashing import BlockHashes, hash_block_ids
from kvtide.core.radix_tree import RadixTree
from kvtide.core.tiers import TieredCache, TieredCacheConfig, TierSpec, WriteMode
from kvtide.types import Tier

BT = 4


def tree_blocks(tree: RadixTree) -> list[int]:
    out: list[int] = []
    stack = [tree.root]
    while stack:
        node = stack.pop()
        out.extend(BlockHashes(node.key).tolist())
        stack.extend(node.children.values())
    return out


def longest_prefix(held: set[int], hashes: list[int]) -> int:
    n = 0
    while n < len(hashes) and hashes[n] in held:
        n += 1
    return n


requests = st.lists(
    st.tuples(st.lists(st.integers(0, 3), max_size=8), st.integers(0, BT - 1)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(
    requests=requests,
    device=st.integers(1, 4),
    host=st.integers(0, 6),
    disk=st.integers(0, 8),
    admission=st.sampled_from(["none", "seen-twice"]),
    disk_admission=st.sampled_from(["none", "seen-twice"]),
    write_mode=st.sampled_from(list(WriteMode)),
    prefetch_every=st.integers(0, 5),
)
def test_tiers_keep_their_invariants(
    requests: list[tuple[list[int], int]],
    device: int,
    host: int,
    disk: int,
    admission: str,
    disk_admission: str,
    write_mode: WriteMode,
    prefetch_every: int,
) -> None:
    capacity = {Tier.DEVICE: device, Tier.HOST: host, Tier.DISK: disk}
    config = TieredCacheConfig(
        TierSpec(device),
        TierSpec(host, admission=admission) if host else None,
        TierSpec(disk, admission=disk_admission) if disk else None,
        block_tokens=BT,
        write_mode=write_mode,
    )
    cache = TieredCache(config, ManualClock())
    hits = prompt_tokens = 0
    parent: dict[int, int | None] = {}
    for i, (ids, extra) in enumerate(requests):
        hashes = hash_block_ids(ids, seed=3)
        hl = hashes.tolist()
        parent.update(zip(hl, [None, *hl], strict=False))
        if prefetch_every and i % prefetch_every == 0:
            cache.prefetch(hashes)
        held = {t: set(tree_blocks(c.tree)) for t, c in cache.caches.items()}
        prefix = {t: longest_prefix(h, hl) for t, h in held.items()}
        acc = cache.access(hashes, len(ids) * BT + extra)
        # Each block of the cached prefix is counted once, in the fastest tier holding it.
        d = prefix[Tier.DEVICE]
        assert acc.device_blocks == d
        through_host = max(d, prefix.get(Tier.HOST, 0))
        assert acc.device_blocks + acc.host_blocks == through_host
        assert acc.hit_blocks == max(prefix.values())
        assert acc.usable_blocks == acc.hit_blocks  # no cost model: every hit is reloaded
        hits += acc.hit_blocks
        prompt_tokens += len(ids) * BT + extra
        # The whole prompt is on the device afterwards whenever it fits.
        if len(hl) <= device:
            assert longest_prefix(set(tree_blocks(cache.device.tree)), hl) == len(hl)
        for tier, c in cache.caches.items():
            blocks = tree_blocks(c.tree)
            assert len(blocks) == len(set(blocks)) == c.num_cached_blocks <= capacity[tier]
            # Prefix closure: a tier holds a block only with its parent.
            assert all(parent[b] is None or parent[b] in set(blocks) for b in blocks)
            c.pool.check()
    stats = cache.stats()
    assert stats.hit_tokens == hits * BT
    assert stats.prompt_tokens == prompt_tokens
    assert stats.lookups == len(requests)
    for tier in (Tier.HOST, Tier.DISK):
        assert stats.written_blocks(tier) >= (
            stats.tiers[tier].cached_blocks if tier in stats.tiers else 0
        )
