"""Sequenced event ingestion: in-order apply, gap detection, resync; no sockets here.

Engines number their event batches (vLLM and SGLang: an 8-byte big-endian sequence number per
batch). ``SequencedIngest`` applies each replica's batches in order, drops duplicates, and on a
gap holds later batches back and returns a ``Gap``: the caller then either replays the missing
batches through ``receive`` (vLLM's replay socket) or calls ``resync`` with a snapshot (the
simulator, which can read its caches) or without one (drop the replica's entries and rebuild
from what comes next). The ZMQ subscriber in ``kvtide.state`` and the simulator both use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from kvtide.clock import Clock
from kvtide.core.cache import KVCache
from kvtide.core.events import BlockStored, KVEvent
from kvtide.core.hashing import BlockHashes
from kvtide.core.node import Node
from kvtide.routing.consistency import IndexHealth
from kvtide.routing.index import IndexStore
from kvtide.types import BlockHash, ReplicaId, Tier

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Gap:
    """Batches ``first_missing .. next_seen - 1`` of ``replica`` never arrived."""

    replica: ReplicaId
    first_missing: int
    next_seen: int

    @property
    def num_missing(self) -> int:
        return self.next_seen - self.first_missing


@dataclass(slots=True)
class IngestCounters:
    received: int = 0
    applied: int = 0
    duplicates: int = 0
    gaps: int = 0
    missing: int = 0
    resyncs: int = 0
    overflows: int = 0  # gaps given up on because too many batches were held back


class _Stream(Generic[T]):
    __slots__ = ("next_seq", "pending")

    def __init__(self) -> None:
        self.next_seq: int | None = None
        self.pending: dict[int, tuple[T, float | None]] = {}


class SequencedIngest(Generic[T]):
    """Applies per-replica sequenced payloads in order through ``apply``.

    ``clear(replica)`` must drop everything known about the replica (index entries, engine
    hash maps). At most ``max_pending`` batches per replica are held behind a gap; beyond that
    the gap is given up on: the replica is cleared and ingestion resumes from the oldest batch
    held. Lag (clock now minus the batch's publish time) goes to ``health``.
    """

    def __init__(
        self,
        apply: Callable[[ReplicaId, T], None],
        clear: Callable[[ReplicaId], None],
        clock: Clock,
        health: IndexHealth | None = None,
        *,
        max_pending: int = 4096,
    ) -> None:
        self._apply = apply
        self._clear = clear
        self.clock = clock
        self.health = health if health is not None else IndexHealth()
        self.max_pending = max_pending
        self.counters = IngestCounters()
        self._streams: dict[ReplicaId, _Stream[T]] = {}

    def _stream(self, replica: ReplicaId) -> _Stream[T]:
        s = self._streams.get(replica)
        if s is None:
            s = self._streams[replica] = _Stream()
        return s

    def next_seq(self, replica: ReplicaId) -> int | None:
        """The sequence number expected next from ``replica`` (None before the first)."""
        s = self._streams.get(replica)
        return None if s is None else s.next_seq

    def pending_seqs(self, replica: ReplicaId) -> list[int]:
        """Sequence numbers held back behind a gap, in order."""
        s = self._streams.get(replica)
        return sorted(s.pending) if s is not None else []

    def has_gap(self, replica: ReplicaId) -> bool:
        s = self._streams.get(replica)
        return bool(s and s.pending)

    def receive(
        self, replica: ReplicaId, seq: int, payload: T, sent_s: float | None = None
    ) -> Gap | None:
        """Takes batch ``seq``; returns the open gap when batches before it are missing."""
        self.counters.received += 1
        s = self._stream(replica)
        if s.next_seq is None:
            s.next_seq = seq  # join the stream wherever it is
        if seq < s.next_seq or seq in s.pending:
            self.counters.duplicates += 1
            return None
        if seq > s.next_seq:
            opened = not s.pending
            s.pending[seq] = (payload, sent_s)
            gap = Gap(replica, s.next_seq, min(s.pending))
            if opened:
                self.counters.gaps += 1
                self.counters.missing += gap.num_missing
                self.health.gap(replica, gap.num_missing)
            if len(s.pending) > self.max_pending:
                self.counters.overflows += 1
                self.resync(replica, min(s.pending))
                return None
            return gap
        self._apply_one(replica, s, payload, sent_s)
        self._drain(replica, s)
        return None

    def _apply_one(
        self, replica: ReplicaId, s: _Stream[T], payload: T, sent_s: float | None
    ) -> None:
        self._apply(replica, payload)
        self.counters.applied += 1
        assert s.next_seq is not None
        s.next_seq += 1
        if sent_s is not None:
            self.health.lag(replica, self.clock.now() - sent_s)

    def _drain(self, replica: ReplicaId, s: _Stream[T]) -> None:
        had_gap = bool(s.pending)
        while s.next_seq in s.pending:
            payload, sent_s = s.pending.pop(s.next_seq)
            self._apply_one(replica, s, payload, sent_s)
        if had_gap and not s.pending:
            self.health.repaired(replica)

    def resync(self, replica: ReplicaId, next_seq: int, snapshot: T | None = None) -> None:
        """Clears the replica, applies ``snapshot`` (its state as of just before batch
        ``next_seq``) if given, and continues from ``next_seq``: held batches before it are
        dropped, those from it on are applied in order."""
        s = self._stream(replica)
        self._clear(replica)
        if snapshot is not None:
            self._apply(replica, snapshot)
        self.counters.resyncs += 1
        s.next_seq = next_seq
        for seq in [q for q in s.pending if q < next_seq]:
            del s.pending[seq]
        self._drain(replica, s)
        if s.pending:
            # later batches are still missing: ingestion waits for them as for any gap
            return
        self.health.repaired(replica, resync=True)

    def rewind(self, replica: ReplicaId) -> None:
        """Clears the replica and rejoins its stream at the next batch received (before a
        replay of the publisher's whole buffer)."""
        self._clear(replica)
        self._streams[replica] = _Stream()

    def forget(self, replica: ReplicaId) -> None:
        """A replica left: clear it and stop tracking its stream."""
        self._streams.pop(replica, None)
        self._clear(replica)
        self.health.forget(replica)


class KVEventIngest(SequencedIngest[list[KVEvent]]):
    """``SequencedIngest`` of kvtide's own events into an index."""

    def __init__(
        self,
        index: IndexStore,
        clock: Clock,
        health: IndexHealth | None = None,
        *,
        max_pending: int = 4096,
    ) -> None:
        super().__init__(
            index.apply_all, index.clear_replica, clock, health, max_pending=max_pending
        )
        self.index = index


def snapshot_events(cache: KVCache, tier: Tier | None = None) -> list[KVEvent]:
    """Events that rebuild what ``cache`` holds now: one ``BlockStored`` per tree node, parents
    first. Lets a resync start from the truth when the caller can read the cache."""
    tier = cache.config.tier if tier is None else tier
    bt = cache.config.block_tokens
    ns = cache.config.namespace
    out: list[KVEvent] = []
    for node, parent_hash in _walk(cache.tree.root):
        hashes = BlockHashes(node.key).tolist()
        out.append(BlockStored(tuple(hashes), parent_hash, None, bt, tier, ns))
    return out


def _walk(root: Node) -> Iterator[tuple[Node, BlockHash | None]]:
    stack: list[tuple[Node, BlockHash | None]] = [(c, None) for c in root.children.values()]
    while stack:
        node, parent_hash = stack.pop()
        yield node, parent_hash
        last = BlockHash(int.from_bytes(node.key[-8:], "little"))
        stack.extend((c, last) for c in node.children.values())
