"""Weights and KV per GPU against its memory, at the tensor-parallel degree chosen."""

from __future__ import annotations

import pytest

from kvtide.costs.cost_model import CostModel
from kvtide.costs.memory import memory_fit
from kvtide.costs.specs import gpu_preset, model_preset


def test_weights_and_kv_split_over_the_ranks() -> None:
    one = memory_fit(CostModel(model_preset("llama-3-70b"), gpu_preset("h100"), 1), 100_000)
    eight = memory_fit(CostModel(model_preset("llama-3-70b"), gpu_preset("h100"), 8), 100_000)
    assert not one.weights_fit and eight.fits
    assert eight.weight_bytes == pytest.approx(one.weight_bytes / 8)
    assert eight.kv_bytes == pytest.approx(one.kv_bytes / 8)  # 8 KV heads over 8 ranks


def test_the_largest_pool_that_fits_fits_and_one_more_token_does_not() -> None:
    cost = CostModel(model_preset("llama-3-8b"), gpu_preset("h100"), 1)
    limit = memory_fit(cost, 1).max_kv_tokens
    assert memory_fit(cost, limit).fits and not memory_fit(cost, limit + 1).fits
    assert "llama-3-8b on 1 × h100" in memory_fit(cost, limit + 1).describe()


def test_a_gpu_of_unknown_memory_fits_everything() -> None:
    gpu = gpu_preset("h100")
    unknown = type(gpu)(
        **{**{f: getattr(gpu, f) for f in gpu.__dataclass_fields__}, "memory_bytes": None}
    )
    fit = memory_fit(CostModel(model_preset("llama-3-70b"), unknown, 1), 10**9)
    assert fit.fits and fit.weights_fit
