"""Segmented LRU (Karedla, Love and Wherry, IEEE Computer 27(3), 1994) on a tree.

New leaves enter a probationary LRU segment; a node reused there moves to a protected LRU
segment capped at ``protected_ratio`` of the blocks (80%, the split commonly used since the
paper); protected overflow is demoted to the most recent end of probation. Eviction takes the
least recently used evictable leaf of probation, then of the protected segment.

Tree adaptation: a match touches a whole path; its nodes are applied deepest first, so among
blocks touched together the deeper one is older and leaves first (as in ``LRU``). Nodes that
cannot go (cached children, locks) are skipped where they stand.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtide.core.eviction import PolicyContext
from kvtide.core.node import Node
from kvtide.core.policies.queues import Link, NodeQueue
from kvtide.errors import ConfigError
from kvtide.types import BlockHash


class SLRU:
    name = "slru"

    def __init__(self, ctx: PolicyContext, protected_ratio: float = 0.8) -> None:
        if not 0.0 < protected_ratio < 1.0:
            raise ConfigError(f"slru protected_ratio must be in (0, 1), got {protected_ratio}")
        self.ctx = ctx
        self.probation = NodeQueue("probation")
        self.protected = NodeQueue("protected")
        self.protected_limit_blocks = protected_ratio * ctx.capacity_blocks
        self._touched: list[Node] = []
        self._touched_tick = -1

    # --- hooks ---------------------------------------------------------------------------

    def on_insert(self, node: Node) -> None:
        self._flush()
        link = Link(node)
        node.policy_data = link
        self.probation.push_back(link)

    def on_access(self, node: Node) -> None:
        if node.last_access != self._touched_tick:
            self._flush()
            self._touched_tick = node.last_access
        self._touched.append(node)

    def on_evictable(self, node: Node) -> None:
        pass

    def on_unevictable(self, node: Node) -> None:
        pass

    def on_split(self, head: Node, tail: Node) -> None:
        self._flush()
        tail_link = _link(tail)
        link = Link(head)
        head.policy_data = link
        assert tail_link.queue is not None
        tail_link.queue.insert_after(tail_link, link, moved_blocks=True)

    def on_evict(self, node: Node, num_blocks: int, hashes: Sequence[BlockHash]) -> None:
        link = _link(node)
        queue = link.queue
        assert queue is not None
        queue.shrink(num_blocks)
        if not node.key:
            queue.remove(link)

    def victim(self) -> Node | None:
        self._flush()
        return _oldest_evictable(self.probation) or _oldest_evictable(self.protected)

    # --- touches -------------------------------------------------------------------------

    def _flush(self) -> None:
        """Applies the pending path, deepest node first, then demotes protected overflow."""
        touched = self._touched
        if not touched:
            return
        protected = self.protected
        for node in reversed(touched):
            if node.parent is None:  # evicted since the touch
                continue
            link = _link(node)
            if link.queue is protected:
                protected.move_to_back(link)
            else:
                assert link.queue is not None
                link.queue.remove(link)
                protected.push_back(link)
        touched.clear()
        while protected.num_blocks > self.protected_limit_blocks:
            oldest = protected.front()
            assert oldest is not None
            protected.remove(oldest)
            self.probation.push_back(oldest)


def _oldest_evictable(queue: NodeQueue) -> Node | None:
    for link in queue:
        node = link.node
        assert node is not None
        if node.is_evictable:
            return node
    return None


def _link(node: Node) -> Link:
    link = node.policy_data
    assert isinstance(link, Link)
    return link
