"""GlobalPrefixIndex: which replicas (and tiers) hold each block, fed by KV events.

``match(hashes)`` answers, in one pass, how long a prefix of a request each replica holds. It
uses the chained property of block hashes: a cache that holds block i also holds blocks 0..i-1
(radix caches evict leaves first), so each replica's presence along the prompt is monotone and
its end can be found by bisection. The query bisects all replicas together: O(k · log n) table
lookups for n blocks and k distinct prefix lengths, instead of n lookups. ``exact=True`` scans
every block instead (for caches that are not prefix-closed, and for tests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast, runtime_checkable

from kvtide.core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvtide.core.hashing import BlockHashes, as_block_hashes
from kvtide.routing.table import NUM_TIERS, BlockTable
from kvtide.types import BlockHash, ReplicaId, Tier

_EMPTY: Mapping[ReplicaId, int] = {}
_BYTE_BITS = tuple(tuple(i for i in range(8) if b >> i & 1) for b in range(256))


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """Per replica, how many leading blocks of a request it holds.

    ``within_tier[t][r]`` is the longest prefix replica ``r`` holds in tiers ``<= t``, so
    ``device <= host-or-device <= any tier``. Replicas holding nothing are absent.
    """

    num_blocks: int
    within_tier: tuple[Mapping[ReplicaId, int], ...] = field(default=(_EMPTY, _EMPTY, _EMPTY))

    @property
    def device(self) -> Mapping[ReplicaId, int]:
        return self.within_tier[Tier.DEVICE]

    @property
    def any_tier(self) -> Mapping[ReplicaId, int]:
        return self.within_tier[-1]

    def device_blocks(self, replica: ReplicaId) -> int:
        return self.within_tier[Tier.DEVICE].get(replica, 0)

    def cached_blocks(self, replica: ReplicaId) -> int:
        """Leading blocks held in any tier."""
        return self.within_tier[-1].get(replica, 0)

    def tier_blocks(self, replica: ReplicaId) -> tuple[int, int, int]:
        """(device, host, disk) block counts of the held prefix, in prefix order."""
        d = self.within_tier[0].get(replica, 0)
        h = self.within_tier[1].get(replica, 0)
        k = self.within_tier[2].get(replica, 0)
        return d, h - d, k - h

    @property
    def max_blocks(self) -> int:
        any_tier = self.within_tier[-1]
        return max(any_tier.values()) if any_tier else 0


NO_MATCH = PrefixMatch(0)


class IndexStore(Protocol):
    """Where a router keeps its block -> replicas index (in process, or Redis)."""

    def apply(self, replica: ReplicaId, event: KVEvent) -> None: ...

    def apply_all(self, replica: ReplicaId, events: Iterable[KVEvent]) -> None: ...

    def clear_replica(self, replica: ReplicaId) -> None: ...

    def match(self, hashes: Sequence[BlockHash], *, exact: bool = False) -> PrefixMatch: ...


@runtime_checkable
class Occupancy(Protocol):
    """An index that also counts what each replica holds (``GlobalPrefixIndex`` does)."""

    def held_blocks(self, replica: ReplicaId) -> int: ...


RemovalListener = Callable[[ReplicaId, Sequence[BlockHash]], None]


@runtime_checkable
class RemovalFeed(Protocol):
    """An index that tells listeners which blocks each replica evicted from its device tier,
    as it applies the removals (``GlobalPrefixIndex`` does; ``routing.watch`` listens)."""

    def subscribe_removals(self, listener: RemovalListener) -> None: ...


@dataclass(slots=True)
class IndexCounters:
    stored_blocks: int = 0
    removed_blocks: int = 0
    clears: int = 0
    orphan_stores: int = 0  # a store whose parent block the replica was not known to hold


class GlobalPrefixIndex:
    """In-process index over a `BlockTable`; one bit per replica (any number of replicas)."""

    def __init__(self, capacity_blocks: int = 1 << 16) -> None:
        self._table = BlockTable(capacity_blocks)
        self._bit_of: dict[ReplicaId, int] = {}
        self._replica_of: list[ReplicaId | None] = []
        self.counters = IndexCounters()
        # device blocks stored less removed, per replica: its occupancy in O(1) (an engine
        # announces a block once when it caches it and once when it evicts it)
        self._held: dict[ReplicaId, int] = {}
        self._removal_listeners: list[RemovalListener] = []

    def subscribe_removals(self, listener: RemovalListener) -> None:
        """``listener(replica, blocks)`` is called for each run of device-tier removals."""
        self._removal_listeners.append(listener)

    # --- replicas --------------------------------------------------------------------------

    def bit(self, replica: ReplicaId) -> int:
        """The replica's bit number, allocated on first sight (freed bits are reused)."""
        b = self._bit_of.get(replica)
        if b is None:
            try:
                b = self._replica_of.index(None)
                self._replica_of[b] = replica
            except ValueError:
                b = len(self._replica_of)
                self._replica_of.append(replica)
            self._bit_of[replica] = b
            self._table.grow_words(b // 64 + 1)
        return b

    @property
    def replicas(self) -> list[ReplicaId]:
        return list(self._bit_of)

    def remove_replica(self, replica: ReplicaId) -> None:
        """Forgets a replica and frees its bit."""
        b = self._bit_of.pop(replica, None)
        self._held.pop(replica, None)
        if b is not None:
            self._table.clear_bit(b)
            self._replica_of[b] = None

    # --- updates ---------------------------------------------------------------------------

    def add(
        self, replica: ReplicaId, hashes: Sequence[BlockHash], tier: Tier = Tier.DEVICE
    ) -> None:
        self._table.add(_raw(hashes), self.bit(replica), int(tier))
        self.counters.stored_blocks += len(hashes)
        if tier is Tier.DEVICE:
            self._held[replica] = self._held.get(replica, 0) + len(hashes)

    def remove(
        self, replica: ReplicaId, hashes: Sequence[BlockHash], tier: Tier = Tier.DEVICE
    ) -> None:
        b = self._bit_of.get(replica)
        if b is not None:
            self._table.remove(_raw(hashes), b, int(tier))
            if tier is Tier.DEVICE:
                self._held[replica] = max(self._held.get(replica, 0) - len(hashes), 0)
        self.counters.removed_blocks += len(hashes)
        if tier is Tier.DEVICE:
            for listener in self._removal_listeners:
                listener(replica, hashes)

    def clear_replica(self, replica: ReplicaId) -> None:
        """Drops everything the replica holds (AllBlocksCleared, or a resync)."""
        b = self._bit_of.get(replica)
        if b is not None:
            self._table.clear_bit(b)
        self._held.pop(replica, None)
        self.counters.clears += 1

    def apply(self, replica: ReplicaId, event: KVEvent) -> None:
        if isinstance(event, BlockStored):
            parent = event.parent_block_hash
            if parent is not None and not self.holds(replica, parent, event.tier):
                self.counters.orphan_stores += 1
            self.add(replica, event.block_hashes, event.tier)
        elif isinstance(event, BlockRemoved):
            self.remove(replica, event.block_hashes, event.tier)
        elif isinstance(event, AllBlocksCleared):
            self.clear_replica(replica)

    def apply_all(self, replica: ReplicaId, events: Iterable[KVEvent]) -> None:
        """Applies events in order, batching runs of same-kind, same-tier events."""
        run: list[BlockHash] = []
        run_kind: tuple[type, Tier] | None = None
        for event in events:
            if isinstance(event, AllBlocksCleared):
                self._flush(replica, run_kind, run)
                run, run_kind = [], None
                self.clear_replica(replica)
                continue
            kind = (type(event), event.tier)
            if kind != run_kind:
                self._flush(replica, run_kind, run)
                run, run_kind = [], kind
            if isinstance(event, BlockStored):
                parent = event.parent_block_hash
                if parent is not None and not (run and run[-1] == parent):
                    self._flush(replica, run_kind, run)  # the parent may sit in the run
                    run = []
                    if not self.holds(replica, parent, event.tier):
                        self.counters.orphan_stores += 1
            run.extend(event.block_hashes)
        self._flush(replica, run_kind, run)

    def _flush(
        self, replica: ReplicaId, kind: tuple[type, Tier] | None, run: list[BlockHash]
    ) -> None:
        if kind is None or not run:
            return
        if kind[0] is BlockStored:
            self.add(replica, run, kind[1])
        else:
            self.remove(replica, run, kind[1])

    # --- queries ---------------------------------------------------------------------------

    def blocks_of(self, replica: ReplicaId, tier: Tier = Tier.DEVICE) -> list[BlockHash]:
        """Every block ``replica`` holds in ``tier``, in no order; O(the table's slots)."""
        b = self._bit_of.get(replica)
        if b is None:
            return []
        return cast(list[BlockHash], self._table.keys_with(b, int(tier)))

    def holds(self, replica: ReplicaId, block: BlockHash, tier: Tier = Tier.DEVICE) -> bool:
        b = self._bit_of.get(replica)
        if b is None:
            return False
        return bool(self._table.tier_masks(block)[tier] >> b & 1)

    def replicas_holding(self, block: BlockHash, tier: Tier = Tier.DEVICE) -> list[ReplicaId]:
        mask = self._table.tier_masks(block)[tier]
        return self._replicas(mask)

    def match(self, hashes: Sequence[BlockHash], *, exact: bool = False) -> PrefixMatch:
        """Per replica and tier bound, the longest held prefix of ``hashes``."""
        raw = as_block_hashes(hashes).raw
        n = len(raw) >> 3
        if n == 0 or self._table.num_blocks == 0:
            return PrefixMatch(n)
        ends_of = self._exact if exact else self._bisect
        tiers = self._table.tiers_in_use
        out: list[Mapping[ReplicaId, int]] = []
        for t in range(NUM_TIERS):
            if out and t not in tiers:
                out.append(out[-1])  # no blocks in this tier: same answer as the tier above
                continue
            out.append(self._expand(ends_of(raw, n, t)))
        return PrefixMatch(n, tuple(out))

    def _bisect(self, raw: bytes, n: int, max_tier: int) -> list[tuple[int, int]]:
        """(replica mask, held prefix length) pairs, by bisection over monotone masks."""
        mask_at = self._table.mask_at
        frm = int.from_bytes
        ends: list[tuple[int, int]] = []
        m0 = mask_at(frm(raw[:8], "little"), max_tier)
        if not m0:
            return ends
        # (lo, hi, mask at lo, mask at hi): replicas in mlo & ~mhi end in (lo, hi].
        stack = [(0, n, m0, 0)]
        while stack:
            lo, hi, mlo, mhi = stack.pop()
            diff = mlo & ~mhi
            if not diff:
                continue
            if hi - lo == 1:
                ends.append((diff, hi))
                continue
            mid = (lo + hi) >> 1
            p = mid << 3
            mm = mask_at(frm(raw[p : p + 8], "little"), max_tier) & mlo
            stack.append((mid, hi, mm, mhi & mm))
            stack.append((lo, mid, mlo, mm))
        return ends

    def _exact(self, raw: bytes, n: int, max_tier: int) -> list[tuple[int, int]]:
        """(replica mask, held prefix length) pairs, by a walk over every block."""
        mask_at = self._table.mask_at
        ends: list[tuple[int, int]] = []
        alive = -1
        for i, h in enumerate(BlockHashes(raw).tolist()):
            m = alive & mask_at(h, max_tier)
            if i and alive & ~m:
                ends.append((alive & ~m, i))
            alive = m
            if not alive:
                return ends
        ends.append((alive, n))
        return ends

    def _expand(self, ends: list[tuple[int, int]]) -> dict[ReplicaId, int]:
        rep = self._replica_of
        out: dict[ReplicaId, int] = {}
        for mask, length in ends:
            base = 0
            while mask:
                byte = mask & 255
                if byte:
                    for i in _BYTE_BITS[byte]:
                        r = rep[base + i]
                        if r is not None:
                            out[r] = length
                mask >>= 8
                base += 8
        return out

    def _replicas(self, mask: int) -> list[ReplicaId]:
        out = []
        while mask:
            low = mask & -mask
            r = self._replica_of[low.bit_length() - 1]
            if r is not None:
                out.append(r)
            mask ^= low
        return out

    # --- sizes -----------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        """Distinct blocks held anywhere."""
        return self._table.num_blocks

    def num_entries(self) -> int:
        """(block, replica, tier) entries; O(table size)."""
        return self._table.num_entries()

    @property
    def nbytes(self) -> int:
        return self._table.nbytes

    def bytes_per_entry(self) -> float:
        """Table bytes per (block, replica, tier) entry held."""
        entries = self.num_entries()
        return self.nbytes / entries if entries else 0.0

    def held_blocks(self, replica: ReplicaId) -> int:
        """Device blocks the replica holds, O(1): the blocks its events stored less those
        they removed since its last clear (``replica_blocks`` counts them, O(table))."""
        return self._held.get(replica, 0)

    def replica_blocks(self, tier: Tier = Tier.DEVICE) -> dict[ReplicaId, int]:
        """Blocks held per replica in ``tier``; O(table size), for reports and tests."""
        out: dict[ReplicaId, int] = {}
        for b, k in self._table.bits_per_replica(int(tier)).items():
            r = self._replica_of[b]
            if r is not None:
                out[r] = k
        return out


def _raw(hashes: Sequence[BlockHash]) -> bytes:
    return as_block_hashes(hashes).raw
