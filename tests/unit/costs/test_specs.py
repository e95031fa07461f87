"""Specs: published KV sizes and parameter counts, config.json reading, preset errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtide.costs.specs import (
    GPU_PRESETS,
    MODEL_PRESETS,
    AttentionKind,
    ModelSpec,
    gpu_preset,
    kv_dtype_bytes,
    model_preset,
    resolve_model,
)
from kvtide.errors import ConfigError


def test_kv_bytes_per_token_matches_the_published_sizes() -> None:
    # 2 (K and V) · layers · KV heads · head dim · 2 bytes: 128 KiB for Llama-3-8B, 320 KiB for 70B.
    assert model_preset("llama-3-8b").kv_bytes_per_token("bf16") == 131072
    assert model_preset("llama-3-70b").kv_bytes_per_token("bf16") == 327680
    assert model_preset("llama-3-8b").kv_bytes_per_token("fp8") == 65536
    assert model_preset("qwen2.5-7b").kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2
    assert model_preset("qwen2.5-72b").kv_bytes_per_token() == 327680


def test_deepseek_v3_caches_one_latent_per_layer() -> None:
    spec = model_preset("deepseek-v3")
    assert spec.attention is AttentionKind.MLA
    # (kv_lora_rank 512 + rope 64) · 61 layers · 2 bytes.
    assert spec.kv_bytes_per_token() == 576 * 61 * 2 == 70272
    assert spec.head_dim == 192 and spec.v_head_dim == 128
    assert spec.weight_bytes_per_param == 1.0  # the FP8 release


@pytest.mark.parametrize(
    ("name", "total_b", "active_b"),
    [
        # Model cards: 8.03B, 70.6B; Qwen2.5: 7.61B, 72.7B; DeepSeek-V3: 671B total, 37B active.
        ("llama-3-8b", 8.03, 8.03),
        ("llama-3-70b", 70.55, 70.55),
        ("qwen2.5-7b", 7.61, 7.61),
        ("qwen2.5-72b", 72.7, 72.7),
        ("deepseek-v3", 671.0, 37.5),
    ],
)
def test_parameter_counts_match_the_model_cards(name: str, total_b: float, active_b: float) -> None:
    spec = model_preset(name)
    assert spec.num_params / 1e9 == pytest.approx(total_b, rel=0.005)
    assert spec.num_active_params / 1e9 == pytest.approx(active_b, rel=0.01)


def test_deepseek_active_parameters_without_input_embedding_match_its_readme() -> None:
    # DeepSeek-V3's README_WEIGHTS: 36.6B activated, including the 0.9B output head.
    spec = model_preset("deepseek-v3")
    input_embedding = spec.vocab_size * spec.hidden_size
    assert (spec.num_active_params - input_embedding) / 1e9 == pytest.approx(36.6, abs=0.05)


def test_unknown_presets_list_the_valid_names() -> None:
    with pytest.raises(ConfigError, match="llama-3-70b") as model_error:
        model_preset("llama-4")
    assert "unknown model 'llama-4'" in str(model_error.value)
    with pytest.raises(ConfigError, match="h100, h200, h800, l40s"):
        gpu_preset("b200")
    with pytest.raises(ConfigError, match="bf16, fp8"):
        kv_dtype_bytes("int4")


def test_every_preset_builds() -> None:
    assert sorted(MODEL_PRESETS) == [
        "deepseek-v3",
        "llama-3-70b",
        "llama-3-8b",
        "qwen2.5-72b",
        "qwen2.5-7b",
    ]
    assert sorted(GPU_PRESETS) == ["a100", "a800", "h100", "h200", "h800", "l40s"]
    for name in MODEL_PRESETS:
        assert model_preset(name).name == name


def test_vendor_numbers_per_gpu() -> None:
    h100, a100, l40s = gpu_preset("h100"), gpu_preset("a100"), gpu_preset("l40s")
    assert h100.bf16_flops_per_s == 989.4e12
    assert gpu_preset("h800").bf16_flops_per_s == h100.bf16_flops_per_s
    assert gpu_preset("h200").hbm_bytes_per_s == 4.8e12
    assert a100.bf16_flops_per_s == gpu_preset("a800").bf16_flops_per_s == 312e12
    assert l40s.hbm_bytes_per_s == 864e9
    # PCIe x16 payload per direction: Gen5 63.0 GB/s, Gen4 31.5 GB/s.
    assert h100.host_to_device_bytes_per_s == pytest.approx(63.0e9, rel=1e-3)
    assert a100.host_to_device_bytes_per_s == pytest.approx(31.5e9, rel=1e-3)


def test_from_hf_config_reads_a_file_and_a_folder(tmp_path: Path) -> None:
    config = dict(MODEL_PRESETS["llama-3-8b"], _name_or_path="meta-llama/Meta-Llama-3-8B")
    (tmp_path / "config.json").write_text(json.dumps(config))
    from_file = ModelSpec.from_hf_config(tmp_path / "config.json")
    from_dir = ModelSpec.from_hf_config(tmp_path)
    assert from_file == from_dir
    assert from_file.name == "meta-llama/Meta-Llama-3-8B"
    assert from_file.kv_bytes_per_token() == 131072
    assert resolve_model(str(tmp_path / "config.json")) == from_file


def test_from_hf_config_honours_head_dim_and_tied_embeddings() -> None:
    config = dict(MODEL_PRESETS["llama-3-8b"], head_dim=64, tie_word_embeddings=True)
    spec = ModelSpec.from_hf_config(config, name="small-heads")
    assert spec.kv_bytes_per_token() == 2 * 32 * 8 * 64 * 2
    assert spec.num_embedding_params == 128256 * 4096


def test_from_hf_config_errors_name_the_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}))
    with pytest.raises(ConfigError, match=r"config.json: missing 'num_attention_heads'"):
        ModelSpec.from_hf_config(bad)
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelSpec.from_hf_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        ModelSpec.from_hf_config(tmp_path / "absent.json")
    config = dict(MODEL_PRESETS["llama-3-8b"], hidden_size="4096")
    with pytest.raises(ConfigError, match="'hidden_size' must be a non-negative integer"):
        ModelSpec.from_hf_config(config)


def test_resolve_model_rejects_unknown_names() -> None:
    with pytest.raises(ConfigError, match=r"or a path to a Hugging Face config\.json"):
        resolve_model("gpt-5")


def test_moe_decode_reads_more_experts_as_the_batch_grows() -> None:
    spec = model_preset("deepseek-v3")
    input_embedding = spec.vocab_size * spec.hidden_size
    one = spec.weight_bytes_read(1)
    assert one == pytest.approx(spec.num_active_params - input_embedding)  # FP8: 1 byte each
    assert one < spec.weight_bytes_read(8) < spec.weight_bytes_read(1024)
    assert spec.weight_bytes_read(100_000) == pytest.approx(spec.num_params - input_embedding)
    dense = model_preset("llama-3-8b")
    expected = (dense.num_params - 128256 * 4096) * 2.0  # all but the input embedding
    assert dense.weight_bytes_read(1) == dense.weight_bytes_read(64) == expected
