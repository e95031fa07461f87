"""Stand-in for ``kvtide.routing`` until it lands: the protocol the fleet calls and two
load-only policies. Deleted once the real policies are on main."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvtide.core.events import KVEvent
from kvtide.errors import ConfigError, NoHealthyReplica
from kvtide.types import ReplicaId, Request


@dataclass(slots=True)
class ReplicaState:
    """What a gateway knows about one replica from the requests it sent there."""

    replica_id: ReplicaId
    outstanding_requests: int = 0
    outstanding_prefill_tokens: int = 0
    is_healthy: bool = True


@dataclass(frozen=True, slots=True)
class RouteDecision:
    replica_id: ReplicaId
    terms: Mapping[str, float] = field(default_factory=dict)


class RoutingPolicy(Protocol):
    name: str

    def choose(self, request: Request, replicas: Sequence[ReplicaState]) -> RouteDecision: ...

    def apply(self, replica_id: ReplicaId, events: Sequence[KVEvent]) -> None: ...


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: Request, replicas: Sequence[ReplicaState]) -> RouteDecision:
        if not replicas:
            raise NoHealthyReplica("no replica to route to")
        chosen = replicas[self._next % len(replicas)]
        self._next += 1
        return RouteDecision(chosen.replica_id)

    def apply(self, replica_id: ReplicaId, events: Sequence[KVEvent]) -> None:
        pass


class LeastLoad:
    name = "least_load"

    def choose(self, request: Request, replicas: Sequence[ReplicaState]) -> RouteDecision:
        if not replicas:
            raise NoHealthyReplica("no replica to route to")
        chosen = min(replicas, key=lambda r: (r.outstanding_prefill_tokens, r.outstanding_requests))
        return RouteDecision(chosen.replica_id)

    def apply(self, replica_id: ReplicaId, events: Sequence[KVEvent]) -> None:
        pass


class RandomChoice:
    name = "random"

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def choose(self, request: Request, replicas: Sequence[ReplicaState]) -> RouteDecision:
        if not replicas:
            raise NoHealthyReplica("no replica to route to")
        return RouteDecision(replicas[self._rng.randrange(len(replicas))].replica_id)

    def apply(self, replica_id: ReplicaId, events: Sequence[KVEvent]) -> None:
        pass


def make_router(name: str, *, seed: int = 0, block_tokens: int = 16) -> RoutingPolicy:
    if name == "round_robin":
        return RoundRobin()
    if name == "least_load":
        return LeastLoad()
    if name == "random":
        return RandomChoice(seed)
    raise ConfigError(f"unknown router {name!r}; valid: least_load, random, round_robin")
