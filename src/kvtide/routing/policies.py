"""RoutingPolicy: choose(request, replicas) -> RouteDecision, and the cache-blind policies.

Every policy is synchronous and does no I/O: the simulator and the gateway call the very same
objects. A policy reads the replicas' state and never changes it; the caller updates
``ReplicaState`` and tells the policy through ``on_dispatch`` / ``on_complete``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvtide.clock import Clock, require_clock
from kvtide.core.hashing import BlockHashes
from kvtide.errors import ConfigError, NoHealthyReplica
from kvtide.routing.consistency import IndexHealth
from kvtide.routing.decision import RouteDecision
from kvtide.routing.index import IndexStore
from kvtide.routing.pace import PrefillPace
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.routing.ttft import TtftModel, default_ttft_model
from kvtide.types import ReplicaId


class RoutingPolicy(Protocol):
    name: str

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        """The replica for ``request`` among the healthy ``replicas``; raises
        ``NoHealthyReplica`` when none is healthy. Pure with respect to ``replicas``."""
        ...

    def on_dispatch(self, request: RouteRequest, decision: RouteDecision) -> None:
        """The caller sent ``request`` where ``decision`` said."""
        ...

    def on_complete(self, request: RouteRequest, replica: ReplicaId) -> None:
        """``request`` finished (or failed) on ``replica``."""
        ...


@dataclass(slots=True)
class RoutingContext:
    """What a policy may use besides the replicas: the engines' block size, a clock and a
    seeded rng (nothing else reads time or randomness), the event-fed index, a TTFT model,
    the index's health and the engines' pace against the TTFT model (``routing.pace``, which
    the ``Router`` feeds). One context may be shared by several policies. ``clock`` is
    required (keyword-only): ``WallClock()`` in a gateway, ``ManualClock()`` in a simulation;
    TTLs, provisional holds and event lag are measured on it."""

    clock: Clock = field(kw_only=True)
    block_tokens: int = 16
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    index: IndexStore | None = None
    ttft_model: TtftModel = field(default_factory=default_ttft_model)
    health: IndexHealth = field(default_factory=IndexHealth)
    pace: PrefillPace = field(default_factory=PrefillPace)

    def __post_init__(self) -> None:
        require_clock(self.clock, "RoutingContext")
        if self.block_tokens <= 0:
            raise ConfigError(f"block_tokens must be positive, got {self.block_tokens}")

    def require_index(self, policy: str) -> IndexStore:
        if self.index is None:
            raise ConfigError(f"routing policy {policy!r} needs an index (RoutingContext.index)")
        return self.index


class BasePolicy:
    """Shared plumbing: healthy-replica filtering and no-op hooks."""

    name = "base"

    cold_head_blocks: int | None = None
    """How many leading blocks of a prompt this policy reads to route it when no replica
    holds (nor is expected to hold) all of them (``held_blocks``): then no replica holds any
    later block either, and the gateway need not tokenize and hash the rest. None: it may
    read every block, so every prompt is hashed whole."""

    def __init__(self, ctx: RoutingContext) -> None:
        self.ctx = ctx

    def held_blocks(self, hashes: BlockHashes) -> int:
        """The longest prefix of ``hashes`` a replica holds or is expected to hold, in blocks
        (the hashes are chained and engines match from block 0: no replica holds a block
        past it). This base knows nothing of holdings: all of them, so nothing is skipped."""
        return len(hashes)

    def on_blocks_known(self, request: RouteRequest, hashes: Callable[[], BlockHashes]) -> None:
        """``request``, routed on its head, has the full blocks ``hashes()`` gives (its whole
        prompt's), hashed later because a follow-up shares the head: called only when the
        policy still has a use for them."""

    def on_dispatch(self, request: RouteRequest, decision: RouteDecision) -> None:
        pass

    def on_complete(self, request: RouteRequest, replica: ReplicaId) -> None:
        pass

    @staticmethod
    def healthy(replicas: Sequence[ReplicaState]) -> list[ReplicaState]:
        out = [r for r in replicas if r.healthy]
        if not out:
            raise NoHealthyReplica(f"none of {len(replicas)} replicas is healthy")
        return out


def load_cap(replicas: Sequence[ReplicaState], epsilon: float) -> int:
    """Mirrokni-Thorup-Zadimoghaddam (SODA'18) capacity: ceil((1+eps) * average load), where
    the average counts the request being placed. A replica may take it only below this cap."""
    total = sum([r.num_requests for r in replicas]) + 1
    return math.ceil((1.0 + epsilon) * total / len(replicas))


def check_epsilon(epsilon: float) -> float:
    if not epsilon > 0:
        raise ConfigError(f"epsilon must be > 0, got {epsilon}")
    return float(epsilon)


class RandomChoice(BasePolicy):
    """Uniform over healthy replicas, from the context's seeded rng: the weakest baseline
    (Mooncake, FAST'25, Fig. 5), kept for comparisons."""

    name = "random"

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        cands = self.healthy(replicas)
        r = cands[self.ctx.rng.randrange(len(cands))]
        return RouteDecision(
            r.replica_id, self.name, "random", queue_tokens=r.queued_prefill_tokens
        )


class RoundRobin(BasePolicy):
    """Healthy replicas in turn."""

    name = "round_robin"

    def __init__(self, ctx: RoutingContext) -> None:
        super().__init__(ctx)
        self._next = 0

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        cands = self.healthy(replicas)
        r = cands[self._next % len(cands)]
        self._next += 1
        return RouteDecision(
            r.replica_id, self.name, "round_robin", queue_tokens=r.queued_prefill_tokens
        )


class LeastLoad(BasePolicy):
    """Fewest outstanding tokens of work: queued prefill tokens + ``decode_weight`` x decode
    context tokens; ties go to the fewest requests, then in turn."""

    name = "least_load"

    def __init__(self, ctx: RoutingContext, decode_weight: float = 1.0) -> None:
        super().__init__(ctx)
        self.decode_weight = float(decode_weight)
        self._turn = 0

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        cands = self.healthy(replicas)
        n = len(cands)
        self._turn += 1
        w = self.decode_weight
        best = min(
            range(n),
            key=lambda i: (
                cands[i].queued_prefill_tokens + w * cands[i].decode_tokens,
                cands[i].num_requests,
                (i - self._turn) % n,
            ),
        )
        r = cands[best]
        load = r.queued_prefill_tokens + w * r.decode_tokens
        return RouteDecision(
            r.replica_id, self.name, "load", queue_tokens=r.queued_prefill_tokens, score=load
        )
