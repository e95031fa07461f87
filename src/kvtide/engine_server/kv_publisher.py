"""The engine's KV events on the wire, as vLLM publishes them: ``BlockStored`` with the blocks'
token ids (and the request's ``cache_salt``), ``BlockRemoved``, ``AllBlocksCleared``, in
msgpack ``KVEventBatch``es on ``kvtide.state``'s ZMQ publisher (PUB with sequence numbers, a
ROUTER answering replays). ``sglang`` sends SGLang's shape instead: signed int64 hashes and no
vLLM-only fields.

The core cache knows blocks by hash only; ``BlockTokens`` keeps the token ids (and salt) of the
blocks a request brings, from its arrival until no tier and no request holds them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

from kvtide.core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvtide.state.kv_events import KvEventPublisher
from kvtide.state.kv_translate import to_engine_events
from kvtide.state.kv_wire import (
    EngineBlockRemoved,
    EngineBlockStored,
    EngineEvent,
    EngineEventBatch,
    EngineHash,
)
from kvtide.types import BlockHash

EventFormat = Literal["vllm", "sglang"]


class _Entry:
    __slots__ = ("holders", "salt", "tokens")

    def __init__(self, tokens: tuple[int, ...], salt: str | None) -> None:
        self.tokens = tokens
        self.salt = salt
        self.holders = 1


class BlockTokens:
    """Block hash -> (token ids, cache salt), counted by holders: each request that brought the
    block, and each tier that stores it."""

    __slots__ = ("_blocks", "block_tokens")

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self._blocks: dict[BlockHash, _Entry] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def hold(self, hashes: Sequence[BlockHash], token_ids: Sequence[int], salt: str | None) -> None:
        bt = self.block_tokens
        blocks = self._blocks
        for i, h in enumerate(hashes):
            entry = blocks.get(h)
            if entry is None:
                blocks[h] = _Entry(tuple(token_ids[i * bt : (i + 1) * bt]), salt)
            else:
                entry.holders += 1

    def release(self, hashes: Sequence[BlockHash]) -> None:
        blocks = self._blocks
        for h in hashes:
            entry = blocks.get(h)
            if entry is None:
                continue
            entry.holders -= 1
            if entry.holders <= 0:
                del blocks[h]

    def stored(self, event: BlockStored) -> tuple[tuple[int, ...], str | None]:
        """The event's blocks' token ids and salt; takes a hold for the storing tier."""
        tokens: list[int] = []
        salt: str | None = None
        entries = []
        for h in event.block_hashes:
            entry = self._blocks.get(h)
            if entry is None:  # unknown: announce no tokens (a consumer counts it malformed)
                return (), None
            entries.append(entry)
        for entry in entries:
            tokens.extend(entry.tokens)
            salt = entry.salt
            entry.holders += 1
        return tuple(tokens), salt

    def clear(self) -> None:
        """Every tier was cleared: blocks stored later are announced without tokens until a
        request brings them again."""
        self._blocks.clear()


def _signed(h: EngineHash) -> EngineHash:
    if isinstance(h, int) and h >= 1 << 63:
        return h - (1 << 64)
    return h


class EnginePublisher:
    """kvtide cache events -> wire batches with token ids, one batch per engine step."""

    def __init__(
        self,
        publisher: KvEventPublisher,
        blocks: BlockTokens,
        *,
        event_format: EventFormat = "vllm",
    ) -> None:
        self.publisher = publisher
        self.blocks = blocks
        self.format = event_format

    def publish(self, events: Sequence[KVEvent], ts_s: float) -> int | None:
        """Sends ``events`` as one batch; returns its sequence number (``None``: nothing)."""
        if not events:
            return None
        wire: list[EngineEvent] = []
        blocks = self.blocks
        # a batch's removals release their blocks' tokens at its end: an offload announces
        # the device's removal before the host tier's store of the same blocks, and released
        # at once, the store found no tokens (an empty store, which consumers drop)
        removed: list[BlockHash] = []
        for event, out in zip(events, to_engine_events(events), strict=True):
            if isinstance(event, BlockStored) and isinstance(out, EngineBlockStored):
                tokens, salt = blocks.stored(event)
                out = dataclasses.replace(out, token_ids=tokens, cache_salt=salt)
            elif isinstance(event, BlockRemoved):
                removed.extend(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                removed.clear()
                blocks.clear()
            wire.append(self._shape(out))
        blocks.release(removed)
        return self.publisher.publish(EngineEventBatch(ts_s, tuple(wire)))

    def _shape(self, e: EngineEvent) -> EngineEvent:
        if self.format == "vllm":
            return e
        if isinstance(e, EngineBlockStored):
            return EngineBlockStored(
                block_hashes=tuple(_signed(h) for h in e.block_hashes),
                parent_block_hash=None
                if e.parent_block_hash is None
                else _signed(e.parent_block_hash),
                token_ids=e.token_ids,
                block_size=e.block_size,
                medium=e.medium,
                cache_salt=e.cache_salt,
            )
        if isinstance(e, EngineBlockRemoved):
            return EngineBlockRemoved(tuple(_signed(h) for h in e.block_hashes), e.medium)
        return e

    def close(self) -> None:
        self.publisher.close()
