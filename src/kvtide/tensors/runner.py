"""Runs a llama model on a paged KV cache managed by kvtide's core KVCache.

A prompt's full blocks are hashed with the core's chained hashes. ``prefill`` reuses the device
blocks the cache matches, reloads the blocks that follow from the host or disk tier (all of
them, the first ``max_reload_blocks``, or as many as the cost model's reload / recompute /
split decision says when the runner has one), computes the rest, and stores the new full
blocks in pool blocks the cache allocates. The partial last block is always recomputed, never
cached; a fully cached prompt still recomputes its last block so that there is a token to take
logits from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from kvtide.core.cache import KVCache
from kvtide.core.hashing import BlockHashes, Namespace, hash_tokens
from kvtide.core.node import Node
from kvtide.core.tiers import OnboardCost
from kvtide.tensors.model import LlamaModel
from kvtide.tensors.offload import DiskStore, HostStore, Offloader
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
    """One model, one paged KV tensor sized to the cache's pool, optional host and disk tiers."""

    def __init__(
        self,
        model: LlamaModel,
        cache: KVCache,
        namespace: Namespace,
        *,
        host: HostStore | None = None,
        disk: DiskStore | None = None,
        disk_write_through: bool = False,
        onboard: OnboardCost | None = None,
    ) -> None:
        self.model = model
        self.onboard = onboard
        self.cache = cache
        self.block_tokens = cache.config.block_tokens
        self.kv = PagedKV(model.config, cache.pool.num_blocks, self.block_tokens, model.device)
        self.offloader = Offloader(self.kv, host, disk, disk_write_through=disk_write_through)
        cache.add_observer(self.offloader)
        self.seed = namespace.seed

    def prefill(
        self,
        token_ids: Sequence[int],
        *,
        max_reload_blocks: int | None = None,
        all_logits: bool = False,
    ) -> Prefill:
        """Computes a prompt on top of whatever prefix the tiers hold. The caller owns the
        returned sequence's lock and must ``release`` it (``generate`` does)."""
        ids = list(token_ids)
        if not ids:
            raise ValueError("prefill needs at least one token")
        bt = self.block_tokens
        cache = self.cache
        hashes = hash_tokens(np.asarray(ids, dtype=np.int64), bt, self.seed)
        usable = min(len(hashes), (len(ids) - 1) // bt)
        match = cache.match(hashes[:usable])
        handle = match.handle
        cache.lock(handle)
        device_blocks = match.num_blocks

        limit = usable - device_blocks
        if max_reload_blocks is not None:
            limit = min(limit, max(max_reload_blocks, 0))
        elif self.onboard is not None:
            limit = min(limit, self._decide_reload_blocks(hashes, device_blocks, usable, len(ids)))
        plan = self.offloader.plan_reload(hashes[device_blocks : device_blocks + limit])
        prefix_ids = match.block_ids
        if plan:
            access = cache.insert(hashes[: device_blocks + len(plan)], match=match)
            cache.lock(access.handle)
            cache.unlock(handle)
            handle = access.handle
            prefix_ids = access.block_ids
            fitted = len(prefix_ids) - device_blocks
            self.offloader.write_reload(plan[:fitted], prefix_ids[device_blocks:])
            self.offloader.cancel_reload(plan[fitted:])
            plan = plan[:fitted]
        reloaded = {tier: sum(r.tier == tier for r in plan) * bt for tier in (Tier.HOST, Tier.DISK)}

        past = PagedPast(self.kv, prefix_ids)
        start = past.num_tokens
        out = self.model.forward(ids[start:], past, all_logits=all_logits)

        stored = cache.insert(hashes)
        cache.lock(stored.handle)
        cache.unlock(handle)
        all_ids = stored.block_ids
        first_new = len(all_ids) - stored.new_blocks
        for j in range(first_new, len(all_ids)):
            offset = j * bt - start
            self.kv.write(all_ids[j], out.kv[:, :, :, offset : offset + bt])
        tail_from = len(all_ids) * bt - start
        tail = out.kv[:, :, :, tail_from:] if tail_from < out.kv.shape[3] else None
        sequence = ActiveSequence(ids, PagedPast(self.kv, all_ids, tail), stored.handle)
        stats = PrefillStats(
            prompt_tokens=len(ids),
            device_hit_tokens=device_blocks * bt,
            host_reload_tokens=reloaded[Tier.HOST],
            disk_reload_tokens=reloaded[Tier.DISK],
            computed_tokens=len(ids) - start,
            stored_blocks=stored.new_blocks,
        )
        logits = out.logits if all_logits else out.logits[-1]
        return Prefill(logits, stats, sequence)

    def _decide_reload_blocks(
        self, hashes: BlockHashes, device_blocks: int, usable: int, prompt_tokens: int
    ) -> int:
        """Blocks to reload by the cost model: reload, recompute or split. A run spanning host
        and disk is costed as if all on its slowest tier."""
        assert self.onboard is not None
        run = self.offloader.lower_run(hashes[device_blocks:usable])
        if not run:
            return 0
        bt = self.block_tokens
        in_tier = len(run) * bt
        new_tokens = prompt_tokens - device_blocks * bt - in_tier
        decision = self.onboard.decide_onboard(
            in_tier, max(run), new_tokens, block_tokens=bt, with_break_even=False
        )
        return decision.reload_tokens // bt

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
        max_reload_blocks: int | None = None,
    ) -> Generation:
        """Greedy decoding; stops after ``max_new_tokens`` or at ``eos_id`` (kept in the output)."""
        prefill = self.prefill(token_ids, max_reload_blocks=max_reload_blocks)
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

    def evict_device(self, num_blocks: int) -> int:
        """Evicts unlocked device blocks (by the cache's policy); they go down a tier."""
        return self.cache.evict(num_blocks)
