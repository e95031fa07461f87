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
    ``deadline_s``: when the policy orders the engines' waiting queues (``cost``'s
    ``deadline_k``), the seconds after its arrival by which this request should be admitted;
    ``engine_priority`` turns it into the ``priority`` the engine is sent.
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
    deadline_s: float | None = None

    def engine_priority(self, arrival_s: float) -> int | None:
        """vLLM's request ``priority`` (lower is admitted first, ties by arrival under
        ``--scheduling-policy priority``): the deadline ``arrival_s + deadline_s`` in
        milliseconds, or ``None`` when the policy sets no deadline. A gateway passes Unix
        seconds, so that gateway replicas on synchronised clocks agree on the order; the
        simulator its own clock."""
        if self.deadline_s is None:
            return None
        return round((arrival_s + self.deadline_s) * 1000.0)
