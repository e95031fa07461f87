"""Monotonicity of the cost model, and decisions never worse than any plan."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.costs.cost_model import CostModel
from kvtide.costs.specs import GPU_PRESETS, MODEL_PRESETS, gpu_preset, model_preset
from kvtide.types import Tier

MODELS = {name: model_preset(name) for name in MODEL_PRESETS}
cost_models = st.builds(
    lambda m, g, dtype: CostModel(MODELS[m], gpu_preset(g), dtype=dtype),
    st.sampled_from(sorted(MODELS)),
    st.sampled_from(sorted(GPU_PRESETS)),
    st.sampled_from(["bf16", "fp8"]),
)
tokens = st.integers(min_value=0, max_value=200_000)
loads = st.floats(min_value=0.0, max_value=0.99)
tiers = st.sampled_from([Tier.HOST, Tier.DISK])


@given(cost_models, tokens, tokens, tokens)
def test_prefill_time_grows_with_new_tokens_and_context(
    cost: CostModel, new: int, more: int, cached: int
) -> None:
    assert cost.prefill_time(new + more, cached) >= cost.prefill_time(new, cached)
    assert cost.prefill_time(new, cached + more) >= cost.prefill_time(new, cached)


@given(cost_models, tiers, st.floats(0, 1e12), st.floats(0, 1e12), loads, loads)
def test_transfer_time_grows_with_bytes_and_link_load(
    cost: CostModel, tier: Tier, num_bytes: float, more: float, load: float, more_load: float
) -> None:
    assert cost.transfer_time(num_bytes + more, tier, load) >= cost.transfer_time(
        num_bytes, tier, load
    )
    heavier = min(0.99, load + more_load)
    assert cost.transfer_time(num_bytes, tier, heavier) >= cost.transfer_time(num_bytes, tier, load)


@settings(max_examples=60, deadline=None)
@given(cost_models, tiers, st.integers(0, 50_000), st.integers(0, 4096), loads)
def test_decision_is_never_slower_than_reload_recompute_or_a_sampled_split(
    cost: CostModel, tier: Tier, cached: int, new: int, load: float
) -> None:
    decision = cost.decide_onboard(cached, tier, new, load, with_break_even=False)
    assert decision.time_s == cost.onboard_time(cached, decision.reload_tokens, new, tier, load)
    for k in {0, cached, cached // 3, cached // 2, (3 * cached) // 4}:
        assert decision.time_s <= cost.onboard_time(cached, k, new, tier, load) * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(
    cost_models,
    tiers,
    st.integers(0, 20_000),
    st.integers(1, 512),
    loads,
    st.sampled_from([16, 512]),
)
def test_block_aligned_splits_are_the_best_block_aligned_plan(
    cost: CostModel, tier: Tier, cached: int, new: int, load: float, block: int
) -> None:
    decision = cost.decide_onboard(
        cached, tier, new, load, block_tokens=block, with_break_even=False
    )
    if decision.split_reload_tokens:
        assert decision.split_reload_tokens % block == 0
    splits = range(block, cached, block)
    best = min(
        [decision.recompute_s, decision.reload_s]
        + [cost.onboard_time(cached, k, new, tier, load) for k in splits]
    )
    assert decision.time_s <= best * (1 + 1e-12)
