"""Routing policies that exist only as baselines for the simulator's comparisons.

``random`` is Mooncake's (FAST'25, Fig. 5) weakest baseline: uniform over healthy replicas,
drawn from the routing context's seeded rng. It plugs into ``kvtide.routing`` as any other
policy would (``BasePolicy``); the registry of production policies stays untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def parse_router(spec: str) -> tuple[str, dict[str, object]]:
    """``NAME[:key=value[:key=value...]]`` into a name and options (ints, floats, booleans,
    strings); the colon keeps commas free for lists of routers."""
    name, *items = spec.split(":")
    options: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in items)):
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"router {spec!r}: expected NAME:key=value[:key=value...]")
        options[key.strip()] = _value(raw.strip())
    return name.strip(), options


def _value(raw: str) -> object:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for convert in (int, float):
        try:
            return convert(raw)
        except ValueError:
            pass
    return raw


def needs_index(spec: str) -> bool:
    return parse_router(spec)[0] in NEEDS_INDEX


def build_policy(spec: str, ctx: RoutingContext) -> RoutingPolicy:
    """A production policy from ``kvtide.routing`` by name (``NAME[:key=value...]``), or a
    simulator baseline."""
    name, options = parse_router(spec)
    baseline = BASELINES.get(name)
    if baseline is None:
        if name not in POLICIES:
            raise ConfigError(f"unknown router {name!r} (valid: {', '.join(policy_names())})")
        return make_policy(name, ctx, options)
    if options:
        raise ConfigError(f"router {name!r} takes no options")
    return baseline(ctx)
