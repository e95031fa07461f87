"""Whether a model and its KV cache fit the GPUs that serve it: weights and KV per GPU against
the GPU's memory, at the tensor-parallel degree chosen (activations are not counted, so a
fit here is necessary, not sufficient)."""

from __future__ import annotations

from dataclasses import dataclass

from kvtide.costs.cost_model import CostModel


@dataclass(frozen=True, slots=True)
class MemoryFit:
    """Bytes per GPU: the weights' share, the KV pool's share, and the GPU's memory."""

    model: str
    gpu: str
    tp: int
    weight_bytes: float
    kv_bytes: float
    kv_tokens: int
    memory_bytes: float | None
    """``None`` when the GPU spec does not state its memory: then everything "fits"."""

    @property
    def weights_fit(self) -> bool:
        return self.memory_bytes is None or self.weight_bytes <= self.memory_bytes

    @property
    def fits(self) -> bool:
        return self.memory_bytes is None or self.weight_bytes + self.kv_bytes <= self.memory_bytes

    @property
    def max_kv_tokens(self) -> int:
        """The most KV tokens the memory left after the weights holds (0 if none is left)."""
        if self.memory_bytes is None:
            return 0
        spare = max(0.0, self.memory_bytes - self.weight_bytes)
        return int(spare / (self.kv_bytes / self.kv_tokens)) if self.kv_tokens else 0

    def describe(self) -> str:
        """One sentence: what needs how much of which memory."""
        memory = "unknown" if self.memory_bytes is None else f"{self.memory_bytes / 1e9:,.0f} GB"
        need = f"weights {self.weight_bytes / 1e9:,.1f} GB"
        if self.kv_tokens:
            need += f" + {self.kv_tokens:,} KV tokens {self.kv_bytes / 1e9:,.1f} GB"
        return f"{self.model} on {self.tp} × {self.gpu} needs {need} per GPU; each has {memory}"


def memory_fit(cost: CostModel, kv_tokens: int) -> MemoryFit:
    """Per GPU: every weight split over the ``tp`` ranks, and ``kv_tokens`` of KV split over
    the ranks that each hold a distinct slice of it (MLA's latent sits on every rank)."""
    model = cost.model
    return MemoryFit(
        model=model.name,
        gpu=cost.gpu.name,
        tp=cost.tp,
        weight_bytes=model.num_params * model.weight_bytes_per_param / cost.tp,
        kv_bytes=kv_tokens * cost.kv_bytes_per_token / cost.num_kv_shards,
        kv_tokens=kv_tokens,
        memory_bytes=cost.gpu.memory_bytes,
    )
