"""A llama-architecture decoder in plain PyTorch (RMSNorm, RoPE, GQA, SwiGLU), float32.

Weights use GGUF tensor names and layout. llama.cpp's converter permutes Q and K so that RoPE
rotates adjacent pairs (its "normal" rope), so this model rotates adjacent pairs too.
The forward pass takes the KV of a cached prefix and returns the KV of the tokens it computed,
so the caller decides where KV lives (paged blocks, a request's tail, host or disk).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_positions: int = 8192
    tie_embeddings: bool = True

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """Bytes of K and V of one token across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    @property
    def num_params(self) -> int:
        attn = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        layer = attn + mlp + 2 * self.hidden_size
        head = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        embed = self.vocab_size * self.hidden_size
        return self.num_layers * layer + embed + head + self.hidden_size  # + final norm


class PastKV(Protocol):
    """The KV of a cached prefix, read one layer at a time: (keys, values), each
    [num_kv_heads, num_tokens, head_dim], RoPE already applied to the keys."""

    @property
    def num_tokens(self) -> int: ...

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True, slots=True)
class ContiguousKV:
    """PastKV over one tensor [num_layers, 2, num_kv_heads, num_tokens, head_dim]."""

    kv: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.kv.shape[3])

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv[index, 0], self.kv[index, 1]


@dataclass(frozen=True, slots=True)
class ForwardOutput:
    logits: torch.Tensor
    """[num_positions, vocab_size] for the positions asked for (the last one by default)."""
    kv: torch.Tensor
    """[num_layers, 2, num_kv_heads, num_new_tokens, head_dim] of the tokens just computed."""


