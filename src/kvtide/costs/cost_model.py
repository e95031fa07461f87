"""The cost model: prefill, decode and KV transfer times in seconds, from specs and coefficients.

Prefill is compute-bound (matmul FLOPs plus attention FLOPs that grow with context), decode is
memory-bound (weights plus KV read per step), and a transfer pays a fixed overhead, a latency per
chunk and its bytes over the link's usable rate. Onboarding a cached prefix is modelled layer by
layer: layer l's KV arrives while layer l-1 computes (LMCache's layer-wise loading, vLLM's KV
connector `wait_for_layer_load`), which is what lets a split reload/recompute overlap.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from typing import TYPE_CHECKING

from kvtide.costs.onboard import OnboardDecision, decide_onboard
from kvtide.costs.specs import AttentionKind, GpuSpec, ModelSpec, kv_dtype_bytes
from kvtide.errors import ConfigError, UsageError
from kvtide.types import Tier

if TYPE_CHECKING:
    from collections.abc import Mapping


@dataclass(frozen=True, slots=True)
class Coefficients:
    """The factors that turn FLOPs and bytes into seconds.

    Defaults are stated assumptions, not measurements: `kvtide calibrate` and
    ``bench/gpu_tiers.py`` replace them with fitted values.
    """

    prefill_efficiency: float = 0.5
    """Fraction of dense BF16 peak reached by prefill matmuls (model FLOPs utilisation)."""
    attention_coefficient: float = 1.0
    """Seconds per attention FLOP relative to a matmul FLOP (FlashAttention runs below GEMM
    throughput, so fits usually land above 1)."""
    iteration_overhead_s: float = 0.002
    """Fixed cost of one engine step: scheduling, input preparation, kernel launches."""
    memory_efficiency: float = 0.8
    """Fraction of peak HBM bandwidth a decode step reaches."""
    host_link_efficiency: float = 0.8
    """Fraction of the PCIe payload rate a large pinned copy reaches. PEERS.md measured one H100
    at 35/63 host-to-GPU and 53/63 GPU-to-host; `bench/gpu_tiers.py` measures it."""
    host_transfer_overhead_s: float = 20e-6
    """Once per host transfer: stream synchronisation and bookkeeping."""
    host_chunk_latency_s: float = 2e-6
    """Per copied chunk (one cudaMemcpyAsync): at 50 GB/s a chunk reaches half the link rate
    at 100 KB, in line with PEERS.md's "transfers under ~1 MiB lose efficiency"."""
    disk_efficiency: float = 0.85
    """Fraction of the drive's sequential read rate reached by chunked KV reads."""
    disk_transfer_overhead_s: float = 100e-6
    """Once per disk transfer: about one NVMe read latency before data flows."""
    disk_chunk_latency_s: float = 10e-6
    """Per chunk read from disk with many reads in flight (submission and completion)."""
    chunk_tokens: int = 256
    """Tokens per stored KV chunk (LMCache's default chunk size). One layer of one chunk is
    one copy, since layer-wise onboarding moves each layer separately."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"coefficient {f.name} must be a number")
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"coefficient {f.name} must be finite and >= 0, got {value}")
        for name in ("prefill_efficiency", "memory_efficiency", "host_link_efficiency"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"coefficient {name} must be > 0")
        if self.disk_efficiency <= 0:
            raise ConfigError("coefficient disk_efficiency must be > 0")
        if not isinstance(self.chunk_tokens, int) or self.chunk_tokens < 1:
            raise ConfigError("coefficient chunk_tokens must be an integer >= 1")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object], *, origin: str = "coefficients") -> Coefficients:
        """Builds coefficients from a mapping; missing keys keep their defaults."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{origin}: unknown coefficient {unknown[0]!r}")
        values: dict[str, float] = {}
        for key, value in data.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{origin}: coefficient {key!r} must be a number")
            values[key] = value
        if "chunk_tokens" in values:
            chunk = values["chunk_tokens"]
            if chunk != int(chunk):
                raise ConfigError(f"{origin}: coefficient 'chunk_tokens' must be an integer")
            values["chunk_tokens"] = int(chunk)
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class _Link:
    bytes_per_s: float
    overhead_s: float
    chunk_latency_s: float


