"""kvtide.text.Tokenizer against transformers on SmolLM2's GGUF: the same ids, text and prompts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.errors import ConfigError
from kvtide.text import Tokenizer

CORPUS = [
    "",
    "Hello, world!",
    "It's 2024 and pi is 3.14159; 1,000,000 x 12 = 12000000",
    "a  b\n\nc   d\t\t e  ",
    "   leading spaces",
    "trailing spaces   ",
    "\n\n\n\r\n\r\n",
    "café naïve façade Straße 東京 서울 Москва القاهرة",
    "def f(x: int) -> int:\n    return x**2  # squared\n\n\nclass A:\n\tpass\n",
    '{"key": [1, 2.5e-3, null], "k2": "v\\n"}',
    "🙂👍🏽 emoji 🇫🇷 and ZWJ 👩‍👩‍👧",
    "don't 'quoted' I'LL we've you'd they're",
    "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>",
    "half-<|im_start|> special",
    "\u00a0nbsp \u3000ideographic\u200bzero-width",
    "½ ² ٣ Ⅻ numbers of other kinds",
    "x" * 300 + " " * 50 + "y",
]

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.mark.parametrize("text", CORPUS)
def test_same_ids_and_text_as_transformers(smol: Tokenizer, hf_smol: Any, text: str) -> None:
    ids = smol.encode(text)
    assert ids == hf_smol.encode(text, add_special_tokens=False)
    assert smol.decode(ids) == hf_smol.decode(ids) == text
    assert smol.decode(ids, skip_special_tokens=True) == hf_smol.decode(
        ids, skip_special_tokens=True
    )


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_any_text_encodes_like_transformers(smol: Tokenizer, hf_smol: Any, text: str) -> None:
    ids = smol.encode(text)
    assert ids == hf_smol.encode(text, add_special_tokens=False)
    assert smol.decode(ids) == hf_smol.decode(ids)


def test_transformers_gguf_fallback_differs_only_on_spaced_unicode_numbers(
    smol: Tokenizer, hf_gguf: Any
) -> None:
    differ = [t for t in CORPUS if smol.encode(t) != hf_gguf.encode(t, add_special_tokens=False)]
    assert differ == ["½ ² ٣ Ⅻ numbers of other kinds"]
    # SmolLM2's pre-tokenizer (and llama.cpp's "smollm") splits every \p{N} off first
    pieces = [p for p, _ in smol.backend.pre_tokenizer.pre_tokenize_str(" ²")]
    assert pieces == ["Ġ", "Â²"]
    assert smol.encode("x 2024") == hf_gguf.encode("x 2024", add_special_tokens=False)


CHATS = [
    FRANCE,
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Name 3 colours 🙂"},
    ],
]


@pytest.mark.parametrize("messages", CHATS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_renders_like_transformers(
    smol: Tokenizer, hf_smol: Any, messages: list[dict[str, str]], add_generation_prompt: bool
) -> None:
    text = smol.apply_chat_template(messages, add_generation_prompt)
    ids = smol.apply_chat_template(messages, add_generation_prompt, tokenize=True)
    expected = hf_smol.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    assert text == expected
    assert ids == hf_smol.encode(expected, add_special_tokens=False)


def test_smollm2_facts(smol: Tokenizer) -> None:
    # ids as Hugging Face tokenizers gives them over SmolLM2-135M-Instruct's own tokenizer.json
    assert smol.apply_chat_template(FRANCE, tokenize=True) == [
        1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
        407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1,
        520, 9531, 198,
    ]  # fmt: skip
    assert smol.vocab_size == 49152
    assert smol.eos_token_id == smol.token_to_id("<|im_end|>") == 2
    assert smol.bos_token_id == 1
    assert smol.id_to_token(2) == "<|im_end|>"
    # digits one by one (SmolLM2's pre-tokenizer), a space before them stays its own token
    assert [smol.id_to_token(i) for i in smol.encode("in 2024")] == ["in", "Ġ", "2", "0", "2", "4"]
    assert smol.encode_batch(["a b", "c"]) == [smol.encode("a b"), smol.encode("c")]


def test_text_imports_no_torch() -> None:
    code = (
        "import sys; from kvtide.text import smollm2, find_smollm2_gguf\n"
        "if find_smollm2_gguf(): assert smollm2().encode('hi')\n"
        "assert 'torch' not in sys.modules and 'kvtide.tensors' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def write_dir(root: Path, smol: Tokenizer, config: dict[str, Any]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    smol.backend.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
    "{% if loop.index > 5 %}{% break %}{% endif %}"
    "[{{ m['role'] }}] {{ m['content'] | tojson }}{{ eos_token }}\n"
    "{% endfor %}\n   {% if add_generation_prompt %}[assistant]{% endif %}"
)


def test_from_dir_renders_like_transformers(tmp_path: Path, smol: Tokenizer) -> None:
    transformers = pytest.importorskip("transformers")
    config = {
        "chat_template": TEMPLATE,
        "bos_token": {"__type": "AddedToken", "content": "<|im_start|>", "special": True},
        "eos_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    root = write_dir(tmp_path / "tok", smol, config)
    ours = Tokenizer.from_dir(root)
    theirs = transformers.AutoTokenizer.from_pretrained(str(root))
    messages = [{"role": "user", "content": 'a <b> & "c" é'}] * 7
    for gen in (True, False):
        expected = theirs.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
        assert ours.apply_chat_template(messages, gen) == expected
    assert ours.eos_token_id == 0
    assert ours.encode("hello 12") == theirs.encode("hello 12")
    with pytest.raises(ConfigError, match="no tools here"):
        ours.apply_chat_template([{"role": "tool", "content": "x"}])


def test_from_dir_reads_a_jinja_file_and_named_templates(tmp_path: Path, smol: Tokenizer) -> None:
    root = write_dir(
        tmp_path / "a", smol, {"chat_template": [{"name": "default", "template": "D"}]}
    )
    assert Tokenizer.from_dir(root).apply_chat_template([]) == "D"
    (root / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert Tokenizer.load(root).apply_chat_template(FRANCE) == "J1"
    bare = write_dir(tmp_path / "b", smol, {})
    with pytest.raises(ConfigError, match="no chat template"):
        Tokenizer.from_dir(bare).apply_chat_template(FRANCE)


@pytest.mark.parametrize(
    ("files", "match"),
    [
        ({}, "no tokenizer.json"),
        ({"tokenizer.json": "{not json"}, "cannot load"),
        ({"tokenizer.json": None, "tokenizer_config.json": "[1]"}, "expected a JSON object"),
        ({"tokenizer.json": None, "tokenizer_config.json": '{"chat_template": 3}'}, "neither"),
        (
            {"tokenizer.json": None, "tokenizer_config.json": '{"chat_template": "{% if %}"}'},
            "line 1",
        ),
    ],
)
def test_from_dir_bad_input_is_one_config_error(
    tmp_path: Path, smol: Tokenizer, files: dict[str, str | None], match: str
) -> None:
    for name, content in files.items():
        if content is None:
            smol.backend.save(str(tmp_path / name))
        else:
            (tmp_path / name).write_text(content)
    with pytest.raises(ConfigError, match=match):
        Tokenizer.from_dir(tmp_path)


def test_load_tokenizer_reads_a_flag_the_same_everywhere(tmp_path: Path, smol: Tokenizer) -> None:
    """``kvtide serve``, ``engine`` and ``load`` name a tokenizer the same way: ``smollm2`` or
    nothing for SmolLM2's, else a directory or a GGUF; a wrong path is one ConfigError that
    lists all three."""
    from kvtide.text import load_tokenizer

    assert load_tokenizer("smollm2") is load_tokenizer(None) is smol
    root = write_dir(tmp_path / "tok", smol, {"chat_template": TEMPLATE})
    from_dir = load_tokenizer(str(root))
    assert from_dir is not smol and from_dir.encode("hello 12") == smol.encode("hello 12")
    with pytest.raises(ConfigError, match=r"nope: no tokenizer.json \(.*or smollm2\)"):
        load_tokenizer(tmp_path / "nope")
