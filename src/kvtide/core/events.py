"""KV events: what a cache stored or removed, shaped like vLLM's KV events.

The router's index consumes these from kvtide's own caches and, translated, from real engines.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtide.types import BlockHash, Tier


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks appended under ``parent_block_hash`` (``None``: at the root), in prefix order."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...] | None
    block_tokens: int
    tier: Tier = Tier.DEVICE
    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    tier: Tier = Tier.DEVICE


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
