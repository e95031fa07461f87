"""Fragmentation of one engine's KV pool at an instant, and across a fleet.

What is measured, per snapshot of a ``Scheduler``:

- **internal waste**: slots of blocks a running request holds that hold no token. Two kinds:
  the unwritten tail of the block its last token sits in (``partial``), and whole or partial
  blocks reserved ahead for tokens not generated yet (``reserved``: decode runs reserve room
  before they write it, and variable-length generation leaves it empty until then).
- **external fragmentation**: the free list as runs of consecutive block ids. An allocator or
  a transfer that wants a contiguous run of K blocks gets the pool's next K free blocks in as
  many runs as they fall into; each run is one copy to the host tier, and the cost model
  charges every copy its fixed overhead and per-layer chunk latency (its small-chunk ramp).
  ``copy_cost_ratio`` is the seconds of those copies over the seconds of one contiguous copy.
- **duplicated blocks**: the same content (the same chained hash) in two physical blocks of
  one pool, e.g. two requests prefilling the same prefix before either block entered the cache.
- **replication**: how many replicas' caches hold each cached block (``replication``).

All of it reads the scheduler's and the core's state; nothing is recorded on the hot path.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvtide.core.cache import KVCache
from kvtide.core.node import Node
from kvtide.costs.cost_model import CostModel
from kvtide.engine.scheduler import Scheduler
from kvtide.types import Tier


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """One pool at one instant; every count in blocks or token slots."""

    capacity_blocks: int
    free_blocks: int
    cached_blocks: int
    private_blocks: int
    """Blocks running requests hold outside the cache (being prefilled, generated into)."""
    written_tokens: int
    """Tokens whose KV sits in private blocks."""
    partial_waste_tokens: int
    reserved_waste_tokens: int
    duplicated_blocks: int
    free_runs: int
    largest_free_run: int
    copy_runs: int
    """Runs the pool's next ``copy_blocks`` free blocks fall into (1 = contiguous)."""
    copy_blocks: int


def free_runs(free_ids: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Lengths of the runs of consecutive ids among ``free_ids`` (in any order)."""
    ids = np.sort(np.asarray(free_ids, dtype=np.int64))
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(ids) != 1)
    edges = np.concatenate(([0], breaks + 1, [ids.size]))
    return np.diff(edges)


def runs_in_order(ids: npt.ArrayLike) -> int:
    """Contiguous runs in ``ids`` taken in the given order (an allocation's block list)."""
    arr = np.asarray(ids, dtype=np.int64)
    if arr.size == 0:
        return 0
    return int(np.count_nonzero(np.diff(arr) != 1)) + 1


def snapshot(scheduler: Scheduler, copy_blocks: int) -> PoolSnapshot:
    """The pool of ``scheduler`` now. ``copy_blocks``: the size of the allocation whose
    contiguity is measured (e.g. a typical request's blocks)."""
    cache = scheduler.cache
    pool = cache.pool
    bt = scheduler.block_tokens
    free = np.frombuffer(pool._free, dtype=np.int32)
    runs = free_runs(free)
    # try_allocate pops from the end of the stack: the next K blocks handed out.
    k = min(copy_blocks, free.size)
    next_k = free[free.size - k :][::-1] if k else free[:0]
    partial = reserved = private_blocks = written = 0
    seen: set[int] = set()
    duplicated = 0
    for seq in (*scheduler.running, *scheduler.loading):  # parked for remote KV: held too
        private_blocks += len(seq.private)
        held = seq.kv_capacity_tokens
        computed = min(seq.num_computed, held)
        if not held:
            continue
        in_tree = seq.tree_blocks * bt
        written += max(0, computed - in_tree)
        # The block holding the last computed token is partly written; the rest is reserved.
        filled_blocks = -(-computed // bt)
        partial += filled_blocks * bt - computed
        reserved += held - filled_blocks * bt
        # Private blocks that hold a full computed prompt block: duplicates if the same
        # content is cached or held by another request's private block.
        full_computed = min(computed, seq.request.prompt_tokens) // bt
        hashes = seq.hashes
        for i in range(seq.tree_blocks, min(full_computed, len(hashes))):
            h = hashes[i]
            if h in seen:
                duplicated += 1
            seen.add(h)
    if seen:
        cached = set(tree_hashes(cache).tolist())
        duplicated += len(seen & cached)
    return PoolSnapshot(
        capacity_blocks=cache.capacity_blocks,
        free_blocks=int(free.size),
        cached_blocks=cache.num_cached_blocks,
        private_blocks=private_blocks,
        written_tokens=written,
        partial_waste_tokens=partial,
        reserved_waste_tokens=reserved,
        duplicated_blocks=duplicated,
        free_runs=int(runs.size),
        largest_free_run=int(runs.max()) if runs.size else 0,
        copy_runs=runs_in_order(next_k),
        copy_blocks=int(k),
    )


def _nodes(cache: KVCache) -> list[Node]:
    out: list[Node] = []
    stack = list(cache.tree.root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def tree_hashes(cache: KVCache) -> npt.NDArray[np.uint64]:
    """Every cached block's chained hash."""
    keys = b"".join(n.key for n in _nodes(cache))
    return np.frombuffer(keys, dtype=np.uint64)


def index_bytes(cache: KVCache) -> int:
    """Bytes the cache's prefix index takes in this process: its nodes, their hash keys,
    block-id arrays and child maps (``sys.getsizeof``; the pool's free list excluded)."""
    total = 0
    for n in _nodes(cache):
        total += sys.getsizeof(n) + sys.getsizeof(n.key) + sys.getsizeof(n.blocks)
        total += sys.getsizeof(n.children)
    return total


@dataclass(frozen=True, slots=True)
class Replication:
    distinct_blocks: int
    held_blocks: int
    """Sum over replicas of the cached blocks: ``held / distinct`` is the mean factor."""
    held_by_two_or_more: int

    @property
    def factor(self) -> float:
        return self.held_blocks / self.distinct_blocks if self.distinct_blocks else 0.0


def replication(caches: Sequence[KVCache]) -> Replication:
    """How many of the caches hold each cached block."""
    parts = [np.unique(tree_hashes(c)) for c in caches]
    if not parts:
        return Replication(0, 0, 0)
    allh = np.concatenate(parts)
    _, counts = np.unique(allh, return_counts=True)
    return Replication(int(counts.size), int(allh.size), int(np.count_nonzero(counts >= 2)))


def copy_seconds(model: CostModel, block_tokens: int, run_blocks: Sequence[int]) -> float:
    """Seconds the cost model charges to write runs of ``run_blocks`` blocks to the host tier,
    one transfer per run (``CostModel.transfer_time``: overhead + chunk latency per copy)."""
    return sum(
        model.transfer_time(model.kv_bytes(n * block_tokens), Tier.HOST, to_device=False)
        for n in run_blocks
        if n > 0
    )


def copy_cost_ratio(model: CostModel, block_tokens: int, blocks: int, runs: int) -> float:
    """Seconds to copy ``blocks`` blocks split into ``runs`` near-equal runs, over one run."""
    if blocks <= 0 or runs <= 0:
        return 1.0
    base, extra = divmod(blocks, runs)
    split = [base + 1] * extra + [base] * (runs - extra)
    return copy_seconds(model, block_tokens, split) / copy_seconds(model, block_tokens, [blocks])


def block_copy_seconds(model: CostModel, block_tokens: int) -> float:
    """One block alone to the host tier: the per-block cost when every block is its own run."""
    return copy_seconds(model, block_tokens, [1])
