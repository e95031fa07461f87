"""Engine KV events -> kvtide events: block identity from token ids, not engine hash functions.

An engine's ``BlockStored`` carries its blocks' token ids and the engine hash of the parent
block. The translator keeps, per replica, a map from engine hash to kvtide hash; a stored run's
kvtide hashes are ``hash_tokens(token_ids, block_tokens, seed, parent=kvtide(parent))``, the
same hashes the router computes for a request's prompt. So kvtide never re-implements vLLM's
sha256-over-CBOR or SGLang's hashing, and survives their changes.

A store whose parent is unknown (an event was lost, or the subscriber joined late) cannot be
placed and is counted as unresolved; so is a removal of an unknown hash. Stores at another
block size than the router's are skipped (counted). The map costs a dict entry per (engine
block, replica): ~150 bytes, on the ingestion side only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvtide.core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvtide.core.hashing import hash_tokens
from kvtide.errors import KvtideError
from kvtide.routing.index import IndexStore
from kvtide.state.kv_wire import (
    EngineAllBlocksCleared,
    EngineBlockRemoved,
    EngineBlockStored,
    EngineEvent,
    EngineEventBatch,
    EngineHash,
    KvEventFormatError,
    medium_tier,
    tier_medium,
)
from kvtide.types import BlockHash, ReplicaId

SeedFor = Callable[[EngineBlockStored], int]
_Mapped = tuple[BlockHash, int, int]
"""The namespace seed of a stored run (e.g. from its ``lora_name`` / ``cache_salt``)."""


@dataclass(slots=True)
class TranslateCounters:
    stored_blocks: int = 0
    removed_blocks: int = 0
    unresolved_stores: int = 0
    unknown_removes: int = 0
    skipped_block_size: int = 0
    malformed: int = 0


class _ConstantSeed:
    __slots__ = ("seed",)

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __call__(self, event: EngineBlockStored) -> int:
        return self.seed


class EventTranslator:
    """Per-replica engine-hash -> kvtide-hash maps, and the translation of event runs."""

    def __init__(self, block_tokens: int, seed: int | SeedFor) -> None:
        self.block_tokens = block_tokens
        self._seed_for: SeedFor = seed if callable(seed) else _ConstantSeed(seed)
        # engine hash -> (kvtide hash, tier bits, namespace seed it was hashed in): a
        # continuation is hashed in its parent's namespace (vLLM sends a request's salt in its
        # first block's extra keys only, so a later run under that parent carries none)
        self._maps: dict[ReplicaId, dict[EngineHash, _Mapped]] = {}
        self.counters = TranslateCounters()

    def num_mapped(self, replica: ReplicaId) -> int:
        return len(self._maps.get(replica, ()))

    def clear(self, replica: ReplicaId) -> None:
        self._maps.pop(replica, None)

    def translate(self, replica: ReplicaId, events: Iterable[EngineEvent]) -> list[KVEvent]:
        m = self._maps.setdefault(replica, {})
        out: list[KVEvent] = []
        for e in events:
            if isinstance(e, EngineBlockStored):
                try:
                    stored = self._stored(m, e)
                except (KvtideError, TypeError, ValueError, OverflowError):
                    # a value the decoder let through that the hashing refuses: this event
                    # is lost, not the intake (an exception here ended it for good)
                    self.counters.malformed += 1
                    continue
                if stored is not None:
                    out.append(stored)
            elif isinstance(e, EngineBlockRemoved):
                removed = self._removed(m, e)
                if removed is not None:
                    out.append(removed)
            elif isinstance(e, EngineAllBlocksCleared):
                m.clear()
                out.append(AllBlocksCleared())
        return out

    def _stored(self, m: dict[EngineHash, _Mapped], e: EngineBlockStored) -> BlockStored | None:
        c = self.counters
        bt = self.block_tokens
        if e.block_size != bt:
            c.skipped_block_size += 1
            return None
        if len(e.token_ids) != bt * len(e.block_hashes):
            c.malformed += 1
            return None
        parent: BlockHash | None = None
        if e.parent_block_hash is not None:
            known = m.get(e.parent_block_hash)
            if known is None:
                c.unresolved_stores += 1
                return None
            parent, seed = known[0], known[2]
        else:
            seed = self._seed_for(e)
        ours = hash_tokens(e.token_ids, bt, seed, parent).tolist()
        tier = medium_tier(e.medium)
        bit = 1 << tier
        for theirs, h in zip(e.block_hashes, ours, strict=True):
            prev = m.get(theirs)
            m[theirs] = (h, bit | (prev[1] if prev is not None else 0), seed)
        c.stored_blocks += len(ours)
        return BlockStored(tuple(ours), parent, None, bt, tier, e.lora_name)

    def _removed(self, m: dict[EngineHash, _Mapped], e: EngineBlockRemoved) -> BlockRemoved | None:
        tier = medium_tier(e.medium)
        bit = 1 << tier
        ours: list[BlockHash] = []
        for theirs in e.block_hashes:
            known = m.get(theirs)
            if known is None or not known[1] & bit:
                self.counters.unknown_removes += 1
                continue
            left = known[1] & ~bit
            if left:
                m[theirs] = (known[0], left, known[2])
            else:
                del m[theirs]
            ours.append(known[0])
        self.counters.removed_blocks += len(ours)
        return BlockRemoved(tuple(ours), tier) if ours else None


class EngineEventSink:
    """Applies engine batches to an index through a translator (a ``SequencedIngest``'s
    ``apply`` and ``clear``)."""

    def __init__(self, index: IndexStore, translator: EventTranslator) -> None:
        self.index = index
        self.translator = translator

    def apply(self, replica: ReplicaId, batch: EngineEventBatch) -> None:
        self.index.apply_all(replica, self.translator.translate(replica, batch.events))

    def clear(self, replica: ReplicaId) -> None:
        self.translator.clear(replica)
        self.index.clear_replica(replica)


def _opt_int(h: BlockHash | None) -> int | None:
    return None if h is None else int(h)


def to_engine_events(events: Iterable[KVEvent]) -> list[EngineEvent]:
    """kvtide events in the engines' shape: hashes stay kvtide's (uint64 ints), token ids are
    passed on when the event has them (a consumer translating by tokens needs them)."""
    out: list[EngineEvent] = []
    for e in events:
        if isinstance(e, BlockStored):
            out.append(
                EngineBlockStored(
                    block_hashes=tuple(int(h) for h in e.block_hashes),
                    parent_block_hash=_opt_int(e.parent_block_hash),
                    token_ids=tuple(e.token_ids or ()),
                    block_size=e.block_tokens,
                    medium=tier_medium(e.tier),
                    lora_name=e.namespace,
                )
            )
        elif isinstance(e, BlockRemoved):
            out.append(
                EngineBlockRemoved(tuple(int(h) for h in e.block_hashes), tier_medium(e.tier))
            )
        else:
            out.append(EngineAllBlocksCleared())
    return out


def _native(h: EngineHash) -> BlockHash:
    if isinstance(h, bytes):
        raise KvEventFormatError("a kvtide publisher's block hashes are ints, got bytes")
    return BlockHash(h & 0xFFFFFFFFFFFFFFFF)


def from_native_events(events: Iterable[EngineEvent]) -> list[KVEvent]:
    """Engine-shaped events whose hashes already are kvtide's (a kvtide publisher) back to
    kvtide events, with no translation."""
    out: list[KVEvent] = []
    for e in events:
        if isinstance(e, EngineBlockStored):
            parent = e.parent_block_hash
            out.append(
                BlockStored(
                    tuple(_native(h) for h in e.block_hashes),
                    None if parent is None else _native(parent),
                    e.token_ids or None,
                    e.block_size,
                    medium_tier(e.medium),
                    e.lora_name,
                )
            )
        elif isinstance(e, EngineBlockRemoved):
            out.append(
                BlockRemoved(tuple(_native(h) for h in e.block_hashes), medium_tier(e.medium))
            )
        else:
            out.append(AllBlocksCleared())
    return out


class NativeEventSink:
    """Applies batches from a kvtide publisher (hashes already kvtide's) to an index."""

    def __init__(self, index: IndexStore) -> None:
        self.index = index

    def apply(self, replica: ReplicaId, batch: EngineEventBatch) -> None:
        self.index.apply_all(replica, from_native_events(batch.events))

    def clear(self, replica: ReplicaId) -> None:
        self.index.clear_replica(replica)
