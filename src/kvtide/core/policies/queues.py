"""An intrusive doubly linked queue of tree nodes, counted in blocks (for queue-based policies)."""

from __future__ import annotations

from collections.abc import Iterator

from kvtide.core.node import Node


class Link:
    """A node's place in one queue; kept in ``node.policy_data``. ``freq`` and ``stamp`` are
    the policy's to use."""

    __slots__ = ("freq", "next", "node", "prev", "queue", "stamp")

    def __init__(self, node: Node | None, freq: int = 0, stamp: int = 0) -> None:
        self.node = node
        self.freq = freq
        self.stamp = stamp
        self.prev: Link = self
        self.next: Link = self
        self.queue: NodeQueue | None = None


class NodeQueue:
    """Oldest at the front, newest at the back; every operation is O(1).

    ``num_blocks`` is the sum of the member nodes' blocks. A policy must call ``shrink`` when
    the tree trims blocks off a member, and ``insert_after(..., moved_blocks=True)`` when a
    split moves blocks from a member to a new node (the total does not change then).
    """

    __slots__ = ("_sentinel", "name", "num_blocks", "num_nodes")

    def __init__(self, name: str) -> None:
        self.name = name
        self._sentinel = Link(None)
        self.num_blocks = 0
        self.num_nodes = 0

    def __len__(self) -> int:
        return self.num_nodes

    def __bool__(self) -> bool:
        return self.num_nodes > 0

    def __iter__(self) -> Iterator[Link]:
        link = self._sentinel.next
        while link is not self._sentinel:
            yield link
            link = link.next

    def front(self) -> Link | None:
        link = self._sentinel.next
        return None if link is self._sentinel else link

    def push_back(self, link: Link) -> None:
        self._link(self._sentinel.prev, link)
        assert link.node is not None
        self.num_blocks += link.node.num_blocks

    def insert_after(self, anchor: Link, link: Link, *, moved_blocks: bool = False) -> None:
        """Puts ``link`` right behind ``anchor`` (so ``anchor`` leaves first)."""
        assert anchor.queue is self
        self._link(anchor, link)
        if not moved_blocks:
            assert link.node is not None
            self.num_blocks += link.node.num_blocks

    def remove(self, link: Link) -> None:
        assert link.queue is self and link.node is not None
        link.prev.next = link.next
        link.next.prev = link.prev
        link.prev = link.next = link
        link.queue = None
        self.num_nodes -= 1
        self.num_blocks -= link.node.num_blocks

    def move_to_back(self, link: Link) -> None:
        assert link.queue is self
        if link.next is self._sentinel:
            return
        link.prev.next = link.next
        link.next.prev = link.prev
        self.num_nodes -= 1
        self._link(self._sentinel.prev, link)

    def shrink(self, num_blocks: int) -> None:
        self.num_blocks -= num_blocks

    def _link(self, anchor: Link, link: Link) -> None:
        link.prev = anchor
        link.next = anchor.next
        anchor.next.prev = link
        anchor.next = link
        link.queue = self
        self.num_nodes += 1
