"""Test helpers: fleets of real kvtide caches whose events feed an index."""

from __future__ import annotations

import random

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.hashing import BlockHashes, hash_block_ids
from kvtide.core.radix_tree import RadixTree
from kvtide.types import ReplicaId

SEED = 12345


def prompt(ids: list[int]) -> BlockHashes:
    """Chained block hashes of a prompt given as per-block ids."""
    return hash_block_ids(ids, SEED)


def random_prompt(rng: random.Random, alphabet: int = 3, max_blocks: int = 40) -> BlockHashes:
    """A prompt from a random walk down a small trie: prompts share prefixes often."""
    return prompt([rng.randrange(alphabet) for _ in range(rng.randrange(1, max_blocks))])


def make_caches(n: int, capacity_blocks: int) -> dict[ReplicaId, KVCache]:
    return {
        ReplicaId(f"r{i}"): KVCache(
            CacheConfig(capacity_blocks=capacity_blocks, record_events=True, ghost_blocks=0),
            ManualClock(),
        )
        for i in range(n)
    }


def cached_hashes(cache: KVCache) -> set[int]:
    """Every block hash the cache holds (the ground truth, read from the tree)."""
    return tree_hashes(cache.tree)


def tree_hashes(tree: RadixTree) -> set[int]:
    """Every block hash a radix tree holds."""
    out: set[int] = set()
    stack = list(tree.root.children.values())
    while stack:
        node = stack.pop()
        out.update(BlockHashes(node.key).tolist())
        stack.extend(node.children.values())
    return out


def true_prefix(held: set[int], hashes: BlockHashes) -> int:
    n = 0
    for h in hashes.tolist():
        if h not in held:
            break
        n += 1
    return n
