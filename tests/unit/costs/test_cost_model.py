"""The cost model's formulas, on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from kvtide.costs.cost_model import Coefficients, CostModel
from kvtide.costs.specs import gpu_preset, model_preset
from kvtide.errors import ConfigError
from kvtide.types import Tier

# No overheads and full efficiency: times are pure FLOPs or bytes over rates.
IDEAL = Coefficients(
    prefill_efficiency=1.0,
    iteration_overhead_s=0.0,
    memory_efficiency=1.0,
    host_link_efficiency=1.0,
    host_transfer_overhead_s=0.0,
    host_chunk_latency_s=0.0,
    disk_efficiency=1.0,
    disk_transfer_overhead_s=0.0,
    disk_chunk_latency_s=0.0,
)


def model(name: str = "llama-3-8b", gpu: str = "h100", **kwargs: object) -> CostModel:
    return CostModel(model_preset(name), gpu_preset(gpu), **kwargs)  # type: ignore[arg-type]


def test_prefill_time_is_flops_over_peak_plus_overhead() -> None:
    cost = model(coefficients=Coefficients(prefill_efficiency=0.5, iteration_overhead_s=0.002))
    spec = cost.model
    linear = 2 * spec.matmul_params * 1000
    # 1000 new tokens after 3000 cached: 1000·3000 + 1000·1001/2 pairs; QK and PV per pair.
    attention = 2 * 32 * 32 * (128 + 128) * (1000 * 3000 + 1000 * 1001 / 2)
    expected = 0.002 + (linear + attention) / (989.4e12 * 0.5)
    assert cost.prefill_time(1000, 3000) == pytest.approx(expected, rel=1e-12)
    assert cost.prefill_time(0, 3000) == 0.0


def test_tensor_parallel_divides_compute() -> None:
    one = model("llama-3-70b", coefficients=IDEAL)
    eight = model("llama-3-70b", tp=8, coefficients=IDEAL)
    assert eight.prefill_time(4096) == pytest.approx(one.prefill_time(4096) / 8)


def test_kv_bytes_and_shards() -> None:
    cost = model("llama-3-70b", tp=8)
    assert cost.kv_bytes(8192) == 8192 * 327680
    assert cost.num_kv_shards == 8
    assert model("llama-3-8b", tp=16 // 2).num_kv_shards == 8
    # MLA's latent is replicated on every rank.
    assert model("deepseek-v3", tp=8).num_kv_shards == 1
    assert model("llama-3-8b", dtype="fp8").kv_bytes_per_token == 65536


def test_host_transfer_is_overhead_plus_copies_plus_bytes_over_rate() -> None:
    coefficients = Coefficients(
        host_link_efficiency=0.8, host_transfer_overhead_s=20e-6, host_chunk_latency_s=2e-6
    )
    cost = model(coefficients=coefficients)
    rate = 16 * 32e9 * 128 / 130 / 8 * 0.8
    # 1024 tokens: 4 chunks of 256 tokens in each of 32 layers = 128 copies.
    num_bytes = cost.kv_bytes(1024)
    expected = 20e-6 + 128 * 2e-6 + num_bytes / rate
    assert cost.transfer_time(num_bytes, Tier.HOST) == pytest.approx(expected, rel=1e-12)
    # Half the link already busy halves the rate, not the fixed costs.
    expected_loaded = 20e-6 + 128 * 2e-6 + num_bytes / (rate * 0.5)
    assert cost.transfer_time(num_bytes, Tier.HOST, 0.5) == pytest.approx(expected_loaded)
    # A few tokens still take one copy per layer.
    assert cost.transfer_time(cost.kv_bytes(1), Tier.HOST) == pytest.approx(
        20e-6 + 32 * 2e-6 + cost.kv_bytes(1) / rate
    )


def test_small_copies_lose_efficiency() -> None:
    cost = model("llama-3-70b", tp=8)
    big = cost.kv_bytes(65536) / cost.transfer_time(cost.kv_bytes(65536), Tier.HOST)
    small = cost.kv_bytes(64) / cost.transfer_time(cost.kv_bytes(64), Tier.HOST)
    assert small < 0.5 * big


def test_disk_rate_is_the_slower_of_drive_and_pcie() -> None:
    cost = model(coefficients=IDEAL)
    assert cost.link_bytes_per_s(Tier.DISK) == 7.0e9
    assert cost.link_bytes_per_s(Tier.HOST) == pytest.approx(63.0e9, rel=1e-3)
    assert cost.transfer_time(7.0e9, Tier.DISK) == pytest.approx(1.0)
    assert cost.link_bytes_per_s(Tier.DEVICE) == math.inf


def test_device_tier_and_empty_transfers_cost_nothing() -> None:
    cost = model()
    assert cost.transfer_time(1e9, Tier.DEVICE) == 0.0
    assert cost.transfer_time(0, Tier.HOST) == 0.0


def test_a_saturated_link_never_finishes() -> None:
    assert model().transfer_time(1e6, Tier.HOST, 1.0) == math.inf


def test_link_load_outside_zero_one_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"link load must lie in \[0, 1\]"):
        model().transfer_time(1e6, Tier.HOST, 1.5)


def test_decode_is_memory_bound_at_batch_one() -> None:
    cost = model(coefficients=IDEAL)
    weights = (cost.model.num_params - 128256 * 4096) * 2  # the input embedding is a lookup
    kv = 4096 * 131072
    assert cost.decode_step_time(1, 4096) == pytest.approx((weights + kv) / 3.35e12)
    # Large batches become compute-bound: time grows with the batch.
    assert cost.decode_step_time(4096, 128) > cost.decode_step_time(256, 128)


def test_onboard_time_overlaps_load_and_compute_layer_by_layer() -> None:
    cost = model(coefficients=IDEAL)
    load = cost.transfer_time(cost.kv_bytes(3000), Tier.HOST)
    compute = cost.prefill_time(1000 + 24, 3000)
    expected = max(load, compute) + min(load, compute) / 32
    assert cost.onboard_time(4000, 3000, 24, Tier.HOST) == pytest.approx(expected)
    assert cost.onboard_time(4000, 0, 24, Tier.HOST) == cost.prefill_time(4024)
    assert cost.onboard_time(4000, 4000, 0, Tier.HOST) == cost.transfer_time(
        cost.kv_bytes(4000), Tier.HOST
    )


def test_prefill_throughput() -> None:
    cost = model(coefficients=IDEAL)
    assert cost.prefill_tokens_per_s(4096) == pytest.approx(4096 / cost.prefill_time(4096))


def test_bad_parallelism_and_dtype_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="does not divide the 64 attention heads"):
        model("llama-3-70b", tp=3)
    with pytest.raises(ConfigError, match="integer >= 1"):
        model(tp=0)
    with pytest.raises(ConfigError, match="unknown KV dtype 'fp4'"):
        model(dtype="fp4")


def test_coefficients_validate_and_round_trip() -> None:
    coefficients = Coefficients(prefill_efficiency=0.42, chunk_tokens=16)
    assert Coefficients.from_dict(coefficients.to_dict()) == coefficients
    with pytest.raises(ConfigError, match="unknown coefficient 'speed'"):
        Coefficients.from_dict({"speed": 1.0})
    with pytest.raises(ConfigError, match="must be a number"):
        Coefficients.from_dict({"prefill_efficiency": "fast"})
    with pytest.raises(ConfigError, match="prefill_efficiency must be > 0"):
        Coefficients(prefill_efficiency=0.0)
    with pytest.raises(ConfigError, match="finite and >= 0"):
        Coefficients(iteration_overhead_s=-1.0)
    with pytest.raises(ConfigError, match="must be an integer"):
        Coefficients.from_dict({"chunk_tokens": 2.5})


def test_a_short_prefill_is_memory_bound() -> None:
    cost = model(coefficients=IDEAL)
    weights = (cost.model.num_params - 128256 * 4096) * 2  # the input embedding is a lookup
    # One token after 4095 cached: every weight and the 4096 tokens' KV are read once.
    expected = (weights + 4096 * 131072) / 3.35e12
    assert cost.prefill_time(1, 4095) == pytest.approx(expected)
    assert cost.prefill_memory_time(1, 4095) > cost.prefill_compute_time(1, 4095)
    assert cost.prefill_compute_time(8192, 0) > cost.prefill_memory_time(8192, 0)
