"""Reload, recompute or split: what to do with a prefix hit in a lower tier, and why.

`decide_onboard` compares the three plans by the cost model's own times and states two
break-evens: the tier bandwidth at which a full reload ties a recompute, and the prefix length
from which reload pays. `mooncake_break_even_bytes_per_s` is Mooncake's closed form (Qin et al.,
FAST'25 §2.2) for comparison.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from kvtide.costs.specs import AttentionKind, GpuSpec, ModelSpec, kv_dtype_bytes
from kvtide.errors import ConfigError, UsageError
from kvtide.types import Tier

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvtide.costs.cost_model import CostModel

# The prefix break-even is scanned at this many lengths per doubling, up to this many tokens.
_SCAN_STEPS_PER_OCTAVE = 8
_SCAN_MAX_TOKENS = 1 << 22


class OnboardAction(enum.StrEnum):
    RELOAD = "reload"
    """Load the whole cached prefix from the tier."""
    RECOMPUTE = "recompute"
    """Ignore the tier and prefill the whole prompt."""
    SPLIT = "split"
    """Load the first part of the prefix while computing the rest, overlapped layer by layer."""


@dataclass(frozen=True, slots=True)
class OnboardDecision:
    """The chosen plan, the time of every plan, and the break-evens.

    ``time_s`` is the chosen plan's time, the least of ``recompute_s``, ``reload_s`` and
    ``split_s`` (ties go to recompute, then reload). ``split_s`` is the best split that loads
    between 1 and cached − 1 tokens in whole blocks (infinity when there is none).
    """

    action: OnboardAction
    tier: Tier
    cached_tokens: int
    new_tokens: int
    reload_tokens: int
    """Tokens the plan takes from the tier; the rest of the prompt is computed."""
    time_s: float
    recompute_s: float
    reload_s: float
    split_s: float
    split_reload_tokens: int
    link_bytes_per_s: float
    """Usable logical KV bytes/s the tier delivers at the current link load."""
    break_even_bytes_per_s: float | None
    """The usable rate above which a full reload beats recompute (infinity: never at any rate;
    None: nothing to reload). Reload wins exactly when ``link_bytes_per_s`` exceeds it."""
    break_even_prefix_tokens: int | None
    """Reload beats recompute for every cached prefix at least this long, at the current rate
    and load, for this many new tokens (None: not up to 4M tokens, or not computed)."""

    @property
    def compute_tokens(self) -> int:
        """Tokens the plan prefills."""
        return self.cached_tokens - self.reload_tokens + self.new_tokens


def decide_onboard(
    cost: CostModel,
    cached_tokens_in_tier: int,
    tier: Tier,
    new_tokens: int = 0,
    link_load: float = 0.0,
    *,
    block_tokens: int = 1,
    with_break_even: bool = True,
) -> OnboardDecision:
    """Chooses how to bring a request's cached prefix of ``cached_tokens_in_tier`` tokens from
    ``tier`` onto the GPUs, before prefilling its ``new_tokens`` uncached tokens.

    A split reloads a whole number of ``block_tokens`` blocks. The best split is exact under
    the model: the load time grows and the compute time shrinks with the split point k, and
    the plan's time is concave in k between breakpoints (the chunk-size kink, where load and
    compute cross, and where compute turns memory-bound, the last two found by bisection), so
    the optimum is a block next to a breakpoint or an end. ``with_break_even=False`` skips the
    prefix-length scan (the costly part).
    """
    cached, new = cached_tokens_in_tier, new_tokens
    if not (cached >= 0 and new >= 0):
        raise UsageError(
            f"token counts must be >= 0, got cached_tokens_in_tier={cached!r}, new_tokens={new!r}"
        )
    if not block_tokens >= 1:
        raise UsageError(f"block_tokens must be >= 1, got {block_tokens!r}")
    recompute_s = cost.onboard_time(cached, 0, new, tier, link_load)
    reload_s = cost.onboard_time(cached, cached, new, tier, link_load)
    split_k, split_s = _best_split(cost, cached, new, tier, link_load, block_tokens)
    options = [
        (recompute_s, OnboardAction.RECOMPUTE, 0),
        (reload_s, OnboardAction.RELOAD, cached),
        (split_s, OnboardAction.SPLIT, split_k),
    ]
    time_s, action, reload_tokens = min(options, key=lambda option: option[0])
    if cached == 0:
        action, reload_tokens = OnboardAction.RECOMPUTE, 0
    prefix_break_even = (
        break_even_prefix_tokens(cost, tier, new, link_load) if with_break_even else None
    )
    return OnboardDecision(
        action=action,
        tier=tier,
        cached_tokens=cached,
        new_tokens=new,
        reload_tokens=reload_tokens,
        time_s=time_s,
        recompute_s=recompute_s,
        reload_s=reload_s,
        split_s=split_s,
        split_reload_tokens=split_k,
        link_bytes_per_s=cost.link_bytes_per_s(tier, link_load),
        break_even_bytes_per_s=break_even_bytes_per_s(cost, cached, tier, new),
        break_even_prefix_tokens=prefix_break_even,
    )


def _best_split(
    cost: CostModel, cached: int, new: int, tier: Tier, link_load: float, block_tokens: int
) -> tuple[int, float]:
    """The interior split point k, a multiple of ``block_tokens`` in [1, cached − 1], with the
    least onboard time; (0, inf) when there is none."""
    lo, hi = 1, cached - 1
    first, last = block_tokens, (hi // block_tokens) * block_tokens
    if tier is Tier.DEVICE or first > last:
        return 0, math.inf

    def load_s(k: int) -> float:
        return cost.transfer_time(cost.kv_bytes(k), tier, link_load)

    def compute_s(k: int) -> float:
        return cost.prefill_time(cached - k + new, k)

    def flops_bound(k: int) -> bool:
        n = cached - k + new
        return cost.prefill_compute_time(n, k) >= cost.prefill_memory_time(n, k)

    # Where load and compute cross (load rises, compute falls with k), where the compute side
    # leaves the compute-bound part of its roofline, and where the load time kinks (beyond one
    # chunk of tokens the number of copies grows with k).
    cross = _last_true(lambda k: load_s(k) <= compute_s(k), lo, hi)
    roof = _last_true(flops_bound, lo, hi)
    kink = cost.coefficients.chunk_tokens
    candidates: set[int] = set()
    for point in (first, last, cross, cross + 1, roof, roof + 1, kink):
        below = (point // block_tokens) * block_tokens
        candidates.update((below, below + block_tokens))
    best = min(
        (cost.onboard_time(cached, k, new, tier, link_load), k)
        for k in candidates
        if first <= k <= last
    )
    return best[1], best[0]


def _last_true(predicate: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest k in [lo, hi] with predicate(k), for a predicate true then false; lo − 1
    if it is false at lo."""
    if not predicate(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if predicate(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def break_even_bytes_per_s(cost: CostModel, cached: int, tier: Tier, new: int = 0) -> float | None:
    """The usable logical rate (bytes/s, all ranks) at which reloading ``cached`` tokens from
    ``tier`` ties recomputing them; infinity if no rate is enough, None if nothing to reload.

    Solves max(T, Tn) + min(T, Tn)/L = T_full for the load time T, with Tn the prefill of the
    new tokens after the prefix and T_full the whole prompt's, then the rate from
    T = fixed + bytes / rate.
    """
    if cached == 0 or tier is Tier.DEVICE:
        return None
    layers = cost.model.num_layers
    new_s = cost.prefill_time(new, cached)
    full_s = cost.prefill_time(cached + new, 0)
    if full_s <= new_s * (1.0 + 1.0 / layers):
        load_target_s = layers * (full_s - new_s)
    else:
        load_target_s = full_s - new_s / layers
    num_bytes = cost.kv_bytes(cached)
    spare_s = load_target_s - cost.transfer_fixed_time(num_bytes, tier)
    return num_bytes / spare_s if spare_s > 0 else math.inf


@lru_cache(maxsize=4096)
def break_even_prefix_tokens(
    cost: CostModel, tier: Tier, new_tokens: int = 0, link_load: float = 0.0
) -> int | None:
    """The shortest cached prefix from which a full reload beats recompute at every longer
    length (up to 4M tokens), or None if it does not pay at 4M.

    Scanned at 8 lengths per doubling, then bisected inside the last losing step; a losing
    window narrower than one step would be missed.
    """
    if tier is Tier.DEVICE:
        return 1

    def pays(prefix: int) -> bool:
        reload_s = cost.onboard_time(prefix, prefix, new_tokens, tier, link_load)
        return reload_s < cost.onboard_time(prefix, 0, new_tokens, tier, link_load)

    grid = _scan_grid()
    last_losing = max((i for i, p in enumerate(grid) if not pays(p)), default=-1)
    if last_losing == len(grid) - 1:
        return None
    if last_losing < 0:
        return 1
    losing, paying = grid[last_losing], grid[last_losing + 1]
    while paying - losing > 1:
        mid = (losing + paying) // 2
        if pays(mid):
            paying = mid
        else:
            losing = mid
    return paying


@lru_cache(maxsize=1)
def _scan_grid() -> tuple[int, ...]:
    octaves = _SCAN_MAX_TOKENS.bit_length() - 1
    steps = octaves * _SCAN_STEPS_PER_OCTAVE
    return tuple(sorted({round(2 ** (i / _SCAN_STEPS_PER_OCTAVE)) for i in range(steps + 1)}))


def mooncake_break_even_bytes_per_s(
    prefix_tokens: int,
    hidden_size: int,
    gqa_ratio: float,
    flops_per_s: float,
    bytes_per_element: int = 2,
    a: float = 4.0,
    b: float = 22.0,
) -> float:
    """Mooncake's bandwidth above which reusing a ``prefix_tokens`` prefix beats recomputing it.

    Qin et al., FAST'25 §2.2: the prefix costs l·(a·p²·d + b·p·d²) FLOPs to compute and
    p·l·(2·d/gqa)·s bytes to move, so reuse pays when B > G · 2·d·s / (gqa·(a·p·d + b·d²)),
    with G the FLOP/s of the GPUs doing the prefill (a = 4, b = 22 in the paper).
    """
    d, p = hidden_size, prefix_tokens
    return flops_per_s * 2 * d * bytes_per_element / (gqa_ratio * (a * p * d + b * d * d))


def mooncake_break_even_for(
    model: ModelSpec, gpu: GpuSpec, num_gpus: int, prefix_tokens: int, dtype: str = "bf16"
) -> float:
    """`mooncake_break_even_bytes_per_s` for a GQA model on ``num_gpus`` GPUs at dense BF16 peak."""
    if model.attention is not AttentionKind.GQA:
        raise ConfigError("Mooncake's break-even formula assumes GQA attention")
    return mooncake_break_even_bytes_per_s(
        prefix_tokens,
        model.hidden_size,
        model.num_heads / model.num_kv_heads,
        gpu.bf16_flops_per_s * num_gpus,
        kv_dtype_bytes(dtype),
    )
