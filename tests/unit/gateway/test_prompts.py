"""Prompt identity: text-mode chunks chain like blocks; the conversation-prefix token cache
gives exactly the ids of tokenizing the whole rendered prompt."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.chat_templates import bos_tokenizer, tool_tokenizer

from kvtide.core.hashing import hash_tokens
from kvtide.gateway.prompts import PrefixTokenCache, PromptHasher
from kvtide.gateway.status import ApiError
from kvtide.text import smollm2
from kvtide.text.chat_request import ChatRequest, parse_chat_request


def _req(messages: list[dict[str, str]]) -> ChatRequest:
    return ChatRequest(tuple(messages))


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
    bad_ids = ([-1, 5], [2**31], [2**63], [2**64 - 1], [1, True], [[-1]])
    for body in (
        {"prompt": 3},
        {"prompt": ["a", "b"]},
        {"prompt": []},
        *({"prompt": ids} for ids in bad_ids),
    ):
        with pytest.raises(ApiError) as err:
            h.completion(body, 1)
        assert err.value.status.http == 400 and err.value.param == "prompt"
    for msgs in (None, [], ["x"], [{"content": "x"}], [{"role": "u", "content": 3}]):
        with pytest.raises(ApiError) as err:
            h.chat({"messages": msgs}, 1)
        assert err.value.status.http == 400
    # a batch of one, as the engines take it
    assert h.completion({"prompt": [[7, 8] * 40]}, 1) == h.completion({"prompt": [7, 8] * 40}, 1)
    with pytest.raises(ApiError) as err:
        h.completion({"prompt": list(range(5000))}, 1)
    assert err.value.status.http == 413


def test_prefix_token_cache_equals_tokenizing_the_whole_prompt() -> None:
    tok = smollm2()
    cache = PrefixTokenCache(100_000)
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
            assert cache.tokenize(tok, _req(messages)).tolist() == direct
            messages.append({"role": "assistant", "content": " ".join(rng.choices(words, k=9))})
    assert cache.hits >= 6 * 3  # turn N reused turn N-1's ids


class _CountingTokenizer:
    """smollm2, counting the characters it was asked to encode."""

    def __init__(self) -> None:
        self.tok = smollm2()
        self.encoded_chars = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.encoded_chars += len(text)
        return self.tok.encode(text, add_special_tokens)

    def encode_ids(self, text: str, add_special_tokens: bool = True) -> npt.NDArray[np.int32]:
        self.encoded_chars += len(text)
        return self.tok.encode_ids(text, add_special_tokens)

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True, **variables: Any
    ) -> str:
        return self.tok.apply_chat_template(messages, add_generation_prompt, **variables)


def test_a_shared_system_prompt_is_kept_apart_from_its_second_conversation_on() -> None:
    """The first conversation is tokenized whole (its system prompt might never come back),
    the second keeps the system prompt apart, every later one tokenizes only its question."""
    tok = _CountingTokenizer()
    cache = PrefixTokenCache(100_000)
    system = {"role": "system", "content": "Answer in one word. " * 40}
    encoded = []
    for i in range(5):
        messages = [system, {"role": "user", "content": f"question {i}?"}]
        direct = tok.tok.encode(
            tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False
        )
        before = tok.encoded_chars
        assert cache.tokenize(tok, _req(messages)).tolist() == direct
        encoded.append(tok.encoded_chars - before)
    assert (cache.misses, cache.hits) == (2, 3)
    assert encoded[0] > len(system["content"]) and encoded[1] > len(system["content"])
    assert max(encoded[2:]) < 100  # the question and its markup only


def test_a_scope_never_answers_another_scopes_conversations() -> None:
    """The gateway scopes the cache by the request's namespace seed (tenant and model): a
    conversation one tenant sent is a miss for another, its system prompt too."""
    tok = _CountingTokenizer()
    cache = PrefixTokenCache(100_000)
    system = {"role": "system", "content": "Answer in one word. " * 40}
    for i in range(3):
        cache.tokenize(tok, _req([system, {"role": "user", "content": f"q {i}?"}]), scope=1)
    assert (cache.misses, cache.hits) == (2, 1)
    messages = [system, {"role": "user", "content": "q 0?"}]
    direct = tok.tok.encode(
        tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False
    )
    before = tok.encoded_chars
    assert cache.tokenize(tok, _req(messages), scope=2).tolist() == direct
    assert cache.misses == 3 and tok.encoded_chars - before > len(system["content"])
    assert cache.tokenize(tok, _req(messages), scope=1).tolist() == direct
    assert cache.hits == 2


def test_one_off_first_messages_are_held_once() -> None:
    """Conversations that each open with a message of their own: one entry each, holding
    each conversation's ids once (not again for its first message), and the doorkeeper stays
    within its bound."""
    tok = smollm2()
    cache = PrefixTokenCache(1_000_000, max_firsts=8)
    sizes = 0
    for i in range(20):
        messages = [
            {"role": "system", "content": f"[{i}] You are a helpful assistant. " * 10},
            {"role": "user", "content": "hi"},
        ]
        ids = cache.tokenize(tok, _req(messages))
        sizes += len(ids) - len(cache._generation_suffix(tok)[1])  # type: ignore[index]
        assert len(cache._firsts) <= 8
    assert len(cache) == 20 and cache.tokens == sizes


_WORDS = ["ship", "parcel", "Zürich", "42", "\n", "  ", "don't", "—", "émigré", "x", "<|im_end|>"]
_step = st.tuples(
    st.integers(0, 5),  # which conversation moves
    st.sampled_from(["extend", "extend", "extend", "restart", "edit"]),
    st.lists(st.sampled_from(_WORDS), min_size=1, max_size=25),
)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 400), st.lists(_step, min_size=1, max_size=40))
def test_prefix_cache_holds_at_most_its_token_bound_and_hits_equal_full_tokenization(
    bound: int, stream: list[tuple[int, str, list[str]]]
) -> None:
    """A long interleaved stream of growing, restarted and rewritten conversations: after
    every request the cache holds no more token ids than its bound (counted from its entries,
    not trusted from its counter), and every answer, hit or miss, is exactly the ids of
    tokenizing the whole rendered prompt (the differential reference)."""
    tok = smollm2()
    cache = PrefixTokenCache(bound)
    system = {"role": "system", "content": "Be brief. " * 8}
    convs: list[list[dict[str, str]]] = [[system] for _ in range(6)]
    for which, action, words in stream:
        conv = convs[which]
        text = " ".join(words)
        if action == "restart":
            conv[1:] = []
        elif action == "edit" and len(conv) > 1:  # a client that rewrites an earlier turn
            conv[1] = {"role": conv[1]["role"], "content": text}
        conv.append({"role": "user", "content": text})
        direct = tok.encode(
            tok.apply_chat_template(conv, add_generation_prompt=True), add_special_tokens=False
        )
        assert cache.tokenize(tok, _req(conv)).tolist() == direct
        held = sum(len(ids) for _, ids in cache._entries.values())
        assert held == cache.tokens <= bound
        conv.append({"role": "assistant", "content": text[::-1]})


def test_prefix_cache_bound_keeps_the_most_recent_conversation_hitting() -> None:
    """A bound near one conversation's size: older conversations are evicted by tokens, and
    the one just seen still hits on its next turn."""
    tok = smollm2()
    cache = PrefixTokenCache(600)
    for i in range(20):
        messages = [{"role": "user", "content": f"conversation {i} " + "word " * 60}]
        cache.tokenize(tok, _req(messages))
        assert cache.tokens <= 600
        hits = cache.hits
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
        cache.tokenize(tok, _req(messages))
        assert cache.hits == hits + 1
    assert len(cache) < 20


_TOOLS = {
    "a": [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}],
    "b": [{"type": "function", "function": {"name": "fetch", "description": "a URL"}}],
}


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # which agent moves
            st.booleans(),  # whether its reply calls a tool
            st.lists(st.sampled_from(_WORDS), min_size=1, max_size=12),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_prefix_cache_with_tools_and_tool_calls_equals_full_tokenization(
    stream: list[tuple[int, bool, list[str]]],
) -> None:
    """Agents under a tool-aware template: two share a system prompt and tools, one has other
    tools, one none; replies call tools. Every answer is the ids of tokenizing the whole
    rendered prompt, so an agent's tools and calls are part of its prefix in the cache's
    keys, never mixed up with another's."""
    tok = tool_tokenizer()
    cache = PrefixTokenCache(100_000)
    tools = [_TOOLS["a"], _TOOLS["a"], _TOOLS["b"], None]
    system = {"role": "system", "content": "Be brief."}
    convs: list[list[dict[str, Any]]] = [[system] for _ in tools]
    for which, calls, words in stream:
        text = " ".join(words)
        conv = convs[which]
        conv.append({"role": "user", "content": text})
        body: dict[str, Any] = {"messages": conv}
        if tools[which] is not None:
            body["tools"] = tools[which]
        req = parse_chat_request(body)
        direct = tok.encode(req.render(tok), add_special_tokens=False)
        assert cache.tokenize(tok, req).tolist() == direct
        if calls:
            fn = {"name": "search", "arguments": json.dumps({"q": text})}
            call = {"id": f"c{len(conv)}", "type": "function", "function": fn}
            conv.append({"role": "assistant", "content": None, "tool_calls": [call]})
            conv.append({"role": "tool", "tool_call_id": call["id"], "content": text[:5]})
        conv.append({"role": "assistant", "content": text[::-1]})


