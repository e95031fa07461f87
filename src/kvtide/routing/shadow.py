"""Shadow caches: what each replica probably holds, inferred from routing decisions alone.

One core ``RadixTree`` per replica, sized like the replica's cache and evicting LRU, records
every prompt the router sent there; entries idle for longer than ``ttl_s`` are dropped too (the
engine has likely evicted them under traffic the router cannot see, e.g. from other routers).

The fleet is its own index (``match``, ``held_blocks``, ``subscribe_removals``: what a routing
context's index is asked): a query walks the trees of the replicas whose root has the prompt's
first block, one dict lookup for each of the others. The trees used to feed a
``GlobalPrefixIndex`` for a single-pass match, but keeping it cost more than it saved: every new
block was a table insert and every eviction a removal, ~1 us a block, so a 10 kB one-off prompt
(156 chunks in, as many out) paid ~150 us for a match the walk does in a few.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from kvtide.clock import Clock
from kvtide.core.block_pool import BlockPool
from kvtide.core.events import KVEvent
from kvtide.core.eviction import LRU, PolicyContext
from kvtide.core.hashing import BlockHashes, as_block_hashes
from kvtide.core.node import Node
from kvtide.core.radix_tree import RadixTree
from kvtide.errors import ConfigError, UsageError
from kvtide.routing.index import PrefixMatch, RemovalListener
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


class _Feed:
    """Tree listener of one replica's shadow: its first store gives the replica its place in
    match answers; its evictions go to the fleet's removal listeners."""

    __slots__ = ("fleet", "replica")

    def __init__(self, fleet: ShadowFleet, replica: ReplicaId) -> None:
        self.fleet = fleet
        self.replica = replica

    def stored(self, node: Node, hashes: BlockHashes) -> None:
        self.fleet._place(self.replica)

    def removed(self, node: Node, hashes: BlockHashes) -> None:
        for listener in self.fleet._removal_listeners:
            listener(self.replica, hashes)


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
        self._shadows: dict[ReplicaId, _Shadow] = {}
        # Each replica's place in match answers, allocated at its first stored block, a
        # forgotten replica's place reused: the order a GlobalPrefixIndex gives its bits, so
        # that policies breaking ties by a match's order decide as they did over one.
        self._place_of: dict[ReplicaId, int] = {}
        self._places: list[ReplicaId | None] = []
        self._removal_listeners: list[RemovalListener] = []
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
                listener=_Feed(self, replica),
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

    def _place(self, replica: ReplicaId) -> None:
        if replica not in self._place_of:
            places = self._places
            try:
                i = places.index(None)
                places[i] = replica
            except ValueError:
                i = len(places)
                places.append(replica)
            self._place_of[replica] = i

    # --- the index a routing context asks ------------------------------------------------

    def match(self, hashes: Sequence[BlockHash], *, exact: bool = False) -> PrefixMatch:
        """Per replica, the longest prefix of ``hashes`` its shadow holds (device tier only);
        always exact. Holders in order of prefix length, then of place."""
        self.maybe_expire()
        seq = as_block_hashes(hashes)
        n = len(seq)
        first = seq.raw[:8]
        found: list[tuple[int, int, ReplicaId]] = []
        for replica, s in self._shadows.items():
            tree = s.tree
            if first in tree.root.children:
                k = tree.cached_prefix_blocks(seq)
                found.append((k, self._place_of[replica], replica))
        if not found:
            return PrefixMatch(n)
        found.sort()
        held = {replica: k for k, _, replica in found}
        return PrefixMatch(n, (held, held, held))

    def held_blocks(self, replica: ReplicaId) -> int:
        """Blocks the replica's shadow holds (``Occupancy``)."""
        s = self._shadows.get(replica)
        return s.tree.num_cached_blocks if s is not None else 0

    def subscribe_removals(self, listener: RemovalListener) -> None:
        """``listener(replica, hashes)`` on every eviction from a shadow (``RemovalFeed``)."""
        self._removal_listeners.append(listener)

    def clear_replica(self, replica: ReplicaId) -> None:
        self.forget(replica)

    def apply(self, replica: ReplicaId, event: KVEvent) -> None:
        raise UsageError("a shadow learns from record(), not from an engine's events")

    def apply_all(self, replica: ReplicaId, events: Iterable[KVEvent]) -> None:
        raise UsageError("a shadow learns from record(), not from an engine's events")

    def forget(self, replica: ReplicaId) -> None:
        """Drops a replica's shadow (it restarted, or left the fleet)."""
        self._shadows.pop(replica, None)
        i = self._place_of.pop(replica, None)
        if i is not None:
            self._places[i] = None

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
