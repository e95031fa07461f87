"""Onboarding decisions: Mooncake's published break-evens and a decision-quality grid."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from kvtide.costs.cost_model import Coefficients, CostModel
from kvtide.costs.onboard import (
    OnboardAction,
    break_even_bytes_per_s,
    break_even_prefix_tokens,
    decide_onboard,
    mooncake_break_even_bytes_per_s,
    mooncake_break_even_for,
)
from kvtide.costs.specs import GpuSpec, gpu_preset, model_preset
from kvtide.errors import ConfigError
from kvtide.types import Tier

LLAMA_70B = model_preset("llama-3-70b")

# FAST'25 §2.2: reusing an 8k prefix of Llama-3-70B pays from about 6 GB/s on 8×A800 and about
# 19 GB/s on 8×H800. The closed form gives 5.86 and 18.58; the paper rounds them.
MOONCAKE_GB_S = {"a800": 6.0, "h800": 19.0}
# Stated tolerance: the formula itself within 5% of the paper's rounded numbers, and our model
# (exact causal attention FLOPs, 25.5·d² matmul FLOPs per layer and token where the paper
# rounds to 22·d²) within 10% of them at full efficiency.
FORMULA_TOLERANCE = 0.05
MODEL_TOLERANCE = 0.10


@pytest.mark.parametrize("gpu", ["a800", "h800"])
def test_mooncake_formula_reproduces_the_paper(gpu: str) -> None:
    bandwidth = mooncake_break_even_for(LLAMA_70B, gpu_preset(gpu), 8, 8192)
    assert bandwidth / 1e9 == pytest.approx(MOONCAKE_GB_S[gpu], rel=FORMULA_TOLERANCE)


def test_mooncake_formula_by_hand() -> None:
    # G · 2·d·s / (gqa · (a·p·d + b·d²)) with d = p = 8192, gqa = 8, s = 2, G = 8 · 312 TFLOP/s.
    expected = 8 * 312e12 * 2 * 8192 * 2 / (8 * (4 * 8192 * 8192 + 22 * 8192 * 8192))
    assert mooncake_break_even_bytes_per_s(8192, 8192, 8, 8 * 312e12) == pytest.approx(expected)
    assert expected == pytest.approx(5.859e9, rel=1e-3)


@pytest.mark.parametrize("gpu", ["a800", "h800"])
def test_our_break_even_matches_mooncake_at_full_efficiency(gpu: str) -> None:
    ideal = Coefficients(
        prefill_efficiency=1.0,
        iteration_overhead_s=0.0,
        host_transfer_overhead_s=0.0,
        host_chunk_latency_s=0.0,
    )
    cost = CostModel(LLAMA_70B, gpu_preset(gpu), tp=8, coefficients=ideal)
    bandwidth = break_even_bytes_per_s(cost, 8192, Tier.HOST, new=0)
    assert bandwidth is not None
    assert bandwidth / 1e9 == pytest.approx(MOONCAKE_GB_S[gpu], rel=MODEL_TOLERANCE)


def test_mooncake_formula_needs_gqa() -> None:
    with pytest.raises(ConfigError, match="assumes GQA"):
        mooncake_break_even_for(model_preset("deepseek-v3"), gpu_preset("h800"), 8, 8192)


def with_host_rate(gpu: GpuSpec, bytes_per_s: float) -> GpuSpec:
    return dataclasses.replace(
        gpu, host_to_device_bytes_per_s=bytes_per_s, nvme_bytes_per_s=bytes_per_s / 4
    )


TIERS = (Tier.HOST, Tier.DISK)
HOST_RATES = (1e9, 4e9, 16e9, 63e9)
PREFIXES = (16, 300, 2048, 12000)
LOADS = (0.0, 0.5, 0.9)
NEW_TOKENS = (1, 500)


def grid() -> list[tuple[CostModel, Tier, int, float, int]]:
    base = gpu_preset("h100")
    models = [
        CostModel(model_preset("llama-3-8b"), with_host_rate(base, rate)) for rate in HOST_RATES
    ]
    return list(itertools.product(models, TIERS, PREFIXES, LOADS, NEW_TOKENS))


def ground_truth_best(cost: CostModel, tier: Tier, cached: int, load: float, new: int) -> float:
    """The least onboard time over every split point 0..cached (sampled when long)."""
    step = max(1, cached // 1500)
    points = set(range(0, cached + 1, step)) | {cached}
    return min(cost.onboard_time(cached, k, new, tier, load) for k in points)


def test_decisions_pick_the_faster_option_on_the_grid() -> None:
    # Tier × host bandwidth × prefix × link load × new tokens: 192 cases. The decision must pick
    # the fastest plan by the model's own times at least 95% of the time (the bar).
    cases = grid()
    correct = 0
    for cost, tier, cached, load, new in cases:
        decision = decide_onboard(cost, cached, tier, new, load, with_break_even=False)
        truth = ground_truth_best(cost, tier, cached, load, new)
        plain = min(decision.recompute_s, decision.reload_s)
        picked_right = decision.time_s <= truth * (1 + 1e-9) and decision.time_s <= plain
        correct += picked_right
    assert len(cases) == 192
    assert correct / len(cases) >= 0.95
    assert correct == len(cases)  # and, computed exactly, it is every case


def test_the_grid_exercises_every_action() -> None:
    actions = {
        decide_onboard(cost, cached, tier, new, load, with_break_even=False).action
        for cost, tier, cached, load, new in grid()
    }
    assert actions == {OnboardAction.RELOAD, OnboardAction.RECOMPUTE, OnboardAction.SPLIT}


def test_reload_wins_exactly_above_the_break_even_rate() -> None:
    for cost, tier, cached, load, new in grid():
        decision = decide_onboard(cost, cached, tier, new, load, with_break_even=False)
        assert decision.break_even_bytes_per_s is not None
        margin = decision.recompute_s - decision.reload_s
        if abs(margin) < 1e-9 * decision.recompute_s:
            continue
        assert (margin > 0) == (decision.link_bytes_per_s > decision.break_even_bytes_per_s)


def test_split_reloads_the_head_and_computes_the_tail() -> None:
    # A slow link and a long prefix: loading all of it is slower than computing, computing all
    # of it is slower still, so both streams run at once.
    cost = CostModel(model_preset("llama-3-8b"), with_host_rate(gpu_preset("h100"), 4e9))
    decision = decide_onboard(cost, 12000, Tier.DISK, 1, 0.0)
    assert decision.action is OnboardAction.SPLIT
    assert 0 < decision.reload_tokens < 12000
    assert decision.compute_tokens == 12000 - decision.reload_tokens + 1
    assert decision.time_s < min(decision.reload_s, decision.recompute_s)


def test_device_tier_hits_always_reload() -> None:
    cost = CostModel(model_preset("llama-3-8b"), gpu_preset("h100"))
    decision = decide_onboard(cost, 4096, Tier.DEVICE, 10)
    assert decision.action is OnboardAction.RELOAD
    assert decision.time_s == cost.prefill_time(10, 4096)
    assert decision.break_even_bytes_per_s is None


def test_nothing_cached_means_recompute() -> None:
    cost = CostModel(model_preset("llama-3-8b"), gpu_preset("h100"))
    decision = decide_onboard(cost, 0, Tier.HOST, 100)
    assert decision.action is OnboardAction.RECOMPUTE
    assert decision.reload_tokens == 0
    assert decision.break_even_bytes_per_s is None


def test_a_saturated_link_means_recompute() -> None:
    cost = CostModel(model_preset("llama-3-8b"), gpu_preset("h100"))
    decision = decide_onboard(cost, 8192, Tier.HOST, 1, 1.0)
    assert decision.action is OnboardAction.RECOMPUTE
    assert decision.reload_s == math.inf


def test_break_even_prefix_length() -> None:
    # With no new tokens to hide the load behind, a slow disk pays only for long prefixes.
    slow = CostModel(model_preset("llama-3-8b"), with_host_rate(gpu_preset("h100"), 4e9))
    tokens = break_even_prefix_tokens(slow, Tier.DISK, 0, 0.0)
    assert tokens is not None and tokens > 1

    def pays(prefix: int) -> bool:
        return slow.onboard_time(prefix, prefix, 0, Tier.DISK) < slow.prefill_time(prefix)

    assert pays(tokens) and pays(tokens * 4) and not pays(tokens - 1)
    # A saturated link never pays.
    assert break_even_prefix_tokens(slow, Tier.HOST, 0, 1.0) is None
    assert break_even_prefix_tokens(slow, Tier.DEVICE, 0, 0.0) == 1


def test_decision_reports_the_prefix_break_even() -> None:
    cost = CostModel(model_preset("llama-3-8b"), with_host_rate(gpu_preset("h100"), 4e9))
    decision = decide_onboard(cost, 100, Tier.DISK, 0, 0.0)
    assert decision.break_even_prefix_tokens == break_even_prefix_tokens(cost, Tier.DISK, 0, 0.0)
    assert decision.break_even_prefix_tokens is not None
    assert decision.break_even_prefix_tokens > 100
    assert decision.reload_s > decision.recompute_s  # below the break-even, reload loses
