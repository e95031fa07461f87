"""The GGUF header reader and the tokenizer rebuilt from it, on small files written here."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from kvtide.errors import ConfigError
from kvtide.text import Tokenizer
from kvtide.text.gguf_metadata import read_gguf_metadata
from kvtide.text.gguf_tokenizer import build_backend, bytes_to_unicode

_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}  # fmt: skip


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def _value(kind: int, value: Any) -> bytes:
    if kind == 8:
        return _string(value)
    if kind == 9:
        item_kind, items = value
        return struct.pack("<IQ", item_kind, len(items)) + b"".join(
            _value(item_kind, v) for v in items
        )
    return struct.pack(_FORMATS[kind], value)


def write_gguf(path: Path, entries: list[tuple[str, int, Any]], version: int = 3) -> Path:
    """A GGUF with metadata only, written byte by byte from the format spec (ggml docs/gguf.md)."""
    body = b"GGUF" + struct.pack("<IQQ", version, 0, len(entries))
    for key, kind, value in entries:
        body += _string(key) + struct.pack("<I", kind) + _value(kind, value)
    path.write_bytes(body)
    return path


def test_reads_every_value_type(tmp_path: Path) -> None:
    entries = [
        ("u8", 0, 250), ("i8", 1, -5), ("u16", 2, 65000), ("i16", 3, -300), ("u32", 4, 4_000_000),
        ("i32", 5, -70_000), ("f32", 6, 0.5), ("bool", 7, True), ("str", 8, "héllo"),
        ("u64", 10, 2**40), ("i64", 11, -(2**40)), ("f64", 12, 1e-300),
        ("strs", 9, (8, ["a", "", "東"])), ("ints", 9, (5, [1, -2, 3])),
        ("nested", 9, (9, [(4, [7]), (4, [])])),
    ]  # fmt: skip
    meta = read_gguf_metadata(write_gguf(tmp_path / "m.gguf", entries))
    assert meta == {
        "u8": 250, "i8": -5, "u16": 65000, "i16": -300, "u32": 4_000_000, "i32": -70_000,
        "f32": 0.5, "bool": True, "str": "héllo", "u64": 2**40, "i64": -(2**40), "f64": 1e-300,
        "strs": ["a", "", "東"], "ints": [1, -2, 3], "nested": [[7], []],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", "cannot read GGUF"),
        (b"GGML\x03\x00\x00\x00", "not a GGUF file"),
        (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "version 1"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _string("k"), "ends early"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _string("k") + struct.pack("<I", 99), "type 99"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 500) + b"k", "past the end"),
    ],
)
def test_bad_files_are_one_config_error(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=match):
        read_gguf_metadata(path)
    with pytest.raises(ConfigError, match="cannot read GGUF"):
        read_gguf_metadata(tmp_path / "missing.gguf")


def tiny_vocab(**extra: Any) -> dict[str, Any]:
    """Every byte, two merges, a control token and a user-defined one."""
    alphabet = list(bytes_to_unicode().values())
    tokens = [*alphabet, "he", "hel", "<|end|>", "<think>"]
    types = [1] * (len(alphabet) + 2) + [3, 4]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": ["h e", "he l"],
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.eos_token_id": len(tokens) - 2,
        **extra,
    }


def test_tokenizer_from_a_tiny_gguf(tmp_path: Path) -> None:
    meta = tiny_vocab(**{"tokenizer.chat_template": "{{ messages[0]['content'] }}{{ eos_token }}"})
    kinds = {str: 8, int: 4}
    entries = [
        (k, 9, (kinds[type(v[0])], v)) if isinstance(v, list) else (k, kinds[type(v)], v)
        for k, v in meta.items()
    ]
    tok = Tokenizer.from_gguf(write_gguf(tmp_path / "tiny.gguf", entries))
    assert tok.name == "tiny"
    ids = tok.encode("help<|end|><think>12")
    assert [tok.id_to_token(i) for i in ids] == ["hel", "p", "<|end|>", "<think>", "1", "2"]
    assert tok.decode(ids, skip_special_tokens=True) == "help<think>12"
    assert tok.eos_token_id == tok.token_to_id("<|end|>")
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi<|end|>"
    assert tok.vocab_size == 256 + 4


def test_add_bos_token_prepends_bos_only_with_special_tokens() -> None:
    meta = tiny_vocab(
        **{"tokenizer.ggml.bos_token_id": 256 + 2, "tokenizer.ggml.add_bos_token": True}
    )
    backend, special = build_backend(meta)
    assert special["bos_token"] == "<|end|>"
    assert backend.encode("h").ids == [258, backend.token_to_id("h")]
    assert backend.encode("h", add_special_tokens=False).ids == [backend.token_to_id("h")]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"tokenizer.ggml.model": "llama"}, "model 'llama' is not supported"),
        ({"tokenizer.ggml.pre": "mystery"}, "pre 'mystery' is not supported"),
        ({"tokenizer.ggml.tokens": [1, 2]}, "tokens is missing or not a list of strings"),
        ({"tokenizer.ggml.eos_token_id": 10**6}, "out of range"),
        ({"tokenizer.ggml.eos_token_id": "2"}, "not an integer"),
    ],
)
def test_unsupported_gguf_tokenizers_are_config_errors(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_backend(tiny_vocab(**change))
