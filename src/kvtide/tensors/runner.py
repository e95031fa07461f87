"""Runs a llama model on a paged KV cache whose tiers are kvtide's ``TieredCache``.

A prompt's full blocks are hashed with the core's chained hashes. ``prefill`` looks them up
across the tiers through ``TieredCache.access``, the same call the simulator makes: it counts
the device hits, decides (by its cost model) how much of a lower-tier hit to reload, stores the
prompt on the device, and writes evicted blocks down through its admission filters. A
``TensorMover`` carries each of those moves out on real bytes as it is decided; the runner then
computes everything after the usable prefix and writes the new blocks' KV into their pool
slots. The partial last block is always recomputed, never cached; a fully cached prompt still
recomputes its last block so that there is a token to take logits from.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from kvtide.core.hashing import BlockHashes, Namespace, hash_tokens
from kvtide.core.node import Node
from kvtide.core.tiers import TieredAccess, TieredCache
from kvtide.tensors.model import LlamaModel
from kvtide.tensors.offload import TensorMover
from kvtide.tensors.paged_kv import PagedKV, PagedPast
from kvtide.types import Tier


@dataclass(frozen=True, slots=True)
class PrefillStats:
    prompt_tokens: int
    device_hit_tokens: int
    host_reload_tokens: int
    disk_reload_tokens: int
    computed_tokens: int
    stored_blocks: int
    """Blocks this prefill added to the cache."""

    @property
    def reused_tokens(self) -> int:
        return self.device_hit_tokens + self.host_reload_tokens + self.disk_reload_tokens


@dataclass(slots=True)
class ActiveSequence:
    """A prompt being served: holds a lock on its cached blocks until ``release``."""

    token_ids: list[int]
    past: PagedPast
    handle: Node
    is_released: bool = False


@dataclass(frozen=True, slots=True)
class Prefill:
    logits: torch.Tensor
    """[vocab] at the last prompt token, or [computed tokens, vocab] with ``all_logits``."""
    stats: PrefillStats
    sequence: ActiveSequence


@dataclass(frozen=True, slots=True)
class Generation:
    token_ids: list[int]
    prefill: PrefillStats
    first_logits: torch.Tensor
    step_logits: list[torch.Tensor] = field(default_factory=list)


class PagedRunner:
    """One model, one paged KV tensor sized to the device tier's pool, and the lower tiers'
    bytes kept in step with ``tiers`` by a ``TensorMover`` (disk files under ``disk_dir``)."""

    def __init__(
        self,
        model: LlamaModel,
        tiers: TieredCache,
        namespace: Namespace,
        *,
        disk_dir: Path | str | None = None,
    ) -> None:
        self.model = model
        self.tiers = tiers
        self.cache = tiers.device
        self.block_tokens = tiers.block_tokens
        self.kv = PagedKV(model.config, self.cache.pool.num_blocks, self.block_tokens, model.device)
        self.mover = TensorMover(self.kv, tiers, disk_dir)
        self.seed = namespace.seed

    def prefill(self, token_ids: Sequence[int], *, all_logits: bool = False) -> Prefill:
        """Computes a prompt on top of whatever prefix the tiers hold. The caller owns the
        returned sequence's lock and must ``release`` it (``generate`` does)."""
        ids = list(token_ids)
        if not ids:
            raise ValueError("prefill needs at least one token")
        bt = self.block_tokens
        hashes = hash_tokens(np.asarray(ids, dtype=np.int64), bt, self.seed)
        usable = min(len(hashes), (len(ids) - 1) // bt)
        access = self.tiers.access(hashes[:usable], len(ids), lock=True)
        prefix = self._valid_prefix(hashes, access)
        path_ids = access.block_ids
        start = prefix * bt
        past = PagedPast(self.kv, path_ids[:prefix])
        out = self.model.forward(ids[start:], past, all_logits=all_logits)

        stored = self.cache.insert(hashes)  # the last block of a block-aligned prompt
        self.cache.lock(stored.handle)
        self.cache.unlock(access.handle)
        all_ids = stored.block_ids
        mover = self.mover
        for j in range(prefix, len(all_ids)):
            offset = j * bt - start
            self.kv.write(all_ids[j], out.kv[:, :, :, offset : offset + bt])
            mover.computed(hashes[j])
        if mover.pending:
            mover.flush()
        tail_from = len(all_ids) * bt - start
        tail = out.kv[:, :, :, tail_from:] if tail_from < out.kv.shape[3] else None
        sequence = ActiveSequence(ids, PagedPast(self.kv, all_ids, tail), stored.handle)
        device = min(access.device_blocks, prefix)
        host = min(access.reload_blocks[Tier.HOST], prefix - device)
        disk = min(access.reload_blocks[Tier.DISK], prefix - device - host)
        reloaded = sum(access.reload_blocks.values())
        stats = PrefillStats(
            prompt_tokens=len(ids),
            device_hit_tokens=device * bt,
            host_reload_tokens=host * bt,
            disk_reload_tokens=disk * bt,
            computed_tokens=len(ids) - start,
            stored_blocks=access.new_blocks - reloaded + stored.new_blocks,
        )
        logits = out.logits if all_logits else out.logits[-1]
        return Prefill(logits, stats, sequence)

    def _valid_prefix(self, hashes: BlockHashes, access: TieredAccess) -> int:
        """Blocks whose KV is in place: device hits and reloads, up to the first block the
        mover could not fill (a corrupt disk file, then dropped from the tier that indexed it)
        and no further than the device stored."""
        prefix = min(access.usable_blocks, access.cached_blocks)
        failed = self.mover.failed
        if failed:
            for i in range(prefix):
                if hashes[i] in failed:
                    self.mover.discard_unreadable(hashes[: i + 1])
                    return i
        return prefix

    def prefetch(self, token_ids: Sequence[int]) -> dict[Tier, int]:
        """Copies the lower-tier part of a prompt's cached prefix onto the device ahead of its
        request (``TieredCache.prefetch``); returns the blocks moved from each tier."""
        ids = np.asarray(list(token_ids), dtype=np.int64)
        moved = self.tiers.prefetch(hash_tokens(ids, self.block_tokens, self.seed))
        if self.mover.pending:  # write-through copies of the blocks just reloaded
            self.mover.flush()
        return moved

    def decode(self, sequence: ActiveSequence, token_id: int) -> torch.Tensor:
        """Appends one token and returns the logits [vocab] after it (its KV stays in the tail)."""
        out = self.model.forward([token_id], sequence.past)
        sequence.past.append(out.kv)
        sequence.token_ids.append(token_id)
        return out.logits[-1]

    def release(self, sequence: ActiveSequence) -> None:
        if not sequence.is_released:
            self.cache.unlock(sequence.handle)
            sequence.is_released = True

    def generate(
        self,
        token_ids: Sequence[int],
        max_new_tokens: int,
        *,
        eos_id: int | None = None,
    ) -> Generation:
        """Greedy decoding; stops after ``max_new_tokens`` or at ``eos_id`` (kept in the output)."""
        prefill = self.prefill(token_ids)
        sequence = prefill.sequence
        out: list[int] = []
        steps: list[torch.Tensor] = []
        logits = prefill.logits
        try:
            while len(out) < max_new_tokens:
                token = int(torch.argmax(logits))
                out.append(token)
                if token == eos_id or len(out) == max_new_tokens:
                    break
                logits = self.decode(sequence, token)
                steps.append(logits)
        finally:
            self.release(sequence)
        return Generation(out, prefill.stats, prefill.logits, steps)

    def stream(
        self,
        token_ids: Sequence[int],
        max_new_tokens: int,
        *,
        eos_id: int | None = None,
        on_prefill: Callable[[PrefillStats], None] = lambda stats: None,
    ) -> Generator[int, None, None]:
        """Greedy decoding one token at a time, for a server: ``on_prefill`` gets the prompt's
        reuse once it is computed, then each token is yielded as soon as it is chosen. Closing
        the generator early (a client went away) releases the sequence's blocks."""
        with torch.inference_mode():
            prefill = self.prefill(token_ids)
            sequence = prefill.sequence
            try:
                on_prefill(prefill.stats)
                logits = prefill.logits
                for n in range(1, max_new_tokens + 1):
                    token = int(torch.argmax(logits))
                    yield token
                    if token == eos_id or n == max_new_tokens:
                        return
                    logits = self.decode(sequence, token)
            finally:
                self.release(sequence)

    def evict_device(self, num_blocks: int) -> int:
        """Evicts unlocked device blocks (by the device policy); the tiers write them down."""
        return self.cache.evict(num_blocks)
