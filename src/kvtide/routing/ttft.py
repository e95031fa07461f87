"""Time-to-first-token estimates for routing, in seconds, behind a small protocol.

``kvtide.costs.cost_model.CostModel`` satisfies ``TtftModel`` as it is (same method names and
meanings, checked by mypy below), so the simulator passes its cost model straight in; the
default is the cost model of Llama-3-8B on one H100. ``LinearTtftModel`` is a stand-in with a
constant prefill rate and constant tier bandwidths, for tests and back-of-envelope runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kvtide.costs.cost_model import CostModel
from kvtide.costs.specs import gpu_preset, model_preset
from kvtide.errors import ConfigError
from kvtide.types import Tier


class TtftModel(Protocol):
    def prefill_time(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Seconds to prefill ``new_tokens`` after ``cached_tokens`` already on the device."""
        ...

    def prefill_tokens_per_s(self, prompt_tokens: int = 4096) -> float:
        """Throughput of a ``prompt_tokens`` prefill from scratch, tokens per second."""
        ...

    def onboard_time(
        self,
        cached_tokens: int,
        reload_tokens: int,
        new_tokens: int,
        tier: Tier,
        link_load: float = 0.0,
    ) -> float:
        """Seconds until a prompt is resident when its first ``cached_tokens`` sit in ``tier``
        and the first ``reload_tokens`` of them are copied up (the rest recomputed)."""
        ...


@dataclass(frozen=True, slots=True)
class LinearTtftModel:
    """Prefill at a fixed rate plus a per-step overhead; reloads at a fixed bandwidth.

    Defaults sketch an 8B model (128 KiB of KV per token: 32 layers x 8 KV heads x 128 x 2 x
    bf16) on one H100: ~12k prefill tokens/s, 25 GB/s from host, 5 GB/s from NVMe.
    """

    tokens_per_s: float = 12_000.0
    overhead_s: float = 0.002
    kv_bytes_per_token: int = 131_072
    host_bytes_per_s: float = 25e9
    disk_bytes_per_s: float = 5e9

    def __post_init__(self) -> None:
        if min(self.tokens_per_s, self.host_bytes_per_s, self.disk_bytes_per_s) <= 0:
            raise ConfigError("rates and bandwidths must be positive")

    def prefill_time(self, new_tokens: int, cached_tokens: int = 0) -> float:
        if new_tokens <= 0:
            return 0.0
        return self.overhead_s + new_tokens / self.tokens_per_s

    def prefill_tokens_per_s(self, prompt_tokens: int = 4096) -> float:
        return prompt_tokens / self.prefill_time(prompt_tokens)

    def onboard_time(
        self,
        cached_tokens: int,
        reload_tokens: int,
        new_tokens: int,
        tier: Tier,
        link_load: float = 0.0,
    ) -> float:
        bw = self.host_bytes_per_s if tier is Tier.HOST else self.disk_bytes_per_s
        load_s = 0.0
        if reload_tokens and tier is not Tier.DEVICE:
            load_s = reload_tokens * self.kv_bytes_per_token / (bw * max(1.0 - link_load, 1e-9))
        compute_s = self.prefill_time(cached_tokens - reload_tokens + new_tokens, reload_tokens)
        return max(load_s, compute_s)


def default_ttft_model() -> TtftModel:
    """Llama-3-8B in bf16 on one H100, from kvtide's cost model."""
    return _as_ttft_model(CostModel(model_preset("llama-3-8b"), gpu_preset("h100")))


def _as_ttft_model(model: CostModel) -> TtftModel:
    return model  # mypy checks here that CostModel satisfies the protocol
