"""Block ids and token ids become text: deterministic, exactly sized, prefix-preserving."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.loadgen import PromptBuilder
from kvtide.text import Tokenizer
from kvtide.types import Request
from kvtide.workloads import open_workload


def block_request(
    rid: str, block_ids: list[int], prompt_tokens: int, bt: int = 16, **kw: object
) -> Request:
    return Request(rid, 0.0, prompt_tokens, 8, bt, block_ids=tuple(block_ids), **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def builder(tokenizer: Tokenizer) -> PromptBuilder:
    return PromptBuilder(tokenizer, seed=0)


def test_same_block_id_gives_the_same_text_on_any_builder(
    tokenizer: Tokenizer, builder: PromptBuilder
) -> None:
    a = builder.build(block_request("a", [7, 8], 32)).text
    again = PromptBuilder(tokenizer, seed=0).build(block_request("b", [7, 8], 32)).text
    other_seed = PromptBuilder(tokenizer, seed=1).build(block_request("c", [7, 8], 32)).text
    assert a == again != other_seed
    assert builder.build(block_request("d", [8, 7], 32)).text != a


@settings(max_examples=30, deadline=None)
@given(
    shared=st.integers(0, 4),
    tail=st.lists(st.integers(100, 10**9), min_size=1, max_size=3, unique=True),
    bt=st.sampled_from([1, 16, 64]),
)
def test_shared_block_prefix_is_a_shared_text_prefix_of_exact_size(
    tokenizer: Tokenizer, builder: PromptBuilder, shared: int, tail: list[int], bt: int
) -> None:
    head = list(range(1, shared + 1))
    one = builder.build(block_request("x", [*head, *tail], bt * (shared + len(tail)), bt)).text
    two = builder.build(block_request("y", [*head, 99], bt * (shared + 1), bt)).text
    prefix = builder.build(block_request("z", head, bt * shared, bt)).text if head else ""
    assert one.startswith(prefix) and two.startswith(prefix)
    assert one[len(prefix) :].split()[0] != two[len(prefix) :].split()[0] or bt == 1
    # one-token words: each block is exactly block_tokens tokens, so blocks line up
    assert len(tokenizer.encode(one)) == bt * (shared + len(tail))
    assert len(tokenizer.encode(prefix)) == bt * shared


def test_partial_last_block_is_the_start_of_the_full_block(builder: PromptBuilder) -> None:
    full = builder.build(block_request("f", [5, 6], 32)).text
    partial = builder.build(block_request("p", [5, 6], 21)).text
    assert full.startswith(partial) and len(partial.split()) == 21


def test_token_level_requests_are_detokenized(tokenizer: Tokenizer, builder: PromptBuilder) -> None:
    sentence = "The harbour master logged each vessel by name, tonnage and draught."
    ids = np.array(tokenizer.encode(sentence), dtype=np.int32)
    request = Request("t", 0.0, len(ids), 4, 16, token_ids=ids)
    assert builder.build(request).text == sentence


def test_session_turns_become_chat_history(tokenizer: Tokenizer) -> None:
    builder = PromptBuilder(tokenizer, seed=0)
    workload = open_workload("builtin:chat:sessions=3,turns=3,think_s=2,duration_s=20", seed=3)
    turns: dict[str, list[tuple[Request, tuple[tuple[str, str], ...]]]] = {}
    for request in workload:
        turns.setdefault(str(request.session_id), []).append(
            (request, builder.build(request).messages)
        )
    assert max(len(session) for session in turns.values()) >= 3
    for session in turns.values():
        for k, (_request, messages) in enumerate(session):
            assert [role for role, _ in messages] == ["user", "assistant"] * k + ["user"]
            if k:
                previous, before = session[k - 1]
                assert messages[: len(before)] == before  # the history is resent verbatim
                # the assistant turn is the trace's output of the turn before, as text
                answer = len(tokenizer.encode(messages[len(before)][1]))
                assert abs(answer - previous.output_tokens) <= previous.output_tokens // 4 + 2


def test_a_turn_that_does_not_extend_the_last_is_one_message(builder: PromptBuilder) -> None:
    first = block_request("s1", [1, 2, 3], 48, session_id="s")
    shorter = block_request("s2", [1, 2], 32, session_id="s")
    assert len(builder.build(first).messages) == 1
    assert len(builder.build(shorter).messages) == 1


def test_token_ids_of_a_token_level_request_are_its_own(builder: PromptBuilder) -> None:
    ids = np.arange(1000, 1040, dtype=np.int32)
    request = Request("t", 0.0, 37, 8, 16, token_ids=ids)
    prompt = builder.token_ids(request)
    assert prompt.messages == () and prompt.token_ids == tuple(range(1000, 1037))


def test_token_ids_of_blocks_are_the_tokens_of_their_text(
    tokenizer: Tokenizer, builder: PromptBuilder
) -> None:
    a = builder.token_ids(block_request("a", [7, 8, 9], 40))
    b = builder.token_ids(block_request("b", [7, 8, 5], 40))
    assert a.token_ids is not None and b.token_ids is not None
    assert len(a.token_ids) == 40
    assert a.token_ids[:32] == b.token_ids[:32] and a.token_ids[32:] != b.token_ids[32:]
    text = builder.build(block_request("a", [7, 8, 9], 40)).text
    assert list(a.token_ids) == tokenizer.encode(text, add_special_tokens=False)


def test_synthetic_ids_become_one_word_each(tokenizer: Tokenizer) -> None:
    """A built-in workload's random ids as words: the text re-tokenizes to exactly the
    request's count, the same id gives the same word (a shared prefix stays shared), and ids
    one pool apart do not collide."""
    builder = PromptBuilder(tokenizer, seed=0, ids_as_words=True)
    workload = open_workload("builtin:chat:sessions=4,turns=3,think_s=1,duration_s=10", seed=5)
    requests = list(workload)
    for request in requests:
        text = builder.build(request).text
        assert len(tokenizer.encode(text, add_special_tokens=False)) == request.prompt_tokens
        assert all(w.isalpha() and w.islower() for w in text.split())
    a, b = requests[0], requests[1]
    assert a.token_ids is not None and b.token_ids is not None
    pairs = zip(a.token_ids, b.token_ids, strict=False)  # prompts of two lengths
    shared = next(i for i, (x, y) in enumerate(pairs) if x != y)
    ta, tb = (builder.span(r, 0, r.prompt_tokens).split(" ")[1:] for r in (a, b))
    assert ta[:shared] == tb[:shared] and ta[shared] != tb[shared]
    n = len(builder.words)
    assert builder.id_words([1000]) != builder.id_words([1000 + n])
    assert builder.id_words([1000]) != PromptBuilder(tokenizer, 1, True).id_words([1000])
    # a real token trace's ids are still its text
    ids = np.array(tokenizer.encode("The harbour master logged it."), dtype=np.int32)
    real = Request("t", 0.0, len(ids), 4, 16, token_ids=ids)
    assert PromptBuilder(tokenizer, seed=0).build(real).text == "The harbour master logged it."
