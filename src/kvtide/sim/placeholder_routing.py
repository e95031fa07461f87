"""Stand-in for ``kvtide.routing`` until it lands on main, shaped like its API (RouteRequest,
ReplicaState, RouteDecision, policies with on_dispatch / on_complete) with cache-blind
policies only. Deleted once the real package is merged."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvtide.core.events import KVEvent
from kvtide.core.hashing import BlockHashes
from kvtide.errors import ConfigError, NoHealthyReplica
from kvtide.types import ReplicaId


@dataclass(frozen=True, slots=True)
class RouteRequest:
    block_hashes: BlockHashes
    prompt_tokens: int
    block_tokens: int
    request_id: str = ""
    tenant: str = "default"
    session_id: str | None = None
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RouteDecision:
    replica: ReplicaId
    policy: str
    reason: str
    cached_blocks: int = 0
    cached_tokens: int = 0


class ReplicaState:
    __slots__ = (
        "block_tokens",
        "capacity_blocks",
        "decode_sequences",
        "decode_tokens",
        "healthy",
        "num_requests",
        "queued_prefill_tokens",
        "replica_id",
    )

    def __init__(
        self, replica_id: str, *, capacity_blocks: int = 0, block_tokens: int = 16
    ) -> None:
        self.replica_id = ReplicaId(replica_id)
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self.healthy = True
        self.num_requests = 0
        self.queued_prefill_tokens = 0
        self.decode_sequences = 0
        self.decode_tokens = 0

    def dispatch(self, prefill_tokens: int) -> None:
        self.num_requests += 1
        self.queued_prefill_tokens += prefill_tokens

    def prefill_done(self, prefill_tokens: int, context_tokens: int) -> None:
        self.queued_prefill_tokens = max(self.queued_prefill_tokens - prefill_tokens, 0)
        self.decode_sequences += 1
        self.decode_tokens += context_tokens

    def decode_progress(self, tokens: int = 1) -> None:
        self.decode_tokens += tokens

    def complete(self, context_tokens: int) -> None:
        self.num_requests = max(self.num_requests - 1, 0)
        self.decode_sequences = max(self.decode_sequences - 1, 0)
        self.decode_tokens = max(self.decode_tokens - context_tokens, 0)

    def cancel(self, prefill_tokens: int) -> None:
        self.num_requests = max(self.num_requests - 1, 0)
        self.queued_prefill_tokens = max(self.queued_prefill_tokens - prefill_tokens, 0)


class IndexStore:
    """Null index: the placeholder policies are cache-blind."""

    def apply_all(self, replica: ReplicaId, events: Iterable[KVEvent]) -> None:
        pass

    def clear_replica(self, replica: ReplicaId) -> None:
        pass


class _Base:
    name = "base"

    def on_dispatch(self, request: RouteRequest, decision: RouteDecision) -> None:
        pass

    def on_complete(self, request: RouteRequest, replica: ReplicaId) -> None:
        pass

    @staticmethod
    def healthy(replicas: Sequence[ReplicaState]) -> list[ReplicaState]:
        out = [r for r in replicas if r.healthy]
        if not out:
            raise NoHealthyReplica("no healthy replica")
        return out


class RoundRobin(_Base):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        cands = self.healthy(replicas)
        chosen = cands[self._next % len(cands)]
        self._next += 1
        return RouteDecision(chosen.replica_id, self.name, "round_robin")


class LeastLoad(_Base):
    name = "least_load"

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        cands = self.healthy(replicas)
        chosen = min(cands, key=lambda r: r.queued_prefill_tokens + r.decode_tokens)
        return RouteDecision(chosen.replica_id, self.name, "load")


class RandomChoice(_Base):
    name = "random"

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        cands = self.healthy(replicas)
        return RouteDecision(cands[self._rng.randrange(len(cands))].replica_id, self.name, "random")


RoutingPolicy = RoundRobin | LeastLoad | RandomChoice


def make_router(name: str, *, seed: int = 0) -> tuple[RoutingPolicy, IndexStore | None]:
    if name == "round_robin":
        return RoundRobin(), None
    if name == "least_load":
        return LeastLoad(), None
    if name == "random":
        return RandomChoice(seed), None
    raise ConfigError(f"unknown router {name!r}; valid: least_load, random, round_robin")
