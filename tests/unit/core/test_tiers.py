"""TieredCache stories: demotion, admission, promotion, decisions, accounting, links, events."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvtide.clock import ManualClock
from kvtide.core.events import BlockRemoved, BlockStored
from kvtide.core.hashing import BlockHashes, hash_block_ids
from kvtide.core.tiers import (
    OnboardPlan,
    TieredCache,
    TieredCacheConfig,
    TierMove,
    TierSpec,
    WriteMode,
)
from kvtide.costs.cost_model import Coefficients, CostModel
from kvtide.costs.specs import gpu_preset, model_preset
from kvtide.errors import ConfigError
from kvtide.types import Tier

BT = 16  # tokens per block in these stories


def chain(*ids: int) -> BlockHashes:
    return hash_block_ids(list(ids), seed=11)


def prompt(hashes: BlockHashes) -> int:
    return len(hashes) * BT


def cached(cache: TieredCache, tier: Tier, hashes: BlockHashes) -> int:
    """Blocks of ``hashes`` the tier holds as a prefix (without touching it)."""
    return cache.caches[tier].tree.match(hashes, touch=False)[1]


def make(
    device: int,
    host: int | None = None,
    disk: int | None = None,
    *,
    clock: ManualClock | None = None,
    cost: LinearCost | None = None,
    admission: str = "none",
    disk_admission: str | None = None,
    **options: object,
) -> TieredCache:
    config = TieredCacheConfig(
        TierSpec(device),
        TierSpec(host, admission=admission) if host else None,
        TierSpec(disk, admission=disk_admission or admission) if disk else None,
        block_tokens=BT,
        **options,  # type: ignore[arg-type]
    )
    return TieredCache(config, clock or ManualClock(), cost)


@dataclass(frozen=True, slots=True)
class Plan:
    action: str
    reload_tokens: int
    time_s: float
    recompute_s: float


class LinearCost:
    """A cost model small enough to check by hand: prefill at ``tokens_per_s``, one byte of KV
    per token, links at fixed rates; reload or recompute, whichever is faster (no split)."""

    def __init__(self, tokens_per_s: float, host_bytes_per_s: float, disk_bytes_per_s: float):
        self.tokens_per_s = tokens_per_s
        self.rates = {Tier.HOST: host_bytes_per_s, Tier.DISK: disk_bytes_per_s}
        self.loads: list[float] = []

    def kv_bytes(self, tokens: int) -> int:
        return tokens

    def prefill_time(self, new_tokens: int, cached_tokens: int = 0) -> float:
        return new_tokens / self.tokens_per_s

    def link_bytes_per_s(
        self, tier: Tier, link_load: float = 0.0, *, to_device: bool = True
    ) -> float:
        return self.rates[tier] * (1.0 - link_load)

    def decide_onboard(
        self,
        cached_tokens_in_tier: int,
        tier: Tier,
        new_tokens: int = 0,
        link_load: float = 0.0,
        *,
        block_tokens: int = 1,
        with_break_even: bool = True,
    ) -> OnboardPlan:
        self.loads.append(link_load)
        compute_new = self.prefill_time(new_tokens)
        reload_s = self.kv_bytes(cached_tokens_in_tier) / self.link_bytes_per_s(tier, link_load)
        reload_s = max(reload_s, compute_new)  # the load overlaps the new tokens' prefill
        recompute_s = self.prefill_time(cached_tokens_in_tier + new_tokens)
        if reload_s < recompute_s:
            return Plan("reload", cached_tokens_in_tier, reload_s, recompute_s)
        return Plan("recompute", 0, recompute_s, recompute_s)


A, B, C = chain(1, 2), chain(3, 4), chain(5, 6)


# --- demotion, lookup, promotion -------------------------------------------------------------


def test_device_eviction_writes_blocks_down_to_host() -> None:
    cache = make(2, 8)
    cache.access(A, prompt(A))
    cache.access(B, prompt(B))  # evicts A's two blocks from the device
    assert cached(cache, Tier.DEVICE, A) == 0
    assert cached(cache, Tier.HOST, A) == 2
    stats = cache.stats()
    assert stats.written_blocks(Tier.HOST) == 2
    assert stats.tiers[Tier.DEVICE].dropped_blocks == 0


def test_a_host_hit_is_reloaded_onto_the_device_and_stays_in_host() -> None:
    cache = make(2, 8)
    cache.access(A, prompt(A))
    cache.access(B, prompt(B))
    acc = cache.access(A, prompt(A))
    assert (acc.device_blocks, acc.host_blocks, acc.disk_blocks) == (0, 2, 0)
    assert acc.reload_blocks == {Tier.HOST: 2, Tier.DISK: 0}
    assert acc.hit_blocks == acc.usable_blocks == 2
    assert cached(cache, Tier.DEVICE, A) == 2  # promoted
    assert cached(cache, Tier.HOST, A) == 2  # copy semantics: the host keeps it
    assert cached(cache, Tier.HOST, B) == 2  # B was demoted to make room
    # A is evicted again later: the host already holds it, so nothing is written.
    cache.access(C, prompt(C))
    assert cache.stats().written_blocks(Tier.HOST) == 4  # A once, B once


def test_a_prefix_continues_from_device_into_host() -> None:
    cache = make(3, 8)
    full = chain(1, 2, 3, 4)
    cache.access(full[:3], 3 * BT)
    side = chain(1, 9, 10)
    cache.access(side, 3 * BT)  # evicts blocks 3 and 2 (the stale tail); host gets 1, 2, 3
    assert cached(cache, Tier.DEVICE, full) == 1
    assert cached(cache, Tier.HOST, full) == 3
    acc = cache.access(full, 4 * BT + 5)
    assert (acc.device_blocks, acc.host_blocks, acc.disk_blocks) == (1, 2, 0)
    stats = cache.stats()
    assert stats.tiers[Tier.DEVICE].hit_tokens == 1 * BT + 1 * BT  # side's block 1, then full's
    assert stats.tiers[Tier.HOST].hit_tokens == 2 * BT
    assert stats.prompt_tokens == 3 * BT + 3 * BT + 4 * BT + 5


def test_host_evictions_cascade_to_disk_and_disk_hits_reload() -> None:
    cache = make(2, 2, 8)
    cache.access(A, prompt(A))
    cache.access(B, prompt(B))  # A -> host
    cache.access(C, prompt(C))  # B -> host, A -> disk
    assert cached(cache, Tier.HOST, A) == 0
    assert cached(cache, Tier.DISK, A) == 2
    assert cache.stats().written_blocks(Tier.DISK) == 2
    acc = cache.access(A, prompt(A))  # C -> host, B -> disk
    assert (acc.device_blocks, acc.host_blocks, acc.disk_blocks) == (0, 0, 2)
    assert acc.reload_blocks[Tier.DISK] == 2
    stats = cache.stats()
    assert stats.written_blocks(Tier.DISK) == 4
    assert stats.tiers[Tier.DISK].dropped_blocks == 0
    assert stats.hit_ratio_by_tier == {"device": 0.0, "host": 0.0, "disk": 2 * BT / (8 * BT)}


def test_without_a_lower_tier_evicted_blocks_are_dropped() -> None:
    cache = make(2)
    cache.access(A, prompt(A))
    cache.access(B, prompt(B))
    assert cache.stats().tiers[Tier.DEVICE].dropped_blocks == 2
    with pytest.raises(ConfigError):
        TieredCache(TieredCacheConfig(TierSpec(0)), ManualClock())
    with pytest.raises(ValueError, match="at least 32 prompt tokens"):
        make(2).access(A, 31)
    with pytest.raises(ConfigError, match="no admission filter"):
        TieredCache(TieredCacheConfig(TierSpec(2, admission="seen-twice")), ManualClock())


def test_blocks_the_host_refuses_go_around_it_to_disk() -> None:
    cache = make(2, 8, 8, admission="seen-twice", disk_admission="none")
    cache.access(A, prompt(A))
    cache.access(B, prompt(B))  # A seen once: the host refuses it, the disk takes it
    assert cached(cache, Tier.HOST, A) == 0
    assert cached(cache, Tier.DISK, A) == 2
    stats = cache.stats()
    assert (stats.written_blocks(Tier.HOST), stats.written_blocks(Tier.DISK)) == (0, 2)
    assert stats.tiers[Tier.DEVICE].dropped_blocks == 0
    acc = cache.access(A, prompt(A))  # a disk hit; A now seen twice
    assert acc.disk_blocks == 2
    cache.access(C, prompt(C))  # evicts B (to disk) and A (to the host)
    assert cached(cache, Tier.HOST, A) == 2
    assert cached(cache, Tier.HOST, B) == 0 and cached(cache, Tier.DISK, B) == 2


def test_a_disk_that_wants_two_hits_keeps_one_off_blocks_out() -> None:
    cache = make(2, 2, 8, disk_admission="seen-twice")
    for h in (A, B, C):
        cache.access(h, prompt(h))  # A: device -> host -> dropped (seen once)
    assert cached(cache, Tier.DISK, A) == 0
    assert cache.stats().tiers[Tier.HOST].dropped_blocks == 2


# --- admission and write modes ---------------------------------------------------------------


def test_seen_twice_drops_first_sight_blocks_and_writes_reused_ones() -> None:
    cache = make(2, 8, admission="seen-twice")
    cache.access(A, prompt(A))
    cache.access(B, prompt(B))  # A seen once: dropped, not written
    assert cached(cache, Tier.HOST, A) == 0
    assert cache.stats().tiers[Tier.DEVICE].dropped_blocks == 2
    acc = cache.access(A, prompt(A))  # a miss everywhere; A now seen twice
    assert acc.hit_blocks == 0
    cache.access(C, prompt(C))  # evicts B (seen once: dropped) and A (seen twice: written)
    assert cached(cache, Tier.HOST, A) == 2
    assert cached(cache, Tier.HOST, B) == 0
    stats = cache.stats()
    assert stats.written_blocks(Tier.HOST) == 2
    assert stats.tiers[Tier.DEVICE].dropped_blocks == 4


def test_admission_writes_up_to_the_last_admitted_block_with_its_ancestors() -> None:
    cache = make(3, 8, admission="seen-twice")
    abc = chain(1, 2, 3)
    cache.access(abc[:2], 2 * BT)
    cache.access(abc, 3 * BT)  # blocks 1, 2 seen twice, block 3 once
    cache.access(C, prompt(C))  # evicts 3 (dropped), then 2 (written, with ancestor 1)
    assert cached(cache, Tier.HOST, abc) == 2
    assert cache.stats().written_blocks(Tier.HOST) == 2


def test_write_through_writes_on_store_and_skips_the_write_on_eviction() -> None:
    cache = make(2, 8, write_mode=WriteMode.WRITE_THROUGH)
    cache.access(A, prompt(A))
    assert cached(cache, Tier.HOST, A) == 2  # written as soon as stored
    cache.access(B, prompt(B))
    assert cache.stats().written_blocks(Tier.HOST) == 4  # A and B once each
    acc = cache.access(A, prompt(A))
    assert acc.host_blocks == 2


def test_write_through_with_admission_waits_for_the_second_sight() -> None:
    cache = make(4, 8, write_mode=WriteMode.WRITE_THROUGH, admission="seen-twice")
    cache.access(A, prompt(A))
    assert cached(cache, Tier.HOST, A) == 0
    cache.access(chain(1, 2, 7), 3 * BT)  # A's blocks hit, now seen twice: backed up
    assert cached(cache, Tier.HOST, A) == 2
    assert cached(cache, Tier.HOST, chain(1, 2, 7)) == 2  # block 7 seen once: not yet
    assert cache.stats().written_blocks(Tier.HOST) == 2


# --- decisions, links, savings ---------------------------------------------------------------


def test_a_fast_link_reloads_and_counts_the_seconds_saved() -> None:
    cost = LinearCost(tokens_per_s=32.0, host_bytes_per_s=64.0, disk_bytes_per_s=1.0)
    cache = make(2, 8, cost=cost)
    cache.access(A, prompt(A))
    cache.access(B, prompt(B))
    acc = cache.access(A, prompt(A) + 8)
    # Recompute 40 tokens: 1.25 s. Reload 32 bytes at 64 B/s: 0.5 s, hiding the 8 new tokens.
    assert acc.reload_blocks[Tier.HOST] == 2
    assert acc.onboard_s == 0.5
    assert acc.prefill_s_saved == 0.75
    stats = cache.stats()
    assert stats.tiers[Tier.HOST].reloaded_tokens == 32
    assert stats.tiers[Tier.HOST].prefill_s_saved == 0.75
    assert stats.reloaded_ratio == stats.hit_ratio == 32 / (32 + 32 + 40)


def test_a_slow_link_makes_recompute_win_and_the_hit_is_still_counted() -> None:
    cost = LinearCost(tokens_per_s=32.0, host_bytes_per_s=8.0, disk_bytes_per_s=1.0)
    cache = make(2, 8, cost=cost)
    cache.access(A, prompt(A))
    cache.access(B, prompt(B))
    acc = cache.access(A, prompt(A))
    assert acc.host_blocks == 2  # found in host...
    assert acc.reload_blocks[Tier.HOST] == 0  # ...but recomputed: 4 s to load vs 1 s
    assert acc.usable_blocks == 0
    assert acc.onboard_s == 1.0 and acc.prefill_s_saved == 0.0
    stats = cache.stats()
    assert stats.tiers[Tier.HOST].hit_tokens == 32
    assert stats.tiers[Tier.HOST].reloaded_tokens == 0
    assert stats.reloaded_ratio == 0.0
    assert cache.links[Tier.HOST].num_transfers_total == 0
    assert cached(cache, Tier.DEVICE, A) == 2  # recomputed blocks are stored on the device


def test_a_transfer_in_flight_halves_the_rate_and_flips_the_decision() -> None:
    clock = ManualClock()
    cost = LinearCost(tokens_per_s=32.0, host_bytes_per_s=48.0, disk_bytes_per_s=1.0)
    cache = make(4, 16, clock=clock, cost=cost)
    for h in (A, B, C):
        cache.access(h, prompt(h))  # A -> host
    first = cache.access(A, prompt(A))  # 32 B at 48 B/s: 0.67 s < 1 s: reload
    assert first.reload_blocks[Tier.HOST] == 2
    assert cache.links[Tier.HOST].num_active == 1
    cache.access(chain(8, 9), 2 * BT)
    cache.access(chain(10, 11), 2 * BT)  # B leaves the device for the host
    second = cache.access(B, prompt(B))  # link shared: 32 B at 24 B/s: 1.33 s > 1 s
    assert cost.loads[-1] == 0.5
    assert second.host_blocks == 2 and second.reload_blocks[Tier.HOST] == 0
    clock.advance(1.0)  # the first reload finished at 2/3 s
    assert cache.links[Tier.HOST].num_active == 0


@pytest.mark.parametrize(
    ("host_rate", "expected"),
    [(8.0, {Tier.HOST: 0, Tier.DISK: 0}), (1e6, {Tier.HOST: 1, Tier.DISK: 1})],
)
def test_a_disk_part_is_used_only_after_the_host_part_was_reloaded(
    host_rate: float, expected: dict[Tier, int]
) -> None:
    cost = LinearCost(tokens_per_s=32.0, host_bytes_per_s=host_rate, disk_bytes_per_s=1e6)
    cache = make(4, 4, 8, cost=cost)
    abc = chain(1, 2, 3)
    cache.caches[Tier.DISK].insert(abc)
    cache.caches[Tier.HOST].insert(abc[:2])
    cache.caches[Tier.DEVICE].insert(abc[:1])
    acc = cache.access(abc, 3 * BT + 4)
    assert (acc.device_blocks, acc.host_blocks, acc.disk_blocks) == (1, 1, 1)
    assert acc.reload_blocks == expected


# --- prefetch, locks, events, moves ----------------------------------------------------------


def test_prefetch_moves_a_prefix_up_before_its_request() -> None:
    cost = LinearCost(tokens_per_s=32.0, host_bytes_per_s=64.0, disk_bytes_per_s=1.0)
    cache = make(2, 8, cost=cost, record_moves=True)
    cache.access(A, prompt(A))
    cache.access(B, prompt(B))
    cache.take_moves()
    assert cache.prefetch(A) == {Tier.HOST: 2, Tier.DISK: 0}
    assert cache.take_moves() == [
        TierMove(tuple(B.tolist()), Tier.DEVICE, Tier.HOST),  # frees the slots A fills
        TierMove(tuple(A.tolist()), Tier.HOST, Tier.DEVICE),
    ]
    assert cache.prefetch(A) == {Tier.HOST: 0, Tier.DISK: 0}  # already there
    acc = cache.access(A, prompt(A))
    assert acc.device_blocks == 2 and acc.host_blocks == 0
    assert cache.stats().tiers[Tier.HOST].prefetched_blocks == 2
    assert cache.links[Tier.HOST].bytes_total == 32


def test_a_locked_request_keeps_its_device_blocks() -> None:
    cache = make(2, 8)
    acc = cache.access(A, prompt(A), lock=True)
    other = cache.access(B, prompt(B))
    assert other.new_blocks == 0  # nothing evictable: B is not stored
    assert cached(cache, Tier.DEVICE, A) == 2
    cache.unlock(acc.handle)
    cache.access(B, prompt(B))
    assert cached(cache, Tier.DEVICE, B) == 2


def test_events_say_which_tier_holds_the_blocks() -> None:
    cache = make(2, 8, record_events=True)
    cache.access(A, prompt(A))
    cache.access(B, prompt(B))
    events = cache.take_events()
    stored = [(e.tier, e.block_hashes) for e in events if isinstance(e, BlockStored)]
    removed = [(e.tier, e.block_hashes) for e in events if isinstance(e, BlockRemoved)]
    assert (Tier.DEVICE, tuple(A.tolist())) in stored
    assert (Tier.HOST, tuple(A.tolist())) in stored
    assert (Tier.DEVICE, tuple(A.tolist())) in removed
    assert all(tier is not Tier.HOST for tier, _ in removed)
    assert cache.take_events() == []


def test_moves_record_demotions_and_reloads() -> None:
    cache = make(2, 8, record_moves=True)
    cache.access(A, prompt(A))
    cache.access(B, prompt(B))
    cache.access(A, prompt(A))
    assert cache.take_moves() == [
        TierMove(tuple(A.tolist()), Tier.DEVICE, Tier.HOST),
        TierMove(tuple(B.tolist()), Tier.DEVICE, Tier.HOST),  # frees the slots A fills
        TierMove(tuple(A.tolist()), Tier.HOST, Tier.DEVICE),
    ]


# --- with kvtide's cost model ----------------------------------------------------------------


def real_cost(host_link_efficiency: float) -> CostModel:
    coefficients = Coefficients(host_link_efficiency=host_link_efficiency)
    return CostModel(model_preset("llama-3-8b"), gpu_preset("h100"), coefficients=coefficients)


@pytest.mark.parametrize(("efficiency", "action"), [(0.8, "split"), (1e-4, "recompute")])
def test_the_cost_model_decides_and_a_slow_host_link_means_recompute(
    efficiency: float, action: str
) -> None:
    cost = real_cost(efficiency)
    config = TieredCacheConfig(TierSpec(64), TierSpec(256), block_tokens=BT)
    cache = TieredCache(config, ManualClock(), cost)
    long_a, long_b = chain(*range(64)), chain(*range(100, 164))
    cache.access(long_a, 1024)
    cache.access(long_b, 1024)
    acc = cache.access(long_a, 1024 + 7)
    assert acc.host_blocks == 64
    decision = cost.decide_onboard(1024, Tier.HOST, 7, block_tokens=BT, with_break_even=False)
    assert decision.action == action
    reloaded = decision.reload_tokens  # at 0.8: 848 reloaded while 176 + 7 are computed
    assert acc.reload_blocks[Tier.HOST] * BT == reloaded
    assert acc.onboard_s == decision.time_s
    assert acc.prefill_s_saved == pytest.approx(decision.recompute_s - decision.time_s)
    assert (acc.prefill_s_saved > 0) == (reloaded > 0)
    link = cache.links[Tier.HOST]
    assert link.bytes_per_s == cost.link_bytes_per_s(Tier.HOST)
    assert link.bytes_total == cost.kv_bytes(reloaded)


def test_no_move_is_recorded_for_blocks_a_full_device_cannot_store() -> None:
    cache = make(2, 8, record_moves=True)
    cache.access(A, prompt(A))
    locked = cache.access(B, prompt(B), lock=True)  # A -> host; B holds the whole device
    cache.take_moves()
    acc = cache.access(A, prompt(A))
    assert acc.host_blocks == 2 and acc.reload_blocks[Tier.HOST] == 2  # loaded for this run
    assert acc.new_blocks == 0
    assert cache.take_moves() == []  # but not kept on the device
    cache.unlock(locked.handle)
