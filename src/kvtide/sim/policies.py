"""Routing policies that exist only as baselines for the simulator's comparisons.

``random`` is Mooncake's (FAST'25, Fig. 5) weakest baseline: uniform over healthy replicas,
drawn from the routing context's seeded rng. It plugs into ``kvtide.routing`` as any other
policy would (``BasePolicy``); the registry of production policies stays untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvtide.errors import ConfigError
from kvtide.routing import (
    POLICIES,
    ReplicaState,
    RouteDecision,
    RouteRequest,
    RoutingContext,
    RoutingPolicy,
    make_policy,
)
from kvtide.routing.policies import BasePolicy
from kvtide.routing.registry import NEEDS_INDEX


class RandomChoice(BasePolicy):
    name = "random"

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        cands = self.healthy(replicas)
        r = cands[self.ctx.rng.randrange(len(cands))]
        return RouteDecision(
            r.replica_id, self.name, "random", queue_tokens=r.queued_prefill_tokens
        )


BASELINES = {"random": RandomChoice}


def policy_names() -> list[str]:
    return sorted({*POLICIES, *BASELINES})


def needs_index(name: str) -> bool:
    return name in NEEDS_INDEX


def build_policy(
    name: str, ctx: RoutingContext, options: Mapping[str, object] | None = None
) -> RoutingPolicy:
    """A production policy from ``kvtide.routing`` by name, or a simulator baseline."""
    baseline = BASELINES.get(name)
    if baseline is None:
        if name not in POLICIES:
            raise ConfigError(f"unknown router {name!r} (valid: {', '.join(policy_names())})")
        return make_policy(name, ctx, options)
    if options:
        raise ConfigError(f"router {name!r} takes no options")
    return baseline(ctx)
