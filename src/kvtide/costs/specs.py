"""Model and GPU specs: the shapes and vendor numbers the cost model turns into seconds.

A ModelSpec comes from a preset (`model_preset`) or a Hugging Face ``config.json``
(`ModelSpec.from_hf_config`); a GpuSpec comes from a preset (`gpu_preset`). All rates are per GPU,
in bytes or FLOPs per second.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvtide.errors import ConfigError

KvDtype = Literal["bf16", "fp8"]

KV_DTYPE_BYTES: Mapping[str, int] = {"bf16": 2, "fp8": 1}
"""Bytes per KV element for each supported KV-cache dtype."""


def kv_dtype_bytes(dtype: str) -> int:
    """Bytes per KV element of ``dtype``; ConfigError naming the valid dtypes otherwise."""
    try:
        return KV_DTYPE_BYTES[dtype]
    except KeyError:
        raise ConfigError(
            f"unknown KV dtype {dtype!r}; valid: {', '.join(sorted(KV_DTYPE_BYTES))}"
        ) from None


class AttentionKind(enum.Enum):
    """How a model stores its KV cache."""

    GQA = "gqa"
    """Multi-head or grouped-query attention: a K and a V vector per KV head, per layer."""
    MLA = "mla"
    """Multi-head latent attention (DeepSeek-V2/V3): one compressed latent plus a shared RoPE key
    per layer, the same for every head, so tensor parallelism replicates it instead of sharding."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The shape of a decoder-only transformer, as the cost model needs it.

    ``head_dim`` is the query/key head dimension (for MLA: nope + rope dims) and ``v_head_dim``
    the value head dimension. ``num_params`` counts every weight; ``num_active_params`` those one
    token touches (they differ for mixture-of-experts models). ``num_embedding_params`` counts
    the input embedding and the output head (once when tied).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    intermediate_size: int
    vocab_size: int
    num_params: int
    num_active_params: int
    num_embedding_params: int
    attention: AttentionKind = AttentionKind.GQA
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    num_experts: int = 0
    num_experts_per_token: int = 0
    weight_bytes_per_param: float = 2.0

    def __post_init__(self) -> None:
        for field_name in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "v_head_dim",
            "intermediate_size",
            "vocab_size",
            "num_params",
            "num_active_params",
        ):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model {self.name!r}: {field_name} must be a positive integer")
        if self.num_active_params > self.num_params:
            raise ConfigError(f"model {self.name!r}: more active parameters than parameters")
        if not 0 <= self.num_embedding_params < self.num_active_params:
            raise ConfigError(f"model {self.name!r}: embedding parameters out of range")
        if self.attention is AttentionKind.MLA and self.kv_lora_rank <= 0:
            raise ConfigError(f"model {self.name!r}: MLA needs a positive kv_lora_rank")
        if self.num_experts and not 0 < self.num_experts_per_token <= self.num_experts:
            raise ConfigError(f"model {self.name!r}: experts per token out of range")
        if self.weight_bytes_per_param <= 0:
            raise ConfigError(f"model {self.name!r}: weight_bytes_per_param must be positive")

    def kv_elements_per_token(self) -> int:
        """KV-cache elements one token adds, summed over layers (not yet times the dtype size)."""
        if self.attention is AttentionKind.MLA:
            # DeepSeek-V2 §2.1.2: the cache keeps c_KV (kv_lora_rank) and k_R (rope dim) per layer.
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype: str = "bf16") -> int:
        """KV-cache bytes one token adds across all layers, for the whole model (all TP ranks)."""
        return self.kv_elements_per_token() * kv_dtype_bytes(dtype)

    @property
    def matmul_params(self) -> int:
        """Active parameters that do a matmul per prompt token.

        The input embedding is a lookup, and engines compute logits for the last prompt token
        only, so both embedding matrices drop out of the per-token prefill FLOPs.
        """
        return self.num_active_params - self.num_embedding_params

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query token, key token) pair over all layers: QK^T plus PV."""
        return 2 * self.num_layers * self.num_heads * (self.head_dim + self.v_head_dim)

    def weight_bytes_read(self, batch: int) -> float:
        """Weight bytes one forward pass over ``batch`` tokens reads from HBM (whole model).

        Every weight is read once, except an untied input embedding, of which only the looked-up
        rows are read (counted as none). A mixture-of-experts pass reads the shared weights and
        each routed expert that at least one token picks; with uniform routing of k of E experts,
        the expected number touched is E·(1 − (1 − k/E)^batch).
        """
        untied_input = self.num_embedding_params - self.vocab_size * self.hidden_size
        read = float(self.num_params - untied_input)
        if self.num_experts:
            e, k = self.num_experts, self.num_experts_per_token
            per_expert = (self.num_params - self.num_active_params) / (e - k) if e > k else 0.0
            touched = e * (1.0 - (1.0 - k / e) ** batch)
            read -= (e - touched) * per_expert
        return read * self.weight_bytes_per_param

    @classmethod
    def from_hf_config(
        cls, source: str | Path | Mapping[str, object], *, name: str | None = None
    ) -> ModelSpec:
        """Reads a Hugging Face ``config.json`` (a path, a folder holding one, or its dict).

        Knows the llama, mistral, qwen2 and deepseek_v3 key sets; parameter counts are derived
        from the shapes (embeddings, attention incl. Qwen2's QKV bias, SwiGLU MLP or MoE, norms).
        """
        if isinstance(source, Mapping):
            config, origin = source, name or "config"
        else:
            config, origin = _read_config(Path(source))
        return _spec_from_config(config, name or _config_name(config, origin), origin)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU and its links, as a vendor datasheet states them (per GPU, per direction).

    Rates are peaks; the cost model's coefficients say what fraction of them is reached.
    """

    name: str
    bf16_flops_per_s: float
    """Dense (no sparsity) BF16 tensor-core FLOP/s."""
    hbm_bytes_per_s: float
    host_to_device_bytes_per_s: float
    device_to_host_bytes_per_s: float
    nvme_bytes_per_s: float
    """The local NVMe read rate available to this GPU (its share of the node's drives)."""
    network_bytes_per_s: float
    """The RDMA NIC rate available to this GPU."""
    memory_bytes: float | None = None
    """Device memory (HBM or GDDR) as the datasheet states it; ``None``: unknown, so nothing
    checks that weights and KV fit."""

    def __post_init__(self) -> None:
        for field_name in (
            "bf16_flops_per_s",
            "hbm_bytes_per_s",
            "host_to_device_bytes_per_s",
            "device_to_host_bytes_per_s",
            "nvme_bytes_per_s",
            "network_bytes_per_s",
        ):
            value = getattr(self, field_name)
            if not isinstance(value, int | float) or not value > 0 or value == float("inf"):
                raise ConfigError(f"gpu {self.name!r}: {field_name} must be a positive number")
        memory = self.memory_bytes
        if memory is not None and not (isinstance(memory, int | float) and 0 < memory < 1e15):
            raise ConfigError(f"gpu {self.name!r}: memory_bytes must be a positive number")


# PCIe payload rate per direction of an x16 link: lanes × GT/s × 128b/130b encoding / 8 bits.
# Gen4: 16 × 16 × 128/130 / 8 = 31.5 GB/s; Gen5: 63.0 GB/s (PCI-SIG base specs 4.0 and 5.0;
# NVIDIA datasheets round them to "64 GB/s" and "128 GB/s" bidirectional).
_PCIE4_X16 = 16 * 16e9 * 128 / 130 / 8
_PCIE5_X16 = 16 * 32e9 * 128 / 130 / 8
# One PCIe Gen4 x4 data drive per GPU, as in DGX A100/H100 (8 U.2 NVMe drives for 8 GPUs);
# such drives read sequentially at about 7 GB/s (e.g. Samsung PM1733: 7,000 MB/s).
_NVME_PER_GPU = 7.0e9
# ConnectX-7 at 400 Gb/s per GPU (DGX H100/H200 datasheets); ConnectX-6 at 200 Gb/s (DGX A100).
_NIC_400G = 400e9 / 8
_NIC_200G = 200e9 / 8

GPU_PRESETS: Mapping[str, GpuSpec] = {
    # NVIDIA H100 SXM5 datasheet: BF16 1,979 TFLOPS with 2:4 sparsity (989.4 dense), HBM3 3.35 TB/s.
    # Memory: 80 GB (HBM3), as for the A100 80GB, A800 and H800 below; H200 141 GB; L40S 48 GB.
    "h100": GpuSpec(
        "h100", 989.4e12, 3.35e12, _PCIE5_X16, _PCIE5_X16, _NVME_PER_GPU, _NIC_400G, 80e9
    ),
    # NVIDIA H200 SXM datasheet: same GH100 compute as H100, HBM3e 4.8 TB/s.
    "h200": GpuSpec(
        "h200", 989.4e12, 4.8e12, _PCIE5_X16, _PCIE5_X16, _NVME_PER_GPU, _NIC_400G, 141e9
    ),
    # NVIDIA A100 80GB SXM4 datasheet: BF16 312 TFLOPS dense, HBM2e 2,039 GB/s, PCIe Gen4.
    "a100": GpuSpec(
        "a100", 312e12, 2.039e12, _PCIE4_X16, _PCIE4_X16, _NVME_PER_GPU, _NIC_200G, 80e9
    ),
    # A800 80GB SXM4: the A100 with NVLink cut to 400 GB/s; compute and HBM unchanged.
    # Network: Mooncake's A800 nodes (FAST'25 §8) carry 4 × 200 Gb/s RDMA NICs for 8 GPUs.
    "a800": GpuSpec(
        "a800", 312e12, 2.039e12, _PCIE4_X16, _PCIE4_X16, _NVME_PER_GPU, 4 * _NIC_200G / 8, 80e9
    ),
    # H800 SXM5: the H100 with NVLink cut to 400 GB/s; compute and HBM3 3.35 TB/s unchanged.
    "h800": GpuSpec(
        "h800", 989.4e12, 3.35e12, _PCIE5_X16, _PCIE5_X16, _NVME_PER_GPU, _NIC_400G, 80e9
    ),
    # NVIDIA L40S datasheet: BF16 362.05 TFLOPS dense (733 sparse), GDDR6 864 GB/s, PCIe Gen4 x16.
    # No NVLink; the NIC share per GPU is an assumption (200 Gb/s), not a datasheet value.
    "l40s": GpuSpec(
        "l40s", 362.05e12, 864e9, _PCIE4_X16, _PCIE4_X16, _NVME_PER_GPU, _NIC_200G, 48e9
    ),
}

# Hugging Face config.json values of the published checkpoints (meta-llama/Meta-Llama-3-8B,
# meta-llama/Meta-Llama-3-70B, Qwen/Qwen2.5-7B, Qwen/Qwen2.5-72B, deepseek-ai/DeepSeek-V3).
MODEL_PRESETS: Mapping[str, Mapping[str, object]] = {
    "llama-3-8b": {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    },
    "llama-3-70b": {
        "model_type": "llama",
        "num_hidden_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "intermediate_size": 28672,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    },
    "qwen2.5-7b": {
        "model_type": "qwen2",
        "num_hidden_layers": 28,
        "hidden_size": 3584,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
    "qwen2.5-72b": {
        "model_type": "qwen2",
        "num_hidden_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "intermediate_size": 29568,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
    "deepseek-v3": {
        "model_type": "deepseek_v3",
        "num_hidden_layers": 61,
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "vocab_size": 129280,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
        "tie_word_embeddings": False,
        # The released checkpoint is FP8 (e4m3) with 128×128 block scales.
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"},
    },
}


def model_preset(name: str) -> ModelSpec:
    """The preset model ``name``; ConfigError listing the valid names otherwise."""
    try:
        config = MODEL_PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown model {name!r}; valid: {', '.join(sorted(MODEL_PRESETS))}"
        ) from None
    return ModelSpec.from_hf_config(config, name=name)


def gpu_preset(name: str) -> GpuSpec:
    """The preset GPU ``name``; ConfigError listing the valid names otherwise."""
    try:
        return GPU_PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown gpu {name!r}; valid: {', '.join(sorted(GPU_PRESETS))}"
        ) from None


def resolve_model(name_or_path: str) -> ModelSpec:
    """A preset name, or a path to a ``config.json`` (or a folder holding one)."""
    if name_or_path in MODEL_PRESETS:
        return model_preset(name_or_path)
    path = Path(name_or_path)
    if path.suffix == ".json" or path.is_dir():
        return ModelSpec.from_hf_config(path)
    raise ConfigError(
        f"unknown model {name_or_path!r}; valid: {', '.join(sorted(MODEL_PRESETS))}, "
        "or a path to a Hugging Face config.json"
    )


def _read_config(path: Path) -> tuple[Mapping[str, object], str]:
    file = path / "config.json" if path.is_dir() else path
    try:
        loaded = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{file}: not valid JSON: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"{file}: expected a JSON object")
    return loaded, str(file)


def _config_name(config: Mapping[str, object], origin: str) -> str:
    name = config.get("_name_or_path")
    if isinstance(name, str) and name:
        return name
    return Path(origin).parent.name or origin


class _Keys:
    """Typed access to a config dict; every failure names the file and the key."""

    def __init__(self, config: Mapping[str, object], origin: str) -> None:
        self._config = config
        self._origin = origin

    def get_int(self, key: str, default: int | None = None) -> int:
        value = self._config.get(key, default)
        if value is None:
            raise ConfigError(f"{self._origin}: missing {key!r}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{self._origin}: {key!r} must be a non-negative integer")
        return value

    def get_optional_int(self, key: str) -> int | None:
        return None if self._config.get(key) is None else self.get_int(key)

    def get_bool(self, key: str, default: bool) -> bool:
        value = self._config.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self._origin}: {key!r} must be true or false")
        return value


