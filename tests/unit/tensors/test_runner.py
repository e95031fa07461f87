"""Paged prefill on kvtide's cache: every kind of reuse gives the logits of a full recompute.

Tolerance: float32 on the CPU, atol 1e-5 and rtol 1e-4 (the same sums blocked differently).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch")

from kvtide.core.hashing import BlockHashes  # noqa: E402
from kvtide.costs.cost_model import CostModel  # noqa: E402
from kvtide.costs.specs import GpuSpec, ModelSpec  # noqa: E402
from kvtide.tensors.model import LlamaModel  # noqa: E402
from kvtide.tensors.offload import CorruptBlockError, block_checksum  # noqa: E402
from kvtide.tensors.runner import PagedRunner  # noqa: E402
from kvtide.types import Tier  # noqa: E402

from .conftest import TINY, RunnerFactory  # noqa: E402

pytestmark = pytest.mark.torch

ATOL, RTOL = 1e-5, 1e-4
PROMPT = [(11 * i + 5) % 128 for i in range(22)]  # 5 full blocks of 4 tokens and 2 more


def full_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    return model.forward(ids).logits[-1]


def run(runner: PagedRunner, ids: list[int]) -> torch.Tensor:
    prefill = runner.prefill(ids)
    runner.release(prefill.sequence)
    return prefill.logits


def test_cold_prefill_stores_full_blocks_only(make_runner: RunnerFactory) -> None:
    runner = make_runner()
    prefill = runner.prefill(PROMPT)
    assert prefill.stats.computed_tokens == 22
    assert prefill.stats.stored_blocks == 5  # the 2-token tail is not cached
    assert runner.cache.num_cached_blocks == 5
    assert runner.cache.pool.num_used == 5
    assert torch.allclose(prefill.logits, full_logits(runner.model, PROMPT), atol=ATOL, rtol=RTOL)
    runner.release(prefill.sequence)


def test_prefix_reuse_equals_full_recompute(make_runner: RunnerFactory) -> None:
    runner = make_runner()
    run(runner, PROMPT)
    other = [*PROMPT[:13], 1, 2, 3, 4, 5, 6, 7]
    prefill = runner.prefill(other)
    assert prefill.stats.device_hit_tokens == 12
    assert prefill.stats.computed_tokens == 8
    assert prefill.stats.stored_blocks == 2
    assert torch.allclose(prefill.logits, full_logits(runner.model, other), atol=ATOL, rtol=RTOL)
    runner.release(prefill.sequence)
    assert runner.cache.num_cached_blocks == 7


def test_fully_cached_prompt_recomputes_its_last_block(make_runner: RunnerFactory) -> None:
    runner = make_runner()
    aligned = PROMPT[:20]
    run(runner, aligned)
    prefill = runner.prefill(aligned, all_logits=True)
    assert prefill.stats.device_hit_tokens == 16
    assert prefill.stats.computed_tokens == 4
    assert prefill.stats.stored_blocks == 0
    expected = runner.model.forward(aligned, all_logits=True).logits[16:]
    assert torch.allclose(prefill.logits, expected, atol=ATOL, rtol=RTOL)
    runner.release(prefill.sequence)


def held(runner: PagedRunner, tier: Tier) -> set[int]:
    """The blocks a lower tier's KVCache holds."""
    out: set[int] = set()
    cache = runner.tiers.caches[tier]
    stack = [cache.tree.root]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        out.update(BlockHashes(node.key).tolist())
    return out


def assert_bytes_follow_the_tiers(runner: PagedRunner) -> None:
    """Each lower tier's bytes are exactly the blocks its KVCache holds."""
    mover = runner.mover
    if mover.host is not None:
        assert set(mover.host._slot) == held(runner, Tier.HOST)
    if mover.disk is not None:
        assert set(mover.disk._blocks) == held(runner, Tier.DISK)
        files = {int(p.stem, 16) for p in mover.disk.directory.glob("*.kvb")}
        assert files == held(runner, Tier.DISK)


