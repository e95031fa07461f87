"""Belady's MIN over blocks: the most cache hits any eviction policy could get, offline.

The hit accounting is the cache's: a request hits the longest cached prefix of its full blocks,
its hit blocks cannot be evicted while its missing blocks are inserted, and when locked blocks
leave too little room only the prefix that fits is stored.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvtide.core.hashing import BlockHashes, as_block_hashes
from kvtide.errors import ConfigError

IntArray = npt.NDArray[np.int64]
_Entry = tuple[int, int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class OracleRun:
    """What MIN achieves at one capacity (in blocks)."""

    capacity_blocks: int
    full_blocks: int
    hit_blocks: int
    inserted_blocks: int
    evicted_blocks: int

    @property
    def block_hit_ratio(self) -> float:
        return self.hit_blocks / self.full_blocks if self.full_blocks else 0.0


class Oracle:
    """Belady/MIN (Belady, IBM Systems Journal 1966) over a fixed sequence of requests.

    Each request is the chained hashes of its full blocks, in prefix order. On a shortage MIN
    evicts the cached block whose next use is farthest in the future, the deeper block first on
    ties. With chained hashes a child's next use is never before its parent's, so MIN keeps the
    cache prefix-closed and its hit count is also the best a prefix tree can do.

    Next uses are precomputed once (one sort over all blocks). Within a request, next uses do
    not decrease with depth, so a request's blocks form a few *runs* sharing one next use; the
    lazy max-heap holds runs, not blocks, and each run is evicted from its deep end with numpy.
    A capacity costs O(requests · runs · log) Python steps, whatever the block size.
    """

    def __init__(self, requests: Iterable[Sequence[int]]) -> None:
        raws = [as_block_hashes(r).raw for r in requests]
        lengths = np.fromiter((len(r) >> 3 for r in raws), dtype=np.int64, count=len(raws))
        self.num_requests = len(raws)
        self.offsets: IntArray = np.zeros(self.num_requests + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        flat = np.frombuffer(b"".join(raws), dtype="<u8")
        self.full_blocks = len(flat)
        # One stable sort gives both the dense block ids and, since a block's occurrences stay
        # in request order, each occurrence's next use.
        order = np.argsort(flat, kind="stable")
        ordered = flat[order]
        is_new = np.ones(len(flat), dtype=np.bool_)
        is_new[1:] = ordered[1:] != ordered[:-1]
        self.num_distinct_blocks = int(is_new.sum())
        self.ids: IntArray = np.empty(len(flat), dtype=np.int64)
        self.ids[order] = np.cumsum(is_new) - 1
        request_of = np.repeat(np.arange(self.num_requests, dtype=np.int64), lengths)
        self.next_use: IntArray = np.full(len(flat), self.num_requests, dtype=np.int64)
        repeat = ~is_new[1:]  # ordered[k + 1] is the next occurrence of ordered[k]
        self.next_use[order[:-1][repeat]] = request_of[order[1:][repeat]]

    @classmethod
    def from_hashes(cls, requests: Iterable[BlockHashes]) -> Oracle:
        return cls(requests)

    @property
    def infinite_hit_blocks(self) -> int:
        """Hits of a cache that never evicts: every block occurrence but the first."""
        return self.full_blocks - self.num_distinct_blocks

    def run(self, capacity_blocks: int) -> OracleRun:
        if capacity_blocks <= 0:
            raise ConfigError(f"capacity must be positive, got {capacity_blocks} blocks")
        n = self.num_requests
        ids, next_use, offsets = self.ids, self.next_use, self.offsets
        cached = np.zeros(self.num_distinct_blocks, dtype=np.bool_)
        # owner[b]: the heap entry that currently speaks for cached block b (-1: none).
        owner = np.full(self.num_distinct_blocks, -1, dtype=np.int64)
        # Entries: (-next_use, -end_depth, seq, start, end, request start) over ids[start:end].
        heap: list[_Entry] = []
        seq = 0
        num_cached = hit_total = inserted_total = evicted_total = 0
        for r in range(n):
            lo, hi = int(offsets[r]), int(offsets[r + 1])
            if lo == hi:
                continue
            seg = ids[lo:hi]
            present = cached[seg]
            hit = int(np.argmin(present)) if not present.all() else hi - lo
            hit_total += hit
            owner[seg[:hit]] = -1  # protected while this request inserts; re-owned below
            need = hi - lo - hit
            short = need - (capacity_blocks - num_cached)
            if short > 0:
                freed = self._evict(heap, short, cached, owner)
                num_cached -= freed
                evicted_total += freed
            placed = min(need, capacity_blocks - num_cached)
            if placed > 0:
                cached[seg[hit : hit + placed]] = True
                num_cached += placed
                inserted_total += placed
            end = lo + hit + placed
            if end == lo:
                continue
            nu = next_use[lo:end]
            cuts = np.flatnonzero(nu[1:] != nu[:-1]) + 1
            starts = [lo, *(lo + cuts).tolist()]
            ends = [*starts[1:], end]
            for s, e in zip(starts, ends, strict=True):
                seq += 1
                owner[ids[s:e]] = seq
                heapq.heappush(heap, (-int(next_use[s]), -(e - lo), seq, s, e, lo))
        return OracleRun(
            capacity_blocks, self.full_blocks, hit_total, inserted_total, evicted_total
        )

    def _evict(
        self,
        heap: list[_Entry],
        num_blocks: int,
        cached: npt.NDArray[np.bool_],
        owner: IntArray,
    ) -> int:
        """Evicts up to ``num_blocks`` blocks, farthest next use first, deep end of a run first."""
        ids = self.ids
        freed = 0
        while freed < num_blocks and heap:
            neg_nu, _, seq, s, e, lo = heapq.heappop(heap)
            run = ids[s:e]
            live = np.flatnonzero(owner[run] == seq)
            if len(live) == 0:
                continue
            # Hits re-own a run's shallow part and evictions take its deep part, so the live
            # blocks are contiguous; evict from the deep end.
            take = min(num_blocks - freed, len(live))
            gone = run[live[-take:]]
            cached[gone] = False
            owner[gone] = -1
            freed += take
            if take < len(live):
                new_e = s + int(live[-take - 1]) + 1
                heapq.heappush(heap, (neg_nu, lo - new_e, seq, s, new_e, lo))
        return freed
