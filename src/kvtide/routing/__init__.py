"""Routing: synchronous decisions over replicas, no I/O; the simulator and the gateway share it.

Imports only ``kvtide.core`` (and errors, types, clock); ``kvtide.state`` builds on it.
"""

from kvtide.routing.consistency import IndexHealth
from kvtide.routing.decision import RouteDecision
from kvtide.routing.index import GlobalPrefixIndex, IndexStore, PrefixMatch
from kvtide.routing.policies import RoutingContext, RoutingPolicy
from kvtide.routing.registry import POLICIES, make_policy, register_policy
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.routing.ttft import LinearTtftModel, TtftModel

__all__ = [
    "POLICIES",
    "GlobalPrefixIndex",
    "IndexHealth",
    "IndexStore",
    "LinearTtftModel",
    "PrefixMatch",
    "ReplicaState",
    "RouteDecision",
    "RouteRequest",
    "RoutingContext",
    "RoutingPolicy",
    "TtftModel",
    "make_policy",
    "register_policy",
]
