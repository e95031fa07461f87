"""Routing policies by name: ``make_policy("cost", ctx, {"epsilon": 0.25})``."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kvtide.registry import build_named
from kvtide.routing.affinity import Approx, Precise
from kvtide.routing.chash import ConsistentHash
from kvtide.routing.cost import CostAware
from kvtide.routing.peers import PeerDynamo, PeerLlmd, PeerPreble, PeerSglang
from kvtide.routing.policies import (
    LeastLoad,
    RandomChoice,
    RoundRobin,
    RoutingContext,
    RoutingPolicy,
)

PolicyFactory = Callable[..., RoutingPolicy]

POLICIES: dict[str, PolicyFactory] = {
    "random": RandomChoice,
    "round_robin": RoundRobin,
    "least_load": LeastLoad,
    "chash": ConsistentHash,
    "approx": Approx,
    "precise": Precise,
    "cost": CostAware,
    "peer_sglang": PeerSglang,
    "peer_dynamo": PeerDynamo,
    "peer_llmd": PeerLlmd,
    "peer_preble": PeerPreble,
}

NEEDS_INDEX = frozenset({"precise", "cost", "peer_dynamo", "peer_llmd"})
"""Policies that read ``RoutingContext.index`` with their default options."""


def register_policy(name: str, factory: PolicyFactory) -> None:
    POLICIES[name] = factory


def make_policy(
    name: str, ctx: RoutingContext, options: Mapping[str, object] | None = None
) -> RoutingPolicy:
    """Builds a policy by name on ``ctx`` (its clock, block size, index); bad names and
    options raise ``ConfigError``."""
    return build_named("routing policy", POLICIES, name, ctx, options=options)
