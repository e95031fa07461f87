"""Prompt identity: text-mode chunks chain like blocks; the conversation-prefix token cache
gives exactly the ids of tokenizing the whole rendered prompt."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.gateway.prompts import PrefixTokenCache, PromptHasher
from kvtide.gateway.status import ApiError
from kvtide.text import smollm2


def _hasher(tok: object = None) -> PromptHasher:
    return PromptHasher(16, 64, 10_000, 4096, tok)  # type: ignore[arg-type]


@settings(max_examples=50, deadline=None)
@given(st.text(min_size=0, max_size=400), st.text(min_size=0, max_size=200), st.text(max_size=200))
def test_text_chunks_share_exactly_the_common_full_chunks(common: str, a: str, b: str) -> None:
    h = _hasher()
    pa = h.completion({"prompt": common + a}, 7)
    pb = h.completion({"prompt": common + b}, 7)
    ea, eb = (common + a).encode(), (common + b).encode()
    same = 0
    while same < min(len(ea), len(eb)) and ea[same] == eb[same]:
        same += 1
    shared = 0
    while shared < min(len(pa.hashes), len(pb.hashes)) and pa.hashes[shared] == pb.hashes[shared]:
        shared += 1
    assert shared == min(same // 64, len(pa.hashes), len(pb.hashes))
    assert len(pa.hashes) == len(ea) // 64
    other = h.completion({"prompt": common + a}, 8)
    assert not set(other.hashes.tolist()) & set(pa.hashes.tolist())


def test_limits_and_malformed_prompts() -> None:
    h = _hasher()
    with pytest.raises(ApiError) as err:
        h.completion({"prompt": "x" * 10_001}, 1)
    assert err.value.status.http == 413
    for body in ({"prompt": 3}, {"prompt": ["a", "b"]}, {"prompt": []}):
        with pytest.raises(ApiError) as err:
            h.completion(body, 1)
        assert err.value.status.http == 400 and err.value.param == "prompt"
    for msgs in (None, [], ["x"], [{"content": "x"}], [{"role": "u", "content": 3}]):
        with pytest.raises(ApiError) as err:
            h.chat({"messages": msgs}, 1)
        assert err.value.status.http == 400
    with pytest.raises(ApiError) as err:
        h.completion({"prompt": list(range(5000))}, 1)
    assert err.value.status.http == 413


def test_prefix_token_cache_equals_tokenizing_the_whole_prompt() -> None:
    tok = smollm2()
    cache = PrefixTokenCache(64)
    rng = random.Random(3)
    words = ["ship", "parcel", "Zürich", "42", "\n", "  ", "don't", "—", "émigré", "x"]
    for _ in range(6):  # conversations growing turn by turn, as clients resend them
        messages = [{"role": "system", "content": " ".join(rng.choices(words, k=30))}]
        for _turn in range(4):
            messages.append({"role": "user", "content": " ".join(rng.choices(words, k=12))})
            direct = tok.encode(
                tok.apply_chat_template(messages, add_generation_prompt=True),
                add_special_tokens=False,
            )
            assert cache.tokenize(tok, messages) == direct
            messages.append({"role": "assistant", "content": " ".join(rng.choices(words, k=9))})
    assert cache.hits >= 6 * 3  # turn N reused turn N-1's ids


def test_a_shared_system_prompt_is_tokenized_once_for_every_conversation() -> None:
    tok = smollm2()
    cache = PrefixTokenCache(64)
    system = {"role": "system", "content": "Answer in one word. " * 40}
    for i in range(5):
        messages = [system, {"role": "user", "content": f"question {i}?"}]
        direct = tok.encode(
            tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False
        )
        assert cache.tokenize(tok, messages) == direct
    assert (cache.misses, cache.hits) == (1, 4)
