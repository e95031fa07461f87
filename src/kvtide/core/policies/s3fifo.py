"""S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction", SOSP'23) on a tree.

A small probationary FIFO (S, 10% of the blocks) takes new leaves; a leaf reused while in S moves
to the main FIFO (M) when it reaches the head of S, otherwise its blocks leave and their hashes
go to a ghost FIFO (G, as many entries as M holds blocks). A leaf whose first block is in G is
inserted straight into M. M is a FIFO with reinsertion: a 2-bit counter (0..3) is decremented
each time a node passes the head, and a node leaves at the head with a count of 0.

Tree adaptation: queue entries are nodes (runs of blocks with one history), so a whole leaf moves
between queues at once, and the tree trims whichever leaf is named from its tail. A node at a
queue head that is not an evictable leaf (it has cached children, or it is locked) is moved to
the back of its queue with its counter unchanged: its blocks are needed by its descendants.
A split places the new head node right behind the tail it came from, so the deeper blocks still
leave first. Ghost checks use a leaf's first block (the one a returning prefix hits first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvtide.core.eviction import PolicyContext
from kvtide.core.node import Node
from kvtide.core.policies.queues import Link, NodeQueue
from kvtide.errors import ConfigError
from kvtide.types import BlockHash

# Two bits per object (S3-FIFO §4.2): frequencies saturate at 3.
MAX_FREQ = 3


class S3FIFO:
    name = "s3fifo"

    def __init__(
        self,
        ctx: PolicyContext,
        small_ratio: float = 0.1,
        ghost_ratio: float = 0.9,
        move_to_main_hits: int = 1,
    ) -> None:
        # Defaults: S is 10% of the cache and G remembers as many blocks as M holds (S3-FIFO
        # §4.2, libCacheSim's fifo-size-ratio=0.10, ghost-size-ratio=0.90); one reuse while in S
        # earns a place in M (the paper's rule; later libCacheSim versions default to two).
        if not 0.0 < small_ratio < 1.0:
            raise ConfigError(f"s3fifo small_ratio must be in (0, 1), got {small_ratio}")
        if ghost_ratio < 0.0:
            raise ConfigError(f"s3fifo ghost_ratio must be >= 0, got {ghost_ratio}")
        if move_to_main_hits < 1:
            raise ConfigError("s3fifo move_to_main_hits must be >= 1")
        self.ctx = ctx
        self.small = NodeQueue("small")
        self.main = NodeQueue("main")
        self.small_target_blocks = max(1.0, small_ratio * ctx.capacity_blocks)
        self.ghost_limit = int(ghost_ratio * ctx.capacity_blocks)
        self.move_to_main_hits = move_to_main_hits
        self.ghost: OrderedDict[int, None] = OrderedDict()

    # --- hooks ---------------------------------------------------------------------------

    def on_insert(self, node: Node) -> None:
        link = Link(node)
        node.policy_data = link
        first = int.from_bytes(node.key[:8], "little")
        ghost = self.ghost
        if first in ghost:
            del ghost[first]
            self.main.push_back(link)
        else:
            self.small.push_back(link)
        # Trimmed here, after the check: the blocks evicted to make room for this leaf must
        # not push out the ghost entry that would have admitted it.
        while len(ghost) > self.ghost_limit:
            ghost.popitem(last=False)

    def on_access(self, node: Node) -> None:
        link = _link(node)
        if link.freq < MAX_FREQ:
            link.freq += 1

    def on_evictable(self, node: Node) -> None:
        pass

    def on_unevictable(self, node: Node) -> None:
        pass

    def on_split(self, head: Node, tail: Node) -> None:
        tail_link = _link(tail)
        link = Link(head, tail_link.freq)
        head.policy_data = link
        assert tail_link.queue is not None
        tail_link.queue.insert_after(tail_link, link, moved_blocks=True)

    def on_evict(self, node: Node, num_blocks: int, hashes: Sequence[BlockHash]) -> None:
        link = _link(node)
        queue = link.queue
        assert queue is not None
        queue.shrink(num_blocks)
        if queue is self.small and self.ghost_limit:
            ghost = self.ghost
            for h in hashes:
                ghost[h] = None
                ghost.move_to_end(h)
        if not node.key:
            queue.remove(link)

    def victim(self) -> Node | None:
        if self.small.num_blocks > self.small_target_blocks or not self.main:
            return self._from_small() or self._from_main()
        # Small may move everything it holds to main: look at main again then.
        return self._from_main() or self._from_small() or self._from_main()

    # --- the two queue heads -------------------------------------------------------------

    def _from_small(self) -> Node | None:
        small = self.small
        for _ in range(len(small)):
            link = small.front()
            assert link is not None and link.node is not None
            node = link.node
            if link.freq >= self.move_to_main_hits:
                small.remove(link)
                link.freq = 0  # access bits are cleared on the move (S3-FIFO §4.2)
                self.main.push_back(link)
            elif not node.is_evictable:
                small.move_to_back(link)
            else:
                return node
        return None

    def _from_main(self) -> Node | None:
        main = self.main
        for _ in range((MAX_FREQ + 1) * len(main)):
            link = main.front()
            assert link is not None and link.node is not None
            if link.freq > 0:
                link.freq -= 1
                main.move_to_back(link)
            elif not link.node.is_evictable:
                main.move_to_back(link)
            else:
                return link.node
        return None


def _link(node: Node) -> Link:
    link = node.policy_data
    assert isinstance(link, Link)
    return link