def test_host_offload_and_reload_equals_full_recompute(make_runner: RunnerFactory) -> None:
    runner = make_runner(host_blocks=16)
    first = runner.prefill(PROMPT)
    before = [block_checksum(runner.kv.block(b)) for b in first.sequence.past.block_ids]
    runner.release(first.sequence)
    assert runner.evict_device(100) == 5
    assert runner.cache.num_cached_blocks == 0
    assert runner.mover.num_written_blocks[Tier.HOST] == 5
    assert_bytes_follow_the_tiers(runner)

    again = runner.prefill(PROMPT)
    assert again.stats.host_reload_tokens == 20
    assert again.stats.device_hit_tokens == 0
    assert again.stats.computed_tokens == 2
    assert again.stats.stored_blocks == 0
    after = [block_checksum(runner.kv.block(b)) for b in again.sequence.past.block_ids]
    assert after == before  # the reloaded bytes are the offloaded bytes
    assert torch.allclose(again.logits, full_logits(runner.model, PROMPT), atol=ATOL, rtol=RTOL)
    runner.release(again.sequence)
    stats = runner.tiers.stats()
    assert stats.tiers[Tier.HOST].reloaded_tokens == 20  # the tiers counted what moved


def test_disk_offload_and_reload_equals_full_recompute(make_runner: RunnerFactory) -> None:
    runner = make_runner(disk_blocks=16)
    run(runner, PROMPT)
    runner.evict_device(100)
    disk = runner.mover.disk
    assert disk is not None and disk.num_blocks == 5
    logits = run(runner, PROMPT)
    assert runner.mover.num_reloaded_blocks[Tier.DISK] == 5
    assert disk.num_bytes_read == 5 * runner.kv.block_bytes
    assert torch.allclose(logits, full_logits(runner.model, PROMPT), atol=ATOL, rtol=RTOL)


def test_host_overflow_spills_to_disk_and_reloads_from_both(make_runner: RunnerFactory) -> None:
    # A 3-block host takes the first 3 of the 5 evicted blocks; the disk takes the rest
    # (with their ancestors, each tier being prefix-closed).
    runner = make_runner(host_blocks=3, disk_blocks=16)
    run(runner, PROMPT)
    runner.evict_device(100)
    assert runner.mover.host is not None and runner.mover.host.num_blocks == 3
    assert runner.mover.disk is not None and runner.mover.disk.num_blocks == 5
    assert_bytes_follow_the_tiers(runner)
    prefill = runner.prefill(PROMPT)
    assert prefill.stats.host_reload_tokens == 12
    assert prefill.stats.disk_reload_tokens == 8
    assert torch.allclose(prefill.logits, full_logits(runner.model, PROMPT), atol=ATOL, rtol=RTOL)
    runner.release(prefill.sequence)


def test_host_eviction_writes_down_to_disk_and_frees_its_bytes(
    make_runner: RunnerFactory,
) -> None:
    runner = make_runner(capacity_blocks=6, host_blocks=6, disk_blocks=32)
    prompts = [[(7 * k + 3 * i + 1) % 128 for i in range(22)] for k in range(4)]
    for ids in prompts:
        run(runner, ids)
        assert_bytes_follow_the_tiers(runner)
    assert runner.mover.num_written_blocks[Tier.DISK] > 0  # the host spilled
    assert runner.mover.host is not None and runner.mover.host.num_blocks <= 6
    for ids in prompts:  # each comes back from wherever the tiers put it
        prefill = runner.prefill(ids)
        assert prefill.stats.computed_tokens < 22
        assert torch.allclose(prefill.logits, full_logits(runner.model, ids), atol=ATOL, rtol=RTOL)
        runner.release(prefill.sequence)
        assert_bytes_follow_the_tiers(runner)


def test_seen_twice_admission_keeps_one_off_blocks_out_of_host_memory(
    make_runner: RunnerFactory,
) -> None:
    runner = make_runner(host_blocks=16, host_admission="seen-twice")
    run(runner, PROMPT)
    runner.evict_device(100)
    assert runner.mover.num_written_blocks[Tier.HOST] == 0  # seen once: not written
    prefill = runner.prefill(PROMPT)
    assert prefill.stats.computed_tokens == 22
    runner.release(prefill.sequence)
    runner.evict_device(100)  # seen twice now: written down
    assert runner.mover.num_written_blocks[Tier.HOST] == 5
    logits = run(runner, PROMPT)
    assert runner.mover.num_reloaded_blocks[Tier.HOST] == 5
    assert torch.allclose(logits, full_logits(runner.model, PROMPT), atol=ATOL, rtol=RTOL)


