"""Eviction policies: which unlocked leaf gives up its tail blocks next.

The tree tells a policy about every change that can alter its ranking through the hooks of
``EvictionPolicy``; the policy answers ``victim()``. Most policies are a sort key over node
statistics (SGLang's observation), served by ``KeyedPolicy``'s lazy heap, so no heap is rebuilt
per eviction. Policies with queues of their own (S3-FIFO, ARC) implement the hooks directly.
Policies are registered by name in ``POLICIES`` and built with ``make_policy``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvtide.clock import Clock
from kvtide.core.node import Node
from kvtide.registry import build_named
from kvtide.types import BlockHash


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy may know about its cache."""

    capacity_blocks: int
    block_tokens: int
    clock: Clock


class EvictionPolicy(Protocol):
    name: str

    def on_insert(self, node: Node) -> None:
        """A new leaf was added (it may be locked)."""

    def on_access(self, node: Node) -> None:
        """A match touched ``node`` (called for every node on the matched path)."""

    def on_evictable(self, node: Node) -> None:
        """``node`` became an unlocked leaf."""

    def on_unevictable(self, node: Node) -> None:
        """``node`` was locked or gained a child."""

    def on_split(self, head: Node, tail: Node) -> None:
        """``tail`` was split; ``head`` is its new parent holding the first blocks."""

    def on_evict(self, node: Node, num_blocks: int, hashes: Sequence[BlockHash]) -> None:
        """``num_blocks`` tail blocks (``hashes``) left ``node``; an emptied node is detached."""

    def victim(self) -> Node | None:
        """An evictable leaf to trim next, or ``None`` when nothing is evictable."""


class KeyedPolicy:
    """A policy defined by a sort key over node statistics: the smallest key is evicted first.

    Entries are pushed on every change and invalidated lazily through ``node.heap_seq``; the
    heap is compacted when stale entries outnumber live ones, so each operation is amortised
    O(log n) and no call rebuilds the heap. Lower ``node.priority`` is always evicted first.
    """

    name = "keyed"

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx
        self._heap: list[tuple[Any, int, Node]] = []
        self._seq = 0
        self._live = 0

    def key(self, node: Node) -> Any:
        raise NotImplementedError

    def _push(self, node: Node) -> None:
        if node.heap_seq < 0:
            self._live += 1
        self._seq += 1
        node.heap_seq = self._seq
        heapq.heappush(self._heap, ((node.priority, self.key(node)), self._seq, node))
        if len(self._heap) > 2 * self._live + 1024:
            self._compact()

    def _drop(self, node: Node) -> None:
        if node.heap_seq >= 0:
            node.heap_seq = -1
            self._live -= 1

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if e[2].heap_seq == e[1]]
        heapq.heapify(self._heap)

    def on_insert(self, node: Node) -> None:
        if node.is_evictable:
            self._push(node)

    def on_access(self, node: Node) -> None:
        if node.heap_seq >= 0:
            self._push(node)

    def on_evictable(self, node: Node) -> None:
        self._push(node)

    def on_unevictable(self, node: Node) -> None:
        self._drop(node)

    def on_split(self, head: Node, tail: Node) -> None:
        head.policy_data = tail.policy_data

    def on_evict(self, node: Node, num_blocks: int, hashes: Sequence[BlockHash]) -> None:
        if node.key and node.is_evictable:
            self._push(node)

    def victim(self) -> Node | None:
        heap = self._heap
        while heap:
            _, seq, node = heapq.heappop(heap)
            if node.heap_seq == seq:
                self._drop(node)
                return node
        return None


class LRU(KeyedPolicy):
    """Least recently used; among blocks touched together, the deepest goes first (as vLLM)."""

    name = "lru"

    def key(self, node: Node) -> Any:
        return (node.last_access, -node.end_depth)


PolicyFactory = Callable[..., EvictionPolicy]
POLICIES: dict[str, PolicyFactory] = {"lru": LRU}


def register_policy(name: str, factory: PolicyFactory) -> None:
    POLICIES[name] = factory


def make_policy(
    name: str, ctx: PolicyContext, options: Mapping[str, object] | None = None
) -> EvictionPolicy:
    return build_named("eviction policy", POLICIES, name, ctx, options=options)
