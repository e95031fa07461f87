"""A Hugging Face ``tokenizers`` backend rebuilt from a GGUF's ``tokenizer.ggml.*`` metadata.

Built the way transformers' GGUF converter builds a byte-level ("gpt2") vocabulary: a BPE model
over the file's tokens and merges (no continuing-subword prefix or end-of-word suffix), a
ByteLevel decoder, control tokens (type 3) added whole as special tokens, user-defined ones
(type 4) as plain added tokens. The pre-tokenizer follows ``tokenizer.ggml.pre``, as llama.cpp
does: SmolLM2's "smollm" splits digits one by one before the GPT-2 pattern, as its tokenizer.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from kvtide.errors import ConfigError
from kvtide.text.gguf_metadata import Value

# llama.cpp's token types
_CONTROL, _USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level(add_prefix_space: bool) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def pre_tokenizer_for(pre_type: str, add_prefix_space: bool) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer for a ``tokenizer.ggml.pre`` name; ConfigError for one we do not know
    (guessing would give ids the model was not trained on)."""
    if pre_type in ("default", "gpt-2", "gpt2"):
        return _byte_level(add_prefix_space)
    if pre_type == "smollm":
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), _byte_level(add_prefix_space)]
        )
    if pre_type in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx"):
        return _split_then_bytes(_LLAMA3_SPLIT)
    if pre_type in ("qwen2", "deepseek-r1-qwen"):
        return _split_then_bytes(_QWEN2_SPLIT)
    raise ConfigError(
        f"GGUF tokenizer.ggml.pre {pre_type!r} is not supported "
        "(default, gpt-2, smollm, llama-bpe, qwen2); give a tokenizer.json directory instead"
    )


@cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (Radford et al., 2019)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _strings(metadata: Mapping[str, Value], key: str) -> list[str]:
    value = metadata.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"GGUF metadata {key} is missing or not a list of strings")
    return [str(v) for v in value]


def _int(metadata: Mapping[str, Value], key: str) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"GGUF metadata {key} is not an integer")
    return value


def build_backend(metadata: Mapping[str, Value]) -> tuple[Backend, dict[str, str]]:
    """The backend and the special tokens by role (``bos_token``, ``eos_token``, ...)."""
    model = metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ConfigError(
            f"GGUF tokenizer.ggml.model {model!r} is not supported (only byte-level BPE, 'gpt2')"
        )
    tokens = _strings(metadata, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _strings(metadata, "tokenizer.ggml.merges")]
    raw_types = metadata.get("tokenizer.ggml.token_type", [])
    types = [int(t) for t in raw_types] if isinstance(raw_types, list) else []  # type: ignore[arg-type]
    alphabet = set(bytes_to_unicode().values())
    spelling = bytes_to_unicode()
    # A token outside the byte alphabet is respelled byte by byte, as transformers does.
    vocab = {
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
        for i, t in enumerate(tokens)
    }
    bpe = models.BPE(
        vocab=vocab,
        merges=[(m[0], m[1]) for m in merges if len(m) == 2],
        dropout=None,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
    )
    backend = Backend(bpe)
    add_prefix_space = bool(metadata.get("tokenizer.ggml.add_space_prefix", False))
    pre_type = str(metadata.get("tokenizer.ggml.pre", "default"))
    backend.pre_tokenizer = pre_tokenizer_for(pre_type, add_prefix_space)
    backend.decoder = decoders.ByteLevel()
    # A control token spelled outside the byte alphabet is a llama.cpp mislabel: skipped.
    control = [
        AddedToken(t, special=True, normalized=False)
        for t, kind in zip(tokens, types, strict=False)
        if kind == _CONTROL and set(t) <= alphabet
    ]
    backend.add_special_tokens(control)
    backend.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, kind in zip(tokens, types, strict=False)
            if kind == _USER_DEFINED
        ]
    )
    special: dict[str, str] = {}
    for role, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        token_id = _int(metadata, f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            if not 0 <= token_id < len(tokens):
                raise ConfigError(f"GGUF tokenizer.ggml.{key}_token_id {token_id} is out of range")
            special[f"{role}_token"] = tokens[token_id]
    if metadata.get("tokenizer.ggml.add_bos_token") is True and "bos_token" in special:
        bos = special["bos_token"]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab.get(bos, 0))]
        )
    return backend, special