class LlamaModel:
    """Inference-only llama decoder over a dict of GGUF-named float32 tensors."""

    def __init__(
        self,
        config: LlamaConfig,
        weights: Mapping[str, torch.Tensor],
        device: torch.device | str = "cpu",
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self._w = {name: t.to(self.device, torch.float32) for name, t in weights.items()}
        self._output = self._w["token_embd.weight" if config.tie_embeddings else "output.weight"]
        half = config.head_dim // 2
        exponent = torch.arange(half, dtype=torch.float64) * 2.0 / config.head_dim
        self._inv_freq = (1.0 / (config.rope_theta**exponent)).to(self.device)

    @classmethod
    def random(cls, config: LlamaConfig, seed: int = 0, device: str = "cpu") -> LlamaModel:
        """Random weights of the same shapes as a real checkpoint; for fast tests."""
        gen = torch.Generator().manual_seed(seed)
        c = config

        def normal(*shape: int, std: float = 0.02) -> torch.Tensor:
            return torch.randn(*shape, generator=gen) * std

        def norm_weight() -> torch.Tensor:
            return 1.0 + normal(c.hidden_size, std=0.1)

        weights = {"token_embd.weight": normal(c.vocab_size, c.hidden_size, std=1.0)}
        for i in range(c.num_layers):
            p = f"blk.{i}."
            weights[p + "attn_norm.weight"] = norm_weight()
            weights[p + "ffn_norm.weight"] = norm_weight()
            weights[p + "attn_q.weight"] = normal(c.num_heads * c.head_dim, c.hidden_size, std=0.2)
            kv_rows = c.num_kv_heads * c.head_dim
            weights[p + "attn_k.weight"] = normal(kv_rows, c.hidden_size, std=0.2)
            weights[p + "attn_v.weight"] = normal(kv_rows, c.hidden_size, std=0.2)
            weights[p + "attn_output.weight"] = normal(c.hidden_size, c.num_heads * c.head_dim)
            weights[p + "ffn_gate.weight"] = normal(c.intermediate_size, c.hidden_size, std=0.1)
            weights[p + "ffn_up.weight"] = normal(c.intermediate_size, c.hidden_size, std=0.1)
            weights[p + "ffn_down.weight"] = normal(c.hidden_size, c.intermediate_size, std=0.1)
        weights["output_norm.weight"] = norm_weight()
        if not c.tie_embeddings:
            weights["output.weight"] = normal(c.vocab_size, c.hidden_size)
        return cls(config, weights, device)

    def forward(
        self,
        token_ids: torch.Tensor | list[int],
        past: PastKV | None = None,
        all_logits: bool = False,
    ) -> ForwardOutput:
        """Computes ``token_ids`` at positions following ``past``; causal over past and new."""
        with torch.inference_mode():
            return self._forward(token_ids, past, all_logits)

    def _forward(
        self, token_ids: torch.Tensor | list[int], past: PastKV | None, all_logits: bool
    ) -> ForwardOutput:
        c = self.config
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.device)
        num_new = int(ids.shape[0])
        start = past.num_tokens if past is not None else 0
        if num_new == 0:
            raise ValueError("forward needs at least one new token")
        cos, sin = self._rope(start, num_new)
        mask = None
        if start > 0 and num_new > 1:
            rows = torch.arange(num_new, device=self.device).unsqueeze(1) + start
            mask = torch.arange(start + num_new, device=self.device).unsqueeze(0) <= rows
        x = F.embedding(ids, self._w["token_embd.weight"])
        new_kv = torch.empty(
            c.num_layers, 2, c.num_kv_heads, num_new, c.head_dim, device=self.device
        )
        for i in range(c.num_layers):
            p = f"blk.{i}."
            h = self._rms_norm(x, self._w[p + "attn_norm.weight"])
            q = (h @ self._w[p + "attn_q.weight"].T).view(num_new, c.num_heads, c.head_dim)
            k = (h @ self._w[p + "attn_k.weight"].T).view(num_new, c.num_kv_heads, c.head_dim)
            v = (h @ self._w[p + "attn_v.weight"].T).view(num_new, c.num_kv_heads, c.head_dim)
            q = _apply_rope(q, cos, sin).transpose(0, 1)
            new_kv[i, 0] = _apply_rope(k, cos, sin).transpose(0, 1)
            new_kv[i, 1] = v.transpose(0, 1)
            keys, values = new_kv[i, 0], new_kv[i, 1]
            if past is not None and start > 0:
                past_k, past_v = past.layer(i)
                keys = torch.cat((past_k, keys), dim=1)
                values = torch.cat((past_v, values), dim=1)
            # 4-D inputs take PyTorch's fused CPU kernel; 3-D ones fall back to the math path.
            attn = F.scaled_dot_product_attention(
                q.unsqueeze(0),
                keys.unsqueeze(0),
                values.unsqueeze(0),
                attn_mask=mask,
                is_causal=start == 0 and num_new > 1,
                scale=1.0 / math.sqrt(c.head_dim),
                enable_gqa=c.num_heads != c.num_kv_heads,
            )
            attn = attn[0].transpose(0, 1).reshape(num_new, -1)
            x = x + attn @ self._w[p + "attn_output.weight"].T
            h = self._rms_norm(x, self._w[p + "ffn_norm.weight"])
            gate = F.silu(h @ self._w[p + "ffn_gate.weight"].T)
            up = h @ self._w[p + "ffn_up.weight"].T
            x = x + (gate * up) @ self._w[p + "ffn_down.weight"].T
        last = x if all_logits else x[-1:]
        logits = self._rms_norm(last, self._w["output_norm.weight"]) @ self._output.T
        return ForwardOutput(logits=logits, kv=new_kv)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.config.rms_norm_eps) * weight

    def _rope(self, start: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(start, start + num_tokens, dtype=torch.float64, device=self.device)
        angles = torch.outer(positions, self._inv_freq)
        return angles.cos().float().unsqueeze(1), angles.sin().float().unsqueeze(1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates adjacent pairs (x[2i], x[2i+1]) of [tokens, heads, head_dim] by position angles."""
    pairs = x.view(*x.shape[:-1], -1, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2)
