"""tide, kvtide's default policy: LRU that learns how long an unproven block deserves to stay.

Most prefix blocks are never reused (about 3/4 in the Mooncake conversation trace), and one
that has been reused is much likelier to be reused again (there: 26% for a new block, 42% after
one reuse, 50% after two). So tide keeps two LRU segments, as 2Q (Johnson and Shasha, VLDB'94)
and S3-FIFO (Yang et al., SOSP'23) do: *probation* holds blocks not reused since they were
stored, *main* holds blocks reused at least once or returning after eviction. The victim is the
older of the two segments' least recent leaves, where a probation leaf's age counts ``1/β``
times: ``β = 1`` is exactly LRU (the safe start), a smaller ``β`` drops unproven blocks sooner.

``β`` is learned from ghosts, as ARC learns its target (Megiddo and Modha, FAST'03): each
segment remembers the runs it evicted; a leaf that comes back from the probation ghost says
probation was too short (``β`` grows), one from the main ghost says main was (``β`` shrinks),
each step weighted like ARC's by the other ghost's relative size; returning leaves enter main.

Tree adaptation: a node is one history, so segments hold nodes, keyed like ``LRU`` by
(last use, deepest first); ghosts remember an evicted run by its first (shallowest) hash,
the block a returning prefix misses first, so ghost memory costs one entry per eviction.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Sequence

from kvtide.core.eviction import PolicyContext
from kvtide.core.node import Node
from kvtide.errors import ConfigError
from kvtide.types import BlockHash

PROBATION = 0
MAIN = 1

_Entry = tuple[int, int, int, int, Node]  # (priority, last use, -end depth, seq, node)


class _Ghost:
    """Evicted runs keyed by their first hash, oldest first, at most ``limit_blocks`` blocks
    (trimmed by ``trim``, after the insertion that may hit it)."""

    __slots__ = ("limit_blocks", "num_blocks", "runs")

    def __init__(self, limit_blocks: int) -> None:
        self.limit_blocks = limit_blocks
        self.num_blocks = 0
        self.runs: OrderedDict[int, int] = OrderedDict()

    def add(self, first: int, num_blocks: int) -> None:
        self.num_blocks += num_blocks - self.runs.pop(first, 0)
        self.runs[first] = num_blocks

    def take(self, first: int) -> int:
        """Forgets the run starting at ``first``; returns its blocks (0 if unknown)."""
        num_blocks = self.runs.pop(first, 0)
        self.num_blocks -= num_blocks
        return num_blocks

    def trim(self) -> None:
        runs = self.runs
        while self.num_blocks > self.limit_blocks and runs:
            self.num_blocks -= runs.popitem(last=False)[1]


class _State:
    """A node's segment and when it was last used, in blocks stored so far (``Tide.clock``)."""

    __slots__ = ("segment", "stamp")

    def __init__(self, segment: int, stamp: int) -> None:
        self.segment = segment
        self.stamp = stamp


