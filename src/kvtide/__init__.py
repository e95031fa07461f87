"""kvtide: the control plane for LLM KV-cache reuse and eviction across a serving fleet."""

from kvtide.errors import (
    CapacityError,
    ConfigError,
    KvtideError,
    NoHealthyReplica,
    StateStoreError,
    TraceFormatError,
    UpstreamError,
)
from kvtide.types import BlockHash, ReplicaId, Request, TenantId, Tier

__version__ = "0.1.0"

__all__ = [
    "BlockHash",
    "CapacityError",
    "ConfigError",
    "KvtideError",
    "NoHealthyReplica",
    "ReplicaId",
    "Request",
    "StateStoreError",
    "TenantId",
    "Tier",
    "TraceFormatError",
    "UpstreamError",
    "__version__",
]
