"""The chunk memo (``text.chunk_memo``): the same ids as Hugging Face for any text sharing any
opening with texts seen before, hits where texts share chunks, and its bounds."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.text import Tokenizer
from kvtide.text.chunk_memo import ChunkMemo

from .test_fast_bpe import FRAGMENTS, hf_ids, random_texts


def memo_of(tok: Tokenizer) -> ChunkMemo:
    assert tok.memo is not None, "SmolLM2's fast encoder cuts"
    return tok.memo


@pytest.fixture
def memoized(smol: Tokenizer) -> Tokenizer:
    return smol.with_chunk_memo(max_tokens=50_000)


def prose(rng: random.Random, words: int) -> str:
    vocab = ["harbour", "vessel", "tonnage", "draught", "the", "of", "logged", "3.14", "don't"]
    out = []
    for _ in range(words):
        word = rng.choice(vocab)
        out.append(rng.choice([" ", " ", " ", "\n", "  ", ", ", ". "]) + word)
    return "".join(out)


def test_the_copy_has_the_memo_and_the_original_does_not(smol: Tokenizer) -> None:
    twin = smol.with_chunk_memo()
    assert twin.memo is not None and smol.memo is None
    assert twin.backend is smol.backend and twin.fast is smol.fast


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(FRAGMENTS), min_size=20, max_size=400).map("".join),
    st.sampled_from([8, 32, 256]),
    st.lists(
        st.tuples(st.floats(0.0, 1.0), st.lists(st.sampled_from(FRAGMENTS), max_size=300)),
        min_size=1,
        max_size=4,
    ),
)
def test_texts_sharing_openings_get_the_ids_hugging_face_gives(
    smol: Tokenizer, base: str, chunk_chars: int, variants: list[tuple[float, list[str]]]
) -> None:
    """Differential: texts that open with any share of one base text (every fragment kind:
    whitespace runs, specials, other scripts, bytes the vocabulary lacks), through one memo
    of small chunks (many cuts in short texts), twice (so the doorkeeper lets chunks in and
    later texts hit them)."""
    tok = smol.with_chunk_memo(max_tokens=20_000, chunk_chars=chunk_chars)
    texts = [base[: int(len(base) * share)] + "".join(rest) for share, rest in variants]
    for _ in range(2):
        for text in [base, *texts]:
            want = hf_ids(smol, text)
            assert tok.encode_ids(text, add_special_tokens=False).tolist() == want
            assert tok.encode_ids(text).tolist() == hf_ids(smol, text, True)


def test_a_shared_opening_is_encoded_once_it_was_seen_twice(memoized: Tokenizer) -> None:
    rng = random.Random(1)
    preamble = prose(rng, 1500)
    memo = memo_of(memoized)
    questions = [prose(rng, 40) for _ in range(4)]
    for q in questions[:2]:  # first sighting: the doorkeeper; second: stored
        memoized.encode_ids(preamble + q, add_special_tokens=False)
    assert memo.hits == 0 and len(memo) > 0
    misses = memo.misses
    for q in questions[2:]:
        assert memoized.encode_ids(preamble + q, False).tolist() == hf_ids(memoized, preamble + q)
    # of the preamble's chunks, only the one the question ends in is encoded again
    assert memo.hits >= 2 * (len(preamble) // memo.chunk_chars - 1)
    assert memo.misses - misses <= 2 * 2


def test_a_scope_sees_only_the_chunks_stored_in_it(memoized: Tokenizer) -> None:
    """A server sets the scope per request (its tenant): another tenant's text is neither
    answered from the memo nor counted as its second sighting."""
    rng = random.Random(3)
    preamble = prose(rng, 1500)
    memo = memo_of(memoized)
    memo.scope = 1
    for _ in range(2):
        memoized.encode_ids(preamble + prose(rng, 40), add_special_tokens=False)
    stored = len(memo)
    assert stored > 0
    memo.scope = 2
    text = preamble + prose(rng, 40)
    hits = memo.hits
    assert memoized.encode_ids(text, False).tolist() == hf_ids(memoized, text)
    assert memo.hits == hits and len(memo) == stored  # a first sighting in this scope
    memo.scope = 1
    memoized.encode_ids(preamble + prose(rng, 40), add_special_tokens=False)
    assert memo.hits > hits


def test_one_off_texts_are_not_kept(memoized: Tokenizer) -> None:
    rng = random.Random(2)
    memo = memo_of(memoized)
    for _ in range(20):
        memoized.encode_ids(prose(rng, 800), False)
    assert len(memo) == 0 and memo.tokens == 0 and memo.misses > 20


def test_the_memo_holds_at_most_its_tokens(smol: Tokenizer) -> None:
    tok = smol.with_chunk_memo(max_tokens=2_000)
    memo = memo_of(tok)
    rng = random.Random(3)
    for _ in range(30):
        text = prose(rng, 900)
        for _ in range(2):
            tok.encode_ids(text, False)
            assert memo.tokens <= 2_000
    assert memo.tokens == sum(len(ids) for ids in memo._entries.values()) > 0


def test_a_short_text_takes_no_chunk(memoized: Tokenizer) -> None:
    memo = memo_of(memoized)
    text = prose(random.Random(4), 100)
    assert len(text) < 2 * memo.chunk_chars
    memoized.encode_ids(text, False)
    assert memo.hits == memo.misses == 0


def test_heads_through_the_memo_are_the_heads_without_it(
    smol: Tokenizer, memoized: Tokenizer
) -> None:
    """``encode_head`` takes its pieces from the memo: the same head, cut and rest."""
    rng = random.Random(5)
    preamble = prose(rng, 1200)
    for text in [preamble + prose(rng, 50) for _ in range(4)] + random_texts(20, seed=6):
        for add in (False, True):
            want = smol.encode_head(text, 256, add)
            got = memoized.encode_head(text, 256, add)
            if want is None:
                assert got is None
                continue
            assert got is not None
            assert got[0].tolist() == want[0].tolist() and got[1] == want[1]
            assert np.concatenate([got[0], got[2]()]).tolist() == hf_ids(smol, text, add)
    assert memo_of(memoized).hits > 0