def test_write_through_copies_at_store_time(make_runner: RunnerFactory) -> None:
    runner = make_runner(host_blocks=16, write_mode="write-through")
    first = runner.prefill(PROMPT)
    # Written through when stored: the copies wait for the prefill to compute the KV...
    assert runner.mover.num_written_blocks[Tier.HOST] == 5
    assert runner.mover.host is not None
    for block_hash, block_id in zip(
        runner.cache.tree.hashes(first.sequence.handle).tolist(),
        first.sequence.past.block_ids,
        strict=True,
    ):
        copy = runner.mover.host.get(block_hash)
        assert copy is not None and torch.equal(copy, runner.kv.block(block_id))
    runner.release(first.sequence)
    runner.evict_device(100)  # ...and an eviction writes nothing more
    assert runner.mover.num_written_blocks[Tier.HOST] == 5
    logits = run(runner, PROMPT)
    assert runner.mover.num_reloaded_blocks[Tier.HOST] == 5
    assert torch.allclose(logits, full_logits(runner.model, PROMPT), atol=ATOL, rtol=RTOL)


def test_prefetch_brings_a_prefix_back_before_its_request(make_runner: RunnerFactory) -> None:
    runner = make_runner(host_blocks=16)
    run(runner, PROMPT)
    runner.evict_device(100)
    assert runner.prefetch(PROMPT) == {Tier.HOST: 5, Tier.DISK: 0}
    prefill = runner.prefill(PROMPT)
    assert prefill.stats.device_hit_tokens == 20
    assert torch.allclose(prefill.logits, full_logits(runner.model, PROMPT), atol=ATOL, rtol=RTOL)
    runner.release(prefill.sequence)


def test_split_reload_then_recompute_equals_full_recompute(make_runner: RunnerFactory) -> None:
    runner = make_runner(host_blocks=16, onboard=FixedOnboard(reload_tokens=8))
    run(runner, PROMPT)
    runner.evict_device(100)
    prefill = runner.prefill(PROMPT)
    assert prefill.stats.host_reload_tokens == 8
    assert prefill.stats.computed_tokens == 14
    assert prefill.stats.stored_blocks == 3
    assert torch.allclose(prefill.logits, full_logits(runner.model, PROMPT), atol=ATOL, rtol=RTOL)
    runner.release(prefill.sequence)
    assert runner.cache.num_cached_blocks == 5


def test_corrupt_disk_block_is_detected_and_recomputed(make_runner: RunnerFactory) -> None:
    runner = make_runner(disk_blocks=16)
    first = runner.prefill(PROMPT)
    hashes = runner.cache.tree.hashes(first.sequence.handle).tolist()
    runner.release(first.sequence)
    runner.evict_device(100)
    disk = runner.mover.disk
    assert disk is not None
    path = disk.path(hashes[2])
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptBlockError):
        disk.load(hashes[2])

    prefill = runner.prefill(PROMPT)
    assert runner.mover.num_corrupt_blocks == 1
    assert prefill.stats.disk_reload_tokens == 8  # blocks 0 and 1; 2 onwards recomputed
    assert prefill.stats.computed_tokens == 14
    assert hashes[2] not in disk and not path.exists()
    # The disk tier no longer indexes the corrupt block, nor the blocks below it.
    assert held(runner, Tier.DISK) == set(hashes[:2])
    assert_bytes_follow_the_tiers(runner)
    assert torch.allclose(prefill.logits, full_logits(runner.model, PROMPT), atol=ATOL, rtol=RTOL)
    runner.release(prefill.sequence)
    assert not runner.mover.failed  # the recomputed blocks now hold good KV
    again = runner.prefill(PROMPT)  # and a device hit on them is sound
    assert again.stats.device_hit_tokens == 20
    assert torch.allclose(again.logits, full_logits(runner.model, PROMPT), atol=ATOL, rtol=RTOL)
    runner.release(again.sequence)


def test_eviction_under_pressure_offloads_before_reuse(make_runner: RunnerFactory) -> None:
    runner = make_runner(capacity_blocks=6, host_blocks=16)
    run(runner, PROMPT)  # 5 blocks
    other = [(3 * i + 1) % 128 for i in range(22)]
    run(runner, other)  # needs 5 more: 4 of PROMPT's blocks are evicted into the host,
    # with their ancestor block 0 (still on the device), since each tier is prefix-closed
    assert runner.mover.num_written_blocks[Tier.HOST] == 5
    prefill = runner.prefill(PROMPT)
    assert prefill.stats.device_hit_tokens == 4
    assert prefill.stats.host_reload_tokens == 16
    assert torch.allclose(prefill.logits, full_logits(runner.model, PROMPT), atol=ATOL, rtol=RTOL)
    runner.release(prefill.sequence)
    assert_bytes_follow_the_tiers(runner)