def test_tools_and_tool_calls_count_in_text_mode_identity() -> None:
    """Without a tokenizer the prefix is the template's inputs: the same messages under other
    tools, or with another tool call in the history, share no blocks from the start (tools)
    or from that message on (calls)."""
    h = PromptHasher(16, 16, 100_000, 100_000)
    system = {"role": "system", "content": "You are an agent. " * 8}
    plain = h.chat({"messages": [system]}, 1).hashes.tolist()
    assert plain and h.chat({"messages": [system]}, 1).hashes.tolist() == plain
    assert not set(h.chat({"messages": [system], "tools": _TOOLS["a"]}, 1).hashes.tolist()) & set(
        plain
    )
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    reply = {"role": "assistant", "content": "x"}
    user = {"role": "user", "content": "And the next question? " * 4}
    a = h.chat({"messages": [system, {**reply, "tool_calls": [call]}, user]}, 1).hashes
    b = h.chat({"messages": [system, reply, user]}, 1).hashes
    shared = 0
    while a[shared] == b[shared]:
        shared += 1
    # the system prompt's blocks (but for the one it ends in), not the turn after the call
    assert len(plain) - 1 <= shared < len(b) - 2


def test_a_completion_asking_for_no_special_tokens_is_hashed_without_them() -> None:
    """vLLM's ``add_special_tokens`` (default true): a client that rendered its own template
    into a completion's prompt turns the BOS off, and the engine's blocks then start without
    it; the gateway's must too, whole or as a head."""
    tok = bos_tokenizer()
    h = PromptHasher(16, 64, 100_000, 100_000, tok)
    text = "Deliver the parcel to the north depot before noon. " * 40
    for special in (True, False):
        body: dict[str, Any] = {"prompt": text}
        if not special:
            body["add_special_tokens"] = False
        ids = tok.encode(text, add_special_tokens=special)
        assert (ids[0] == tok.bos_token_id) is special
        whole = h.completion(body, 1)
        assert whole.prompt_tokens == len(ids)
        assert whole.hashes.tolist() == hash_tokens(ids, 16, 1).tolist()
        head = h.completion(body, 1, head_blocks=2)
        assert head.whole is not None and head.hashes.tolist() == whole.hashes.tolist()[:2]
    with pytest.raises(ApiError) as err:
        h.completion({"prompt": text, "add_special_tokens": "no"}, 1)
    assert err.value.param == "add_special_tokens"