class Tide:
    """Probation and main LRU segments over evictable leaves, each a lazy heap (entries are
    invalidated through ``node.heap_seq``, as in ``KeyedPolicy``); ``node.policy_data`` holds
    a ``_State``. Ages count blocks stored since a node's last use: cache pressure, not
    seconds or requests, is what makes a block old.
    """

    name = "tide"

    def __init__(
        self,
        ctx: PolicyContext,
        beta: float = 1.0,
        min_beta: float = 1 / 256,
        max_beta: float = 4.0,
        learning_rate: float = 4.0,
        ghost_ratio: float = 2.0,
    ) -> None:
        if not 0.0 < min_beta <= beta <= max_beta:
            raise ConfigError(
                f"tide needs 0 < min_beta <= beta <= max_beta, got {min_beta}, {beta}, {max_beta}"
            )
        if learning_rate < 0.0 or ghost_ratio < 0.0:
            raise ConfigError("tide learning_rate and ghost_ratio must be >= 0")
        cap = ctx.capacity_blocks
        self.ctx = ctx
        self.log_beta = math.log(beta)
        self.min_log_beta = math.log(min_beta)
        self.max_log_beta = math.log(max_beta)
        # A full swing of log β takes a few capacities' worth of ghost hits, like ARC's p
        # moving one block per ghost-hit block across its range of c blocks.
        self.step = learning_rate / cap
        limit = int(ghost_ratio * cap)
        self.ghosts = (_Ghost(limit), _Ghost(limit))
        self.heaps: tuple[list[_Entry], list[_Entry]] = ([], [])
        self.num_live = 0  # nodes with a live entry in either heap
        self.clock = 0
        self._seq = 0

    @property
    def beta(self) -> float:
        return math.exp(self.log_beta)

    # --- hooks ---------------------------------------------------------------------------

    def on_insert(self, node: Node) -> None:
        stamp = self.clock
        self.clock += node.num_blocks
        first = int.from_bytes(node.key[:8], "little")
        ghost_p, ghost_m = self.ghosts
        from_probation = ghost_p.take(first)
        from_main = ghost_m.take(first)
        if from_probation or from_main:
            self._learn(min(from_probation, node.num_blocks), min(from_main, node.num_blocks))
            node.policy_data = _State(MAIN, stamp)
        else:
            node.policy_data = _State(PROBATION, stamp)
        ghost_p.trim()
        ghost_m.trim()
        if node.is_evictable:
            self._push(node)

    def on_access(self, node: Node) -> None:
        state = _state(node)
        state.segment = MAIN
        state.stamp = self.clock
        if node.heap_seq >= 0:
            self._push(node)

    def on_evictable(self, node: Node) -> None:
        self._push(node)

    def on_unevictable(self, node: Node) -> None:
        self._drop(node)

    def on_split(self, head: Node, tail: Node) -> None:
        state = _state(tail)
        head.policy_data = _State(state.segment, state.stamp)

    def on_evict(self, node: Node, num_blocks: int, hashes: Sequence[BlockHash]) -> None:
        ghost = self.ghosts[_state(node).segment]
        if ghost.limit_blocks:
            ghost.add(hashes[0], num_blocks)
        if node.key and node.is_evictable:
            self._push(node)

    def victim(self) -> Node | None:
        prob = self._peek(PROBATION)
        main = self._peek(MAIN)
        if prob is None and main is None:
            return None
        if main is None:
            take = PROBATION
        elif prob is None:
            take = MAIN
        elif prob.priority != main.priority:
            take = PROBATION if prob.priority < main.priority else MAIN
        else:
            age_prob = self.clock - _state(prob).stamp
            scaled_main = self.beta * (self.clock - _state(main).stamp)
            if age_prob != scaled_main:
                take = PROBATION if age_prob > scaled_main else MAIN
            else:  # as LRU would: the least recent, then the deepest (so β = 1 is LRU)
                older = (prob.last_access, -prob.end_depth) < (main.last_access, -main.end_depth)
                take = PROBATION if older else MAIN
        _, _, _, _, node = heapq.heappop(self.heaps[take])
        self._drop(node)
        return node

    # --- learning β ----------------------------------------------------------------------

    def _learn(self, probation_blocks: int, main_blocks: int) -> None:
        gp = self.ghosts[PROBATION].num_blocks
        gm = self.ghosts[MAIN].num_blocks
        log_beta = self.log_beta
        if probation_blocks:
            log_beta += self.step * probation_blocks * max(1.0, gm / max(gp, 1))
        if main_blocks:
            log_beta -= self.step * main_blocks * max(1.0, gp / max(gm, 1))
        self.log_beta = min(self.max_log_beta, max(self.min_log_beta, log_beta))

    # --- the two lazy heaps --------------------------------------------------------------

    def _push(self, node: Node) -> None:
        if node.heap_seq < 0:
            self.num_live += 1
        self._seq += 1
        node.heap_seq = self._seq
        heap = self.heaps[_state(node).segment]
        heapq.heappush(heap, (node.priority, node.last_access, -node.end_depth, self._seq, node))
        if len(heap) > 2 * self.num_live + 1024:
            heap[:] = [e for e in heap if e[4].heap_seq == e[3]]
            heapq.heapify(heap)

    def _drop(self, node: Node) -> None:
        if node.heap_seq >= 0:
            node.heap_seq = -1
            self.num_live -= 1

    def _peek(self, segment: int) -> Node | None:
        heap = self.heaps[segment]
        while heap:
            entry = heap[0]
            node = entry[4]
            if node.heap_seq == entry[3]:
                return node
            heapq.heappop(heap)
        return None


def _state(node: Node) -> _State:
    state = node.policy_data
    assert isinstance(state, _State)
    return state