def _spec_from_config(config: Mapping[str, object], name: str, origin: str) -> ModelSpec:
    keys = _Keys(config, origin)
    model_type = config.get("model_type", "llama")
    layers = keys.get_int("num_hidden_layers")
    hidden = keys.get_int("hidden_size")
    heads = keys.get_int("num_attention_heads")
    vocab = keys.get_int("vocab_size")
    intermediate = keys.get_int("intermediate_size")
    if heads == 0 or hidden == 0 or layers == 0:
        raise ConfigError(f"{origin}: layers, hidden size and heads must be positive")
    tied = keys.get_bool("tie_word_embeddings", False)
    embedding = vocab * hidden * (1 if tied else 2)
    norms = hidden  # the final norm

    if "kv_lora_rank" in config:
        return _mla_spec(keys, config, name, origin, layers, hidden, heads, vocab, embedding)

    kv_heads = keys.get_int("num_key_value_heads", heads)
    head_dim = keys.get_int("head_dim", hidden // heads)
    # Qwen2 always has a bias on q, k and v; llama-family configs say so in attention_bias.
    qkv_bias = model_type == "qwen2" or keys.get_bool("attention_bias", False)
    mlp_bias = keys.get_bool("mlp_bias", False)
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    attention = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden
    if qkv_bias:
        attention += q_dim + 2 * kv_dim
    mlp = 3 * hidden * intermediate + (2 * intermediate + hidden if mlp_bias else 0)
    per_layer = attention + mlp + 2 * hidden  # two RMSNorms
    total = embedding + norms + layers * per_layer
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        num_params=total,
        num_active_params=total,
        num_embedding_params=embedding,
    )


