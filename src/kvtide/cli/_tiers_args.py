"""The tier flags of `kvtide replay` (--host-capacity, --disk-capacity, --admission, ...), the
tiered cache they build, and what each run reports about its tiers.

`replay` calls three functions: ``add_tier_arguments(parser)`` once, ``build_cache(args, ...)``
per run, and ``tier_report(cache)`` for the run's JSON.
"""

from __future__ import annotations

import argparse

from kvtide.cli._checks import TP
from kvtide.clock import Clock
from kvtide.core.admission import ADMISSION_FILTERS
from kvtide.core.eviction import POLICIES
from kvtide.core.tiers import OnboardCost, TieredCache, TieredCacheConfig, TierSpec, WriteMode
from kvtide.costs.cost_model import CostModel
from kvtide.costs.specs import GPU_PRESETS, MODEL_PRESETS, gpu_preset, resolve_model
from kvtide.errors import ConfigError
from kvtide.quantities import flag, tokens
from kvtide.types import Tier


def add_tier_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "tiers",
        "host and disk tiers under the device cache: evicted blocks are written down, "
        "lower-tier hits reloaded (see kvtide.core.tiers for the semantics)",
    )
    group.add_argument(
        "--host-capacity",
        type=flag(tokens),
        default=0,
        metavar="TOKENS",
        help="host-memory tier size in tokens, e.g. 10M (default: 0, no host tier)",
    )
    group.add_argument(
        "--disk-capacity",
        type=flag(tokens),
        default=0,
        metavar="TOKENS",
        help="disk tier size in tokens (default: 0, no disk tier)",
    )
    filters = sorted(ADMISSION_FILTERS)
    group.add_argument(
        "--admission",
        choices=filters,
        default="none",
        help="filter on writes into the host tier; seen-twice skips blocks requested once "
        "(default: none)",
    )
    group.add_argument(
        "--disk-admission",
        choices=filters,
        default="none",
        help="filter on writes into the disk tier; blocks the host refuses are offered to the "
        "disk (default: none)",
    )
    group.add_argument(
        "--host-policy", metavar="NAME", help="host eviction policy (default: the device's)"
    )
    group.add_argument(
        "--disk-policy", metavar="NAME", help="disk eviction policy (default: the device's)"
    )
    group.add_argument(
        "--write-mode",
        choices=[mode.value for mode in WriteMode],
        default=WriteMode.WRITE_BACK.value,
        help="write blocks down when evicted (write-back) or when stored (write-through)",
    )
    group.add_argument(
        "--model",
        default="llama-3-8b",
        metavar="M",
        help=f"cost model: a preset ({', '.join(sorted(MODEL_PRESETS))}) or a config.json, for "
        "reload-vs-recompute decisions and the prefill seconds saved (default: llama-3-8b)",
    )
    group.add_argument(
        "--gpu",
        default="h100",
        metavar="G",
        help=f"GPU preset: {', '.join(sorted(GPU_PRESETS))} (default: h100)",
    )
    group.add_argument("--tp", type=TP, default=1, metavar="N", help="tensor-parallel degree")
    group.add_argument(
        "--dtype", default="bf16", metavar="D", help="KV-cache dtype: bf16 or fp8 (default bf16)"
    )


def cost_from_args(args: argparse.Namespace) -> CostModel:
    """The cost model the flags name (default coefficients)."""
    return CostModel(resolve_model(args.model), gpu_preset(args.gpu), args.tp, args.dtype)


def check_tier_args(args: argparse.Namespace) -> None:
    """The cost model and the tier policies the flags name, built once before any run (the
    runs build them again in their worker processes)."""
    cost_from_args(args)
    for name, policy in (("--host-policy", args.host_policy), ("--disk-policy", args.disk_policy)):
        if policy is not None and policy not in POLICIES:
            valid = ", ".join(sorted(POLICIES))
            raise ConfigError(f"{name}: unknown eviction policy {policy!r} (valid: {valid})")


def has_tiers(args: argparse.Namespace) -> bool:
    """Whether the flags ask for any tier below the device."""
    return bool(args.host_capacity or args.disk_capacity)


def _blocks(name: str, tokens: int, block_tokens: int) -> int:
    blocks = tokens // block_tokens
    if tokens and not blocks:
        raise ConfigError(f"{name} capacity of {tokens} tokens holds no {block_tokens}-token block")
    return blocks


def build_cache(
    args: argparse.Namespace,
    *,
    capacity_blocks: int,
    block_tokens: int,
    policy: str,
    clock: Clock,
    cost: OnboardCost | None = None,
    record_events: bool = False,
) -> TieredCache:
    """The tiered cache for one run: a device of ``capacity_blocks`` under ``policy``, the host
    and disk tiers the flags ask for, and the cost model they name unless ``cost`` is given."""
    host = _blocks("host", args.host_capacity, block_tokens)
    disk = _blocks("disk", args.disk_capacity, block_tokens)
    config = TieredCacheConfig(
        device=TierSpec(capacity_blocks, policy),
        host=TierSpec(host, args.host_policy or policy, admission=args.admission) if host else None,
        disk=TierSpec(disk, args.disk_policy or policy, admission=args.disk_admission)
        if disk
        else None,
        block_tokens=block_tokens,
        write_mode=WriteMode(args.write_mode),
        record_events=record_events,
    )
    return TieredCache(config, clock, cost if cost is not None else cost_from_args(args))


def tier_report(cache: TieredCache) -> dict[str, object]:
    """The tier part of a run's JSON report. ``hit_ratio``, ``block_hit_ratio`` and
    ``hit_tokens`` count every tier (they replace the device's own in a run's row)."""
    stats = cache.stats()
    config = cache.config
    names = {tier: tier.name.lower() for tier in Tier}
    full_blocks = stats.device.full_blocks
    return {
        "hit_ratio": stats.hit_ratio,
        "block_hit_ratio": stats.hit_tokens / config.block_tokens / full_blocks
        if full_blocks
        else 0.0,
        "hit_tokens": stats.hit_tokens,
        "hit_ratio_by_tier": stats.hit_ratio_by_tier,
        "reloaded_ratio": stats.reloaded_ratio,
        "host_writes_blocks": stats.written_blocks(Tier.HOST),
        "disk_writes_blocks": stats.written_blocks(Tier.DISK),
        "dropped_blocks_by_tier": {names[t]: s.dropped_blocks for t, s in stats.tiers.items()},
        "prefill_s_saved": stats.prefill_s_saved,
        "prefill_s_saved_by_tier": {names[t]: s.prefill_s_saved for t, s in stats.tiers.items()},
        "capacity_tokens_by_tier": {
            names[t]: s.capacity_blocks * config.block_tokens for t, s in stats.tiers.items()
        },
        "admission_by_tier": {
            names[t]: spec.admission
            for t in (Tier.HOST, Tier.DISK)
            if (spec := config.spec(t)) is not None
        },
        "write_mode": config.write_mode.value,
        "reload_decisions": describe_cost(cache.cost),
    }


def describe_cost(cost: OnboardCost) -> str:
    if isinstance(cost, CostModel):
        return f"{cost.model.name} on {cost.gpu.name} x{cost.tp} ({cost.dtype} KV)"
    return type(cost).__name__