def test_greedy_generation_is_the_same_with_and_without_cache(make_runner: RunnerFactory) -> None:
    cold = make_runner().generate(PROMPT, 8)
    runner = make_runner(host_blocks=16)
    run(runner, PROMPT[:17])
    warm = runner.generate(PROMPT, 8)
    assert warm.prefill.device_hit_tokens == 16
    assert warm.token_ids == cold.token_ids
    for a, b in zip(warm.step_logits, cold.step_logits, strict=True):
        assert torch.allclose(a, b, atol=ATOL, rtol=RTOL)
    assert runner.cache.tree.root.lock_ref == 1  # generate released its lock


@dataclass(frozen=True)
class FixedPlan:
    reload_tokens: int
    action: str = "split"
    time_s: float = 0.0
    recompute_s: float = 0.0


@dataclass
class FixedOnboard:
    """An OnboardCost that always answers the same plan, and records what it was asked."""

    reload_tokens: int
    asked: list[tuple[int, Tier, int]] = field(default_factory=list)

    def kv_bytes(self, tokens: int) -> int:
        return tokens

    def prefill_time(self, new_tokens: int, cached_tokens: int = 0) -> float:
        return 0.0

    def link_bytes_per_s(
        self, tier: Tier, link_load: float = 0.0, *, to_device: bool = True
    ) -> float:
        return 1.0

    def decide_onboard(
        self,
        cached_tokens_in_tier: int,
        tier: Tier,
        new_tokens: int = 0,
        link_load: float = 0.0,
        *,
        block_tokens: int = 1,
        with_break_even: bool = True,
    ) -> FixedPlan:
        self.asked.append((cached_tokens_in_tier, tier, new_tokens))
        return FixedPlan(self.reload_tokens)


def test_the_cost_model_decides_each_tier_in_turn(make_runner: RunnerFactory) -> None:
    onboard = FixedOnboard(reload_tokens=100)
    runner = make_runner(host_blocks=3, disk_blocks=16, onboard=onboard)
    run(runner, PROMPT)
    runner.evict_device(100)  # blocks 0-2 on the host (and disk), 3-4 on disk only
    prefill = runner.prefill(PROMPT)
    assert onboard.asked == [(12, Tier.HOST, 10), (8, Tier.DISK, 2)]
    assert prefill.stats.host_reload_tokens == 12
    assert prefill.stats.disk_reload_tokens == 8
    assert torch.allclose(prefill.logits, full_logits(runner.model, PROMPT), atol=ATOL, rtol=RTOL)
    runner.release(prefill.sequence)


def tiny_cost(flops_per_s: float, link_bytes_per_s: float) -> CostModel:
    spec = ModelSpec.from_hf_config(
        {
            "model_type": "llama",
            "num_hidden_layers": TINY.num_layers,
            "hidden_size": TINY.hidden_size,
            "num_attention_heads": TINY.num_heads,
            "num_key_value_heads": TINY.num_kv_heads,
            "intermediate_size": TINY.intermediate_size,
            "vocab_size": TINY.vocab_size,
            "tie_word_embeddings": True,
        },
        name="tiny",
    )
    gpu = GpuSpec("test", flops_per_s, 1e11, link_bytes_per_s, link_bytes_per_s, 1e9, 1e9)
    return CostModel(spec, gpu)


@pytest.mark.parametrize(
    ("flops_per_s", "link_bytes_per_s", "reloaded"),
    [
        (1e9, 1e10, 20),  # slow compute, fast link: reload the whole run
        (1e15, 1e10, 0),  # the tiny model recomputes faster than a copy's fixed costs
        (1e9, 1e3, 0),  # a link too slow for anything
    ],
)
def test_a_real_cost_model_decides_reload_or_recompute(
    make_runner: RunnerFactory, flops_per_s: float, link_bytes_per_s: float, reloaded: int
) -> None:
    runner = make_runner(host_blocks=16, onboard=tiny_cost(flops_per_s, link_bytes_per_s))
    run(runner, PROMPT)
    runner.evict_device(100)
    prefill = runner.prefill(PROMPT)
    assert prefill.stats.host_reload_tokens == reloaded
    assert torch.allclose(prefill.logits, full_logits(runner.model, PROMPT), atol=ATOL, rtol=RTOL)
    runner.release(prefill.sequence)