def _mla_spec(
    keys: _Keys,
    config: Mapping[str, object],
    name: str,
    origin: str,
    layers: int,
    hidden: int,
    heads: int,
    vocab: int,
    embedding: int,
) -> ModelSpec:
    """DeepSeek-V2/V3: MLA attention and DeepSeekMoE (routed plus shared experts)."""
    kv_rank = keys.get_int("kv_lora_rank")
    q_rank = keys.get_optional_int("q_lora_rank")
    rope = keys.get_int("qk_rope_head_dim")
    nope = keys.get_int("qk_nope_head_dim")
    v_dim = keys.get_int("v_head_dim")
    qk_dim = nope + rope
    if q_rank:
        q_proj = hidden * q_rank + q_rank + q_rank * heads * qk_dim  # down, norm, up
    else:
        q_proj = hidden * heads * qk_dim
    attention = (
        q_proj
        + hidden * (kv_rank + rope)  # kv_a_proj_with_mqa
        + kv_rank  # kv_a_layernorm
        + kv_rank * heads * (nope + v_dim)  # kv_b_proj
        + heads * v_dim * hidden  # o_proj
    )
    dense_mlp = 3 * hidden * keys.get_int("intermediate_size")
    experts = keys.get_int("n_routed_experts", 0)
    shared = keys.get_int("n_shared_experts", 0)
    per_token = keys.get_int("num_experts_per_tok", 0)
    expert = 3 * hidden * keys.get_int("moe_intermediate_size", 0)
    first_dense = keys.get_int("first_k_dense_replace", 0)
    freq = max(1, keys.get_int("moe_layer_freq", 1))
    num_moe = sum(1 for i in range(layers) if experts and i >= first_dense and i % freq == 0)
    router = hidden * experts + experts  # gate weight and its score-correction bias
    moe_total = router + (experts + shared) * expert
    moe_active = router + (per_token + shared) * expert
    base = embedding + hidden + layers * (attention + 2 * hidden)
    dense_part = (layers - num_moe) * dense_mlp
    quant = config.get("quantization_config")
    is_fp8 = isinstance(quant, Mapping) and quant.get("quant_method") == "fp8"
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=keys.get_int("num_key_value_heads", heads),
        head_dim=qk_dim,
        v_head_dim=v_dim,
        intermediate_size=keys.get_int("intermediate_size"),
        vocab_size=vocab,
        num_params=base + dense_part + num_moe * moe_total,
        num_active_params=base + dense_part + num_moe * moe_active,
        num_embedding_params=embedding,
        attention=AttentionKind.MLA,
        kv_lora_rank=kv_rank,
        qk_rope_head_dim=rope,
        num_experts=experts if num_moe else 0,
        num_experts_per_token=per_token if num_moe else 0,
        weight_bytes_per_param=1.0 if is_fp8 else 2.0,
    )
