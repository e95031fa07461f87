"""kvtide: the control plane for LLM KV-cache reuse and eviction across a serving fleet.

The names in ``__all__`` are the library's public API (see docs/library.md). Errors, plain
types and clocks load with the package; the cache, tiers, cost model and routing load on
first use, so ``import kvtide`` (and the CLI's start) stays cheap and never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from kvtide.clock import Clock, ManualClock, WallClock
from kvtide.errors import (
    CapacityError,
    ConfigError,
    KvtideError,
    NoHealthyReplica,
    StateStoreError,
    TraceFormatError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
    UsageError,
)
from kvtide.types import BlockHash, ReplicaId, Request, TenantId, Tier

if TYPE_CHECKING:
    from kvtide.core.cache import Access, CacheConfig, CacheStats, KVCache
    from kvtide.core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
    from kvtide.core.hashing import (
        BlockHashes,
        Namespace,
        hash_block_ids,
        hash_tokens,
        request_block_hashes,
    )
    from kvtide.core.tiers import TieredAccess, TieredCache, TieredCacheConfig, TierSpec
    from kvtide.costs.cost_model import Coefficients, CostModel
    from kvtide.costs.specs import (
        GPU_PRESETS,
        MODEL_PRESETS,
        GpuSpec,
        ModelSpec,
        gpu_preset,
        model_preset,
        resolve_model,
    )
    from kvtide.routing.decision import RouteDecision
    from kvtide.routing.index import GlobalPrefixIndex, PrefixMatch
    from kvtide.routing.policies import RoutingContext, RoutingPolicy
    from kvtide.routing.registry import make_policy
    from kvtide.routing.replica import ReplicaState
    from kvtide.routing.request import RouteRequest
    from kvtide.routing.router import Router

__version__ = "0.1.0"

# name -> module that defines it; loaded by __getattr__ on first access (PEP 562).
_LAZY: dict[str, str] = {
    **dict.fromkeys(("Access", "CacheConfig", "CacheStats", "KVCache"), "kvtide.core.cache"),
    **dict.fromkeys(
        ("AllBlocksCleared", "BlockRemoved", "BlockStored", "KVEvent"), "kvtide.core.events"
    ),
    **dict.fromkeys(
        ("BlockHashes", "Namespace", "hash_block_ids", "hash_tokens", "request_block_hashes"),
        "kvtide.core.hashing",
    ),
    **dict.fromkeys(
        ("TieredAccess", "TieredCache", "TieredCacheConfig", "TierSpec"), "kvtide.core.tiers"
    ),
    **dict.fromkeys(("Coefficients", "CostModel"), "kvtide.costs.cost_model"),
    **dict.fromkeys(
        (
            "GPU_PRESETS",
            "MODEL_PRESETS",
            "GpuSpec",
            "ModelSpec",
            "gpu_preset",
            "model_preset",
            "resolve_model",
        ),
        "kvtide.costs.specs",
    ),
    "RouteDecision": "kvtide.routing.decision",
    "GlobalPrefixIndex": "kvtide.routing.index",
    "PrefixMatch": "kvtide.routing.index",
    "RoutingContext": "kvtide.routing.policies",
    "RoutingPolicy": "kvtide.routing.policies",
    "make_policy": "kvtide.routing.registry",
    "ReplicaState": "kvtide.routing.replica",
    "RouteRequest": "kvtide.routing.request",
    "Router": "kvtide.routing.router",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvtide' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "GPU_PRESETS",
    "MODEL_PRESETS",
    "Access",
    "AllBlocksCleared",
    "BlockHash",
    "BlockHashes",
    "BlockRemoved",
    "BlockStored",
    "CacheConfig",
    "CacheStats",
    "CapacityError",
    "Clock",
    "Coefficients",
    "ConfigError",
    "CostModel",
    "GlobalPrefixIndex",
    "GpuSpec",
    "KVCache",
    "KVEvent",
    "KvtideError",
    "ManualClock",
    "ModelSpec",
    "Namespace",
    "NoHealthyReplica",
    "PrefixMatch",
    "ReplicaId",
    "ReplicaState",
    "Request",
    "RouteDecision",
    "RouteRequest",
    "Router",
    "RoutingContext",
    "RoutingPolicy",
    "StateStoreError",
    "TenantId",
    "Tier",
    "TierSpec",
    "TieredAccess",
    "TieredCache",
    "TieredCacheConfig",
    "TraceFormatError",
    "UpstreamError",
    "UpstreamTimeout",
    "UpstreamUnavailable",
    "UsageError",
    "WallClock",
    "__version__",
    "gpu_preset",
    "hash_block_ids",
    "hash_tokens",
    "make_policy",
    "model_preset",
    "request_block_hashes",
    "resolve_model",
]
