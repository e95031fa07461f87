"""RouteDecision: the replica a policy chose and the score terms that explain the choice."""

from __future__ import annotations

from dataclasses import dataclass

from kvtide.types import ReplicaId


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """One routing choice.

    ``cached_blocks`` / ``cached_tokens`` are what the policy *predicted* the chosen replica
    holds of the prompt (device tier first, then lower tiers; 0 for cache-blind policies);
    ``onboard_blocks`` is the part of it held below the device tier. ``queue_tokens`` is the
    replica's outstanding prefill work at decision time; ``ttft_s`` the estimated time to
    first token in seconds when the policy estimates one (``cost``), else ``None``.
    ``reason`` names the branch taken: "affinity", "load", "cold", "hot", "overload",
    "fallback", "explore", "exploit", "hash", "round_robin".
    """

    replica: ReplicaId
    policy: str
    reason: str
    cached_blocks: int = 0
    cached_tokens: int = 0
    onboard_blocks: int = 0
    queue_tokens: int = 0
    ttft_s: float | None = None
    score: float | None = None
