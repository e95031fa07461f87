"""tide: kvtide's default policy, S3-FIFO's queues sized online by ARC's ghost feedback.

Most prefix blocks are used once (about 3/4 in the Mooncake conversation trace), so new leaves
wait in a probationary FIFO and only those reused there, or that return after eviction, earn a
place in the main queue (S3-FIFO, Yang et al., SOSP'23). How long a new block deserves to wait
depends on the workload and the capacity, so the probation target moves like ARC's ``p``
(Megiddo and Modha, FAST'03): a returning block that probation dropped grows it, one that main
dropped shrinks it, each step weighted by the other ghost's relative size.

Tree adaptation: entries are nodes; ghosts remember evicted *runs* by their first (shallowest)
hash, which is exactly the block a returning prefix misses first, so ghost memory costs one
entry per eviction, not per block; a node at a queue head that cannot go yet is passed over.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvtide.core.eviction import PolicyContext
from kvtide.core.node import Node
from kvtide.core.policies.queues import Link, NodeQueue
from kvtide.errors import ConfigError
from kvtide.types import BlockHash

MAX_FREQ = 3  # S3-FIFO's two-bit counter


class _Ghost:
    """Evicted runs keyed by their first hash, oldest first, bounded in blocks."""

    __slots__ = ("limit_blocks", "num_blocks", "runs")

    def __init__(self, limit_blocks: int) -> None:
        self.limit_blocks = limit_blocks
        self.num_blocks = 0
        self.runs: OrderedDict[int, int] = OrderedDict()

    def add(self, first: int, num_blocks: int) -> None:
        runs = self.runs
        old = runs.pop(first, 0)
        runs[first] = num_blocks
        self.num_blocks += num_blocks - old
        while self.num_blocks > self.limit_blocks and runs:
            self.num_blocks -= runs.popitem(last=False)[1]

    def take(self, first: int) -> int:
        """Removes the run starting at ``first``; returns its blocks (0 if unknown)."""
        n = self.runs.pop(first, 0)
        self.num_blocks -= n
        return n


class Tide:
    name = "tide"

    def __init__(
        self,
        ctx: PolicyContext,
        small_ratio: float = 0.1,
        min_small_ratio: float = 0.01,
        max_small_ratio: float = 0.99,
        ghost_ratio: float = 4.0,
        adapt: bool = True,
    ) -> None:
        if not 0.0 < min_small_ratio <= small_ratio <= max_small_ratio < 1.0:
            raise ConfigError(
                "tide needs 0 < min_small_ratio <= small_ratio <= max_small_ratio < 1, got "
                f"{min_small_ratio}, {small_ratio}, {max_small_ratio}"
            )
        if ghost_ratio < 0.0:
            raise ConfigError(f"tide ghost_ratio must be >= 0, got {ghost_ratio}")
        cap = ctx.capacity_blocks
        self.ctx = ctx
        self.small = NodeQueue("small")
        self.main = NodeQueue("main")
        self.small_target_blocks = small_ratio * cap
        self.min_small_blocks = max(1.0, min_small_ratio * cap)
        self.max_small_blocks = max_small_ratio * cap
        self.adapt = adapt
        limit = int(ghost_ratio * cap)
        self.ghost_small = _Ghost(limit)
        self.ghost_main = _Ghost(limit)

    # --- hooks ---------------------------------------------------------------------------

    def on_insert(self, node: Node) -> None:
        link = Link(node)
        node.policy_data = link
        first = int.from_bytes(node.key[:8], "little")
        from_small = self.ghost_small.take(first)
        from_main = self.ghost_main.take(first)
        if from_small or from_main:
            if self.adapt:
                self._adapt(min(from_small, node.num_blocks), min(from_main, node.num_blocks))
            self.main.push_back(link)
        else:
            self.small.push_back(link)

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
        ghost = self.ghost_small if queue is self.small else self.ghost_main
        if ghost.limit_blocks:
            ghost.add(hashes[0], num_blocks)
        if not node.key:
            queue.remove(link)

    def victim(self) -> Node | None:
        if self.small.num_blocks > self.small_target_blocks or not self.main:
            return self._from_small() or self._from_main()
        return self._from_main() or self._from_small()

    # --- adaptation and queue heads ------------------------------------------------------

    def _adapt(self, small_blocks: int, main_blocks: int) -> None:
        gs, gm = self.ghost_small.num_blocks, self.ghost_main.num_blocks
        target = self.small_target_blocks
        if small_blocks:
            target += small_blocks * max(1.0, gm / max(gs, 1))
        if main_blocks:
            target -= main_blocks * max(1.0, gs / max(gm, 1))
        self.small_target_blocks = min(self.max_small_blocks, max(self.min_small_blocks, target))

    def _from_small(self) -> Node | None:
        small = self.small
        for _ in range(len(small)):
            link = small.front()
            assert link is not None and link.node is not None
            node = link.node
            if link.freq > 0:
                small.remove(link)
                link.freq = 0
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
