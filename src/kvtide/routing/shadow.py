"""Shadow caches: what each replica probably holds, inferred from routing decisions alone.

One core ``RadixTree`` per replica, sized like the replica's cache and evicting LRU, records
every prompt the router sent there; entries idle for longer than ``ttl_s`` are dropped too (the
engine has likely evicted them under traffic the router cannot see, e.g. from other routers).
The trees report their stores and evictions into a ``GlobalPrefixIndex``, so a query over all
replicas costs one index match instead of one tree walk per replica.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from kvtide.clock import Clock
from kvtide.core.block_pool import BlockPool
from kvtide.core.eviction import LRU, PolicyContext
from kvtide.core.hashing import BlockHashes, as_block_hashes
from kvtide.core.node import Node
from kvtide.core.radix_tree import RadixTree
from kvtide.errors import ConfigError
from kvtide.routing.index import GlobalPrefixIndex, PrefixMatch
from kvtide.types import BlockHash, ReplicaId


class _OldestLRU(LRU):
    """LRU that can also show its least recently used leaf without taking it."""

    name = "lru"

    def oldest(self) -> Node | None:
        heap = self._heap
        while heap:
            _, seq, node = heap[0]
            if node.heap_seq == seq:
                return node
            heapq.heappop(heap)  # a stale entry: drop it as victim() would
        return None


class _IndexFeed:
    """Tree listener that mirrors one shadow tree into the shared index."""

    __slots__ = ("index", "replica")

    def __init__(self, index: GlobalPrefixIndex, replica: ReplicaId) -> None:
        self.index = index
        self.replica = replica

    def stored(self, node: Node, hashes: BlockHashes) -> None:
        self.index.add(self.replica, hashes)

    def removed(self, node: Node, hashes: BlockHashes) -> None:
        self.index.remove(self.replica, hashes)


class _Shadow:
    __slots__ = ("policy", "tree")

    def __init__(self, tree: RadixTree, policy: _OldestLRU) -> None:
        self.tree = tree
        self.policy = policy


class ShadowFleet:
    """Per-replica shadow trees of ``capacity_blocks`` blocks each, with an optional TTL."""

    def __init__(
        self,
        capacity_blocks: int,
        clock: Clock,
        *,
        block_tokens: int = 16,
        ttl_s: float | None = None,
        expire_every_s: float = 1.0,
    ) -> None:
        if capacity_blocks < 1:
            raise ConfigError(f"shadow capacity must be >= 1 block, got {capacity_blocks}")
        if ttl_s is not None and ttl_s <= 0:
            raise ConfigError(f"ttl_s must be > 0, got {ttl_s}")
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self.clock = clock
        self.ttl_s = ttl_s
        self.expire_every_s = expire_every_s
        self.index = GlobalPrefixIndex()
        self._shadows: dict[ReplicaId, _Shadow] = {}
        self._next_expiry_s = clock.now() + expire_every_s

    def _shadow(self, replica: ReplicaId) -> _Shadow:
        s = self._shadows.get(replica)
        if s is None:
            ctx = PolicyContext(self.capacity_blocks, self.block_tokens, self.clock)
            policy = _OldestLRU(ctx)
            tree = RadixTree(
                BlockPool(self.capacity_blocks),
                lambda: policy,
                self.clock,
                listener=_IndexFeed(self.index, replica),
            )
            s = self._shadows[replica] = _Shadow(tree, policy)
        return s

    def record(self, replica: ReplicaId, hashes: Sequence[BlockHash]) -> None:
        """``replica`` was sent a prompt with these block hashes: it now holds them."""
        hashes = as_block_hashes(hashes)
        tree = self._shadow(replica).tree
        node, hit = tree.match(hashes)
        if hit < len(hashes):
            tree.insert(hashes, start=(node, hit))

    def match(self, hashes: Sequence[BlockHash]) -> PrefixMatch:
        self.maybe_expire()
        return self.index.match(hashes)

    def num_blocks(self, replica: ReplicaId) -> int:
        s = self._shadows.get(replica)
        return s.tree.num_cached_blocks if s is not None else 0

    def forget(self, replica: ReplicaId) -> None:
        """Drops a replica's shadow (it restarted, or left the fleet)."""
        if self._shadows.pop(replica, None) is not None:
            self.index.remove_replica(replica)

    def maybe_expire(self) -> int:
        """Runs ``expire`` at most once per ``expire_every_s`` seconds of clock time."""
        if self.ttl_s is None:
            return 0
        now = self.clock.now()
        if now < self._next_expiry_s:
            return 0
        self._next_expiry_s = now + self.expire_every_s
        return self.expire()

    def expire(self) -> int:
        """Evicts every leaf not used for ``ttl_s`` seconds; returns the blocks dropped."""
        if self.ttl_s is None:
            return 0
        cutoff = self.clock.now() - self.ttl_s
        dropped = 0
        for s in self._shadows.values():
            while True:
                node = s.policy.oldest()
                if node is None or node.last_access_s >= cutoff:
                    break
                dropped += s.tree.evict(node.num_blocks)
        return dropped
