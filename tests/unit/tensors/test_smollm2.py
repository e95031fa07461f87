"""SmolLM2-135M-Instruct on kvtide's paged cache: the greedy answer does not change with reuse.

Logit tolerance: atol 1e-3, rtol 1e-4 (float32 over 30 layers; logits are O(10)).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from kvtide.clock import ManualClock  # noqa: E402
from kvtide.core.hashing import Namespace  # noqa: E402
from kvtide.core.tiers import TieredCache, TieredCacheConfig, TierSpec  # noqa: E402
from kvtide.tensors.gguf_loader import GgufModel  # noqa: E402
from kvtide.tensors.model import ContiguousKV, LlamaModel  # noqa: E402
from kvtide.tensors.runner import PagedRunner  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

ATOL, RTOL = 1e-3, 1e-4
NEW_TOKENS = 12


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread: on 2 shared cores the wake-up of a second thread costs more than
    it gives to a one-token decode step (measured 3x slower with 2 threads under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def greedy_without_cache(model: LlamaModel, ids: list[int]) -> tuple[list[int], torch.Tensor]:
    out = model.forward(ids)
    first, kv, logits = out.logits[-1], out.kv, out.logits[-1]
    tokens: list[int] = []
    while len(tokens) < NEW_TOKENS:
        tokens.append(int(torch.argmax(logits)))
        step = model.forward(tokens[-1:], ContiguousKV(kv))
        kv, logits = torch.cat((kv, step.kv), dim=3), step.logits[-1]
    return tokens, first


@pytest.mark.usefixtures("one_thread")
def test_greedy_answer_is_the_same_with_and_without_the_cache(smollm2: GgufModel) -> None:
    model = LlamaModel(smollm2.config, smollm2.weights)
    tok = smollm2.tokenizer

    def prompt(question: str) -> list[int]:
        return tok.apply_chat_template([{"role": "user", "content": question}], tokenize=True)

    france = prompt("What is the capital of France?")
    colours = prompt("Name the three primary colours.")
    expected, expected_logits = greedy_without_cache(model, france)
    assert "Paris" in tok.decode(expected)

    tiers = TieredCache(
        TieredCacheConfig(device=TierSpec(32), host=TierSpec(32), block_tokens=16), ManualClock()
    )
    runner = PagedRunner(model, tiers, Namespace(model=smollm2.name))
    cache = runner.cache
    cold = runner.generate(france, NEW_TOKENS)
    assert cold.prefill.reused_tokens == 0
    device_hit = runner.generate(france, NEW_TOKENS)
    assert device_hit.prefill.device_hit_tokens == 32  # 37 tokens: 2 full blocks reused
    runner.evict_device(cache.num_cached_blocks)
    host_hit = runner.generate(france, NEW_TOKENS)
    assert host_hit.prefill.host_reload_tokens == 32
    for run in (cold, device_hit, host_hit):
        assert run.token_ids == expected
        assert torch.allclose(run.first_logits, expected_logits, atol=ATOL, rtol=RTOL)

    # a second question sharing only the system prompt's first block
    expected_colours, colours_logits = greedy_without_cache(model, colours)
    shared = runner.generate(colours, NEW_TOKENS)
    assert shared.prefill.device_hit_tokens == 16
    assert shared.token_ids == expected_colours
    assert torch.allclose(shared.first_logits, colours_logits, atol=ATOL, rtol=RTOL)