@dataclass(frozen=True)
class CostModel:
    """Times in seconds for one model served on ``tp`` GPUs of one kind.

    Byte counts passed in and returned are logical: the whole model's KV, all tensor-parallel
    ranks together. Internally each rank moves its own shard over its own link, in parallel.
    Immutable; derived constants are cached on first use (hence no ``slots``).
    """

    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1
    dtype: str = "bf16"
    """The KV-cache dtype (weights stay in the model's own format)."""
    coefficients: Coefficients = field(default_factory=Coefficients)

    def __post_init__(self) -> None:
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ConfigError(f"tensor-parallel degree must be an integer >= 1, got {self.tp!r}")
        if self.model.num_heads % self.tp:
            raise ConfigError(
                f"tensor-parallel degree {self.tp} does not divide the "
                f"{self.model.num_heads} attention heads of {self.model.name}"
            )
        kv_dtype_bytes(self.dtype)

    # --- KV sizes -------------------------------------------------------------------------

    @cached_property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one token adds, whole model."""
        return self.model.kv_bytes_per_token(self.dtype)

    def kv_bytes(self, tokens: int) -> int:
        """KV bytes of ``tokens`` tokens, whole model."""
        _check_count("tokens", tokens)
        return tokens * self.kv_bytes_per_token

    @cached_property
    def num_kv_shards(self) -> int:
        """Ranks that each hold a distinct slice of the KV.

        GQA shards KV heads across ranks (replicating them when tp exceeds the KV heads); MLA's
        latent is shared by all heads, so every rank holds all of it.
        """
        if self.model.attention is AttentionKind.MLA:
            return 1
        return min(self.tp, self.model.num_kv_heads)

    @cached_property
    def chunk_bytes_per_rank(self) -> float:
        """Bytes of one copy: one layer of one chunk of ``chunk_tokens`` tokens, on one rank."""
        per_layer = self.kv_bytes_per_token / self.model.num_layers / self.num_kv_shards
        return self.coefficients.chunk_tokens * per_layer

    # --- compute --------------------------------------------------------------------------

    @cached_property
    def _flops_per_s(self) -> float:
        return self.gpu.bf16_flops_per_s * self.tp * self.coefficients.prefill_efficiency

    @cached_property
    def _flops_per_token(self) -> float:
        return 2.0 * self.model.matmul_params

    @cached_property
    def _flops_per_pair(self) -> float:
        return float(self.model.attention_flops_per_pair)

    def linear_flops(self, new_tokens: int) -> float:
        """Matmul FLOPs of prefilling ``new_tokens`` tokens: 2 · matmul params · tokens."""
        return self._flops_per_token * new_tokens

    def attention_flops(self, new_tokens: int, cached_tokens: int) -> float:
        """Causal attention FLOPs of ``new_tokens`` tokens after ``cached_tokens`` cached ones.

        Token i (1-based over the whole context) attends to i keys, so the new tokens form
        n·p + n(n+1)/2 (query, key) pairs.
        """
        n, p = new_tokens, cached_tokens
        return self._flops_per_pair * (n * p + n * (n + 1) / 2)

    def prefill_time(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Seconds to prefill ``new_tokens`` tokens whose first ``cached_tokens`` of context are
        already in GPU memory; 0 when there is nothing to compute.

        One iteration overhead plus a roofline: the slower of `prefill_compute_time` and
        `prefill_memory_time`. Long prefills are compute-bound; a few tokens are memory-bound
        (every weight is read once whatever the token count).
        """
        _check_count("new_tokens", new_tokens)
        _check_count("cached_tokens", cached_tokens)
        if new_tokens == 0:
            return 0.0
        return self.coefficients.iteration_overhead_s + max(
            self.prefill_compute_time(new_tokens, cached_tokens),
            self.prefill_memory_time(new_tokens, cached_tokens),
        )

    def prefill_compute_time(self, new_tokens: int, cached_tokens: int) -> float:
        """(linear FLOPs + attention coefficient · attention FLOPs) / (tp · peak · efficiency).

        Tensor-parallel all-reduce time is not modelled separately; calibration folds it into
        the efficiency.
        """
        c = self.coefficients
        flops = self.linear_flops(new_tokens) + c.attention_coefficient * self.attention_flops(
            new_tokens, cached_tokens
        )
        return flops / self._flops_per_s

    def prefill_memory_time(self, new_tokens: int, cached_tokens: int) -> float:
        """Weights the tokens touch plus the context's KV, read once from HBM, per rank."""
        if self.model.num_experts:
            weights = self.model.weight_bytes_read(new_tokens) / self.tp
        else:
            weights = self._dense_weight_bytes_per_rank
        kv = (cached_tokens + new_tokens) * self.kv_bytes_per_token / self.num_kv_shards
        return (weights + kv) / self._hbm_bytes_per_s

    @cached_property
    def _dense_weight_bytes_per_rank(self) -> float:
        return self.model.weight_bytes_read(1) / self.tp

    @cached_property
    def _hbm_bytes_per_s(self) -> float:
        return self.gpu.hbm_bytes_per_s * self.coefficients.memory_efficiency

    def prefill_tokens_per_s(self, prompt_tokens: int = 4096) -> float:
        """Prefill throughput of one ``prompt_tokens``-token prompt from scratch, tokens/s."""
        if prompt_tokens < 1:
            raise UsageError("prompt_tokens must be >= 1")
        return prompt_tokens / self.prefill_time(prompt_tokens)

    def decode_step_time(self, batch: int, context_tokens: int) -> float:
        """Seconds of one decode step of ``batch`` sequences of ``context_tokens`` tokens each.

        A roofline: the slower of reading weights plus KV from HBM and doing the step's FLOPs,
        plus one iteration overhead. Small batches are memory-bound.
        """
        if batch < 1:
            raise UsageError("batch must be >= 1")
        _check_count("context_tokens", context_tokens)
        c = self.coefficients
        weights = self.model.weight_bytes_read(batch) / self.tp
        kv = batch * context_tokens * self.kv_bytes_per_token / self.num_kv_shards
        memory_s = (weights + kv) / (self.gpu.hbm_bytes_per_s * c.memory_efficiency)
        flops = batch * (
            self.linear_flops(1) + c.attention_coefficient * self.attention_flops(1, context_tokens)
        )
        return c.iteration_overhead_s + max(memory_s, flops / self._flops_per_s)

    # --- transfers ------------------------------------------------------------------------

    def _link(self, tier: Tier, to_device: bool) -> _Link:
        try:
            return self._links[(tier, to_device)]
        except KeyError:
            raise ConfigError(f"no link for tier {tier.name}") from None

    @cached_property
    def _links(self) -> dict[tuple[Tier, bool], _Link]:
        return {
            (tier, to_device): self._make_link(tier, to_device)
            for tier in (Tier.HOST, Tier.DISK)
            for to_device in (True, False)
        }

    def _make_link(self, tier: Tier, to_device: bool) -> _Link:
        c, gpu = self.coefficients, self.gpu
        pcie = gpu.host_to_device_bytes_per_s if to_device else gpu.device_to_host_bytes_per_s
        host_rate = pcie * c.host_link_efficiency
        if tier is Tier.HOST:
            return _Link(host_rate, c.host_transfer_overhead_s, c.host_chunk_latency_s)
        # Disk data crosses the drive and then PCIe, pipelined: the slower one sets the rate.
        rate = min(gpu.nvme_bytes_per_s * c.disk_efficiency, host_rate)
        return _Link(rate, c.disk_transfer_overhead_s, c.disk_chunk_latency_s)

    def link_bytes_per_s(
        self, tier: Tier, link_load: float = 0.0, *, to_device: bool = True
    ) -> float:
        """Usable logical KV bytes per second the tier delivers now, all ranks together."""
        _check_load(link_load)
        if tier is Tier.DEVICE:
            return math.inf
        return self._link(tier, to_device).bytes_per_s * (1.0 - link_load) * self.num_kv_shards

    def transfer_time(
        self, num_bytes: float, tier: Tier, link_load: float = 0.0, *, to_device: bool = True
    ) -> float:
        """Seconds to move ``num_bytes`` logical KV bytes between ``tier`` and the GPUs.

        Per rank: overhead + chunk latency · copies + bytes / usable rate, where copies =
        max(layers, bytes / chunk bytes) (each layer of each chunk is one copy) and
        usable rate = peak · efficiency · (1 − link_load). ``link_load`` is the fraction of
        the link already in use (1.0 gives infinity). The DEVICE tier costs nothing.
        """
        _check_load(link_load)
        if num_bytes < 0 or not math.isfinite(num_bytes):
            raise UsageError(f"num_bytes must be finite and >= 0, got {num_bytes}")
        if num_bytes == 0 or tier is Tier.DEVICE:
            return 0.0
        if link_load >= 1.0:
            return math.inf
        link = self._link(tier, to_device)
        per_rank = num_bytes / self.num_kv_shards
        return (
            link.overhead_s
            + link.chunk_latency_s * self._num_copies(per_rank)
            + per_rank / (link.bytes_per_s * (1.0 - link_load))
        )

    def _num_copies(self, per_rank_bytes: float) -> float:
        # One copy per layer per chunk, so at least one per layer; fractional chunks count
        # pro rata, which keeps the time continuous and piecewise linear in the bytes.
        return max(float(self.model.num_layers), per_rank_bytes / self.chunk_bytes_per_rank)

    def transfer_fixed_time(self, num_bytes: float, tier: Tier, *, to_device: bool = True) -> float:
        """The part of `transfer_time` that does not depend on the link rate (overhead and
        chunk latencies), used to solve for break-even bandwidths."""
        if num_bytes <= 0 or tier is Tier.DEVICE:
            return 0.0
        link = self._link(tier, to_device)
        per_rank = num_bytes / self.num_kv_shards
        return link.overhead_s + link.chunk_latency_s * self._num_copies(per_rank)

    # --- onboarding -----------------------------------------------------------------------

    def onboard_time(
        self,
        cached_tokens: int,
        reload_tokens: int,
        new_tokens: int,
        tier: Tier,
        link_load: float = 0.0,
    ) -> float:
        """Seconds until a request's KV is resident and its prompt prefilled, when its first
        ``cached_tokens`` tokens sit in ``tier``: the first ``reload_tokens`` of them are
        reloaded, the rest and the ``new_tokens`` computed.

        Loading and computing overlap layer by layer over L layers, so the plan takes
        max(load, compute) + min(load, compute) / L (one layer of the faster stream is not
        hidden). reload_tokens = 0 is a full recompute; = cached_tokens a full reload.
        """
        if not 0 <= reload_tokens <= cached_tokens:
            raise UsageError("reload_tokens must lie in [0, cached_tokens]")
        load_s = self.transfer_time(self.kv_bytes(reload_tokens), tier, link_load)
        compute_s = self.prefill_time(cached_tokens - reload_tokens + new_tokens, reload_tokens)
        if load_s == 0.0 or compute_s == 0.0:
            return load_s + compute_s
        return max(load_s, compute_s) + min(load_s, compute_s) / self.model.num_layers

    def decide_onboard(
        self,
        cached_tokens_in_tier: int,
        tier: Tier,
        new_tokens: int = 0,
        link_load: float = 0.0,
        *,
        block_tokens: int = 1,
        with_break_even: bool = True,
    ) -> OnboardDecision:
        """Reload, recompute or split for a prefix hit in ``tier``; see `kvtide.costs.onboard`."""
        return decide_onboard(
            self,
            cached_tokens_in_tier,
            tier,
            new_tokens,
            link_load,
            block_tokens=block_tokens,
            with_break_even=with_break_even,
        )


def network_transfer_s(model: CostModel, tokens: int) -> float:
    """Seconds to ship ``tokens`` tokens of KV between two instances over their NICs (each
    tensor-parallel rank sends its shard over its own NIC share, in parallel): the simulator's
    cross-replica fetches and hand-offs, and the emulated engine's disaggregated-prefill loads."""
    return model.kv_bytes(tokens) / (model.gpu.network_bytes_per_s * model.tp)


def _check_count(name: str, value: int) -> None:
    if not value >= 0:  # NaN too
        raise UsageError(f"{name} must be >= 0, got {value}")


def _check_load(link_load: float) -> None:
    if not 0.0 <= link_load <= 1.0:
        raise ConfigError(f"link load must lie in [0, 1], got {link_load}")
