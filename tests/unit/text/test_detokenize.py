"""The incremental detokenizer against decoding the whole sequence (the reference it
replaces): the pieces joined are the whole text, however the characters' bytes fall across
tokens, special tokens skipped."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.text import Tokenizer, load_tokenizer
from kvtide.text.detokenize import IncrementalDetokenizer
from kvtide.text.gguf_tokenizer import bytes_to_unicode


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_tokenizer("smollm2")


TEXTS = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60
) | st.sampled_from(["naïve café 東京 🚀🚀 ok", "  spaces\n\nand\ttabs", "ÀÁÂ" * 5, ""])


@settings(max_examples=150, deadline=None)
@given(text=TEXTS, special=st.integers(0, 3))
def test_the_pieces_are_the_whole_decode(tok: Tokenizer, text: str, special: int) -> None:
    ids = [int(i) for i in tok.encode_ids(text)]
    eos = tok.eos_token_id
    assert eos is not None
    ids = ids[: len(ids) // 2] + [eos] * special + ids[len(ids) // 2 :]  # skipped wherever
    d = IncrementalDetokenizer(tok)
    pieces = [d.add(i) for i in ids]
    whole = tok.decode(ids, skip_special_tokens=True)
    assert "".join(pieces) + d.rest() == whole
    for n in range(len(ids) + 1):  # and at every step, a prefix of the text so far
        assert whole.startswith("".join(pieces[:n]))


def test_a_character_split_across_tokens_waits_for_its_last_byte(tok: Tokenizer) -> None:
    text = "🚀"  # its four bytes as four byte-level tokens
    split = [_byte_token(tok, b) for b in text.encode()]
    d = IncrementalDetokenizer(tok)
    assert [d.add(i) for i in split] == ["", "", "", text]
    cut = IncrementalDetokenizer(tok)  # the sequence ends before its last byte
    assert [cut.add(i) for i in split[:3]] == ["", "", ""]
    assert cut.rest() == tok.decode(split[:3]) != ""


def _byte_token(tok: Tokenizer, byte: int) -> int:
    """The id of the byte-level token standing for ``byte``."""
    found = tok.token_to_id(bytes_to_unicode()[byte])
    assert found is not None
    return found
