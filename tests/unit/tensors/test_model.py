"""The llama decoder: incremental computation over a cached prefix equals one full pass."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvtide.tensors.model import ContiguousKV, LlamaConfig, LlamaModel, _apply_rope  # noqa: E402

pytestmark = pytest.mark.torch

# float32 on the CPU: the same sums in a different blocking differ by a few ulps.
ATOL, RTOL = 1e-5, 1e-4


def test_prefix_then_suffix_equals_one_pass(tiny_model: LlamaModel) -> None:
    ids = [(7 * i + 3) % 128 for i in range(23)]
    full = tiny_model.forward(ids, all_logits=True)
    head = tiny_model.forward(ids[:12])
    tail = tiny_model.forward(ids[12:], ContiguousKV(head.kv), all_logits=True)
    assert tail.logits.shape == (11, 128)
    assert torch.allclose(tail.logits, full.logits[12:], atol=ATOL, rtol=RTOL)
    assert torch.allclose(torch.cat((head.kv, tail.kv), dim=3), full.kv, atol=ATOL, rtol=RTOL)


def test_one_token_at_a_time_equals_one_pass(tiny_model: LlamaModel) -> None:
    ids = [5, 9, 13, 2, 77, 101, 64, 3]
    full = tiny_model.forward(ids, all_logits=True)
    kv = tiny_model.forward(ids[:1]).kv
    for i in range(1, len(ids)):
        step = tiny_model.forward(ids[i : i + 1], ContiguousKV(kv))
        kv = torch.cat((kv, step.kv), dim=3)
        assert torch.allclose(step.logits[0], full.logits[i], atol=ATOL, rtol=RTOL)


def test_rope_scores_depend_only_on_relative_position() -> None:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1, 16, generator=gen)
    k = torch.randn(1, 1, 16, generator=gen)
    model = LlamaModel.random(
        LlamaConfig(
            vocab_size=8,
            hidden_size=16,
            intermediate_size=8,
            num_layers=1,
            num_heads=1,
            num_kv_heads=1,
            head_dim=16,
        )
    )

    def score(qpos: int, kpos: int) -> float:
        cq, sq = model._rope(qpos, 1)
        ck, sk = model._rope(kpos, 1)
        return float((_apply_rope(q, cq, sq) * _apply_rope(k, ck, sk)).sum())

    assert score(9, 4) == pytest.approx(score(105, 100), abs=1e-5)
    assert score(9, 4) != pytest.approx(score(9, 5), abs=1e-3)


def test_smollm2_shaped_config_sizes() -> None:
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
    )
    assert config.kv_bytes_per_token() == 46_080  # 2 * 30 layers * 3 heads * 64 * 4 bytes
    assert config.kv_bytes_per_token(2) == 23_040
    assert config.num_params == 134_515_008  # SmolLM2-135M, embeddings tied


def test_empty_input_is_refused(tiny_model: LlamaModel) -> None:
    with pytest.raises(ValueError, match="at least one"):
        tiny_model.forward([])
