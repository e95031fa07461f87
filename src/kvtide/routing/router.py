"""Router: one policy over a replica set, with the bookkeeping every caller needs.

The simulator and the gateway drive the same object: ``route`` at arrival, ``prefill_done``
at the first token (with the engine's reported cached tokens, for regret), ``complete`` at
the end. Policies and ``ReplicaState`` can also be driven directly; this is the short path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvtide.errors import UsageError
from kvtide.routing.consistency import IndexHealth
from kvtide.routing.decision import RouteDecision
from kvtide.routing.policies import BasePolicy, RoutingPolicy
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.types import ReplicaId


class Router:
    """``health`` defaults to the policy's context's, so regret reports reach the policy.
    ``route`` refuses (``UsageError``) a request hashed at another block size than the
    policy's ``RoutingContext.block_tokens``: its hashes could never match the index."""

    def __init__(
        self,
        policy: RoutingPolicy,
        replicas: Iterable[ReplicaState],
        health: IndexHealth | None = None,
    ) -> None:
        self.policy = policy
        if health is None:
            health = policy.ctx.health if isinstance(policy, BasePolicy) else IndexHealth()
        self.health = health
        self.replicas: dict[ReplicaId, ReplicaState] = {r.replica_id: r for r in replicas}
        self._list = list(self.replicas.values())
        # The block size every request's hashes must be at: the index and the engines use it.
        self.block_tokens = policy.ctx.block_tokens if isinstance(policy, BasePolicy) else None

    def add_replica(self, replica: ReplicaState) -> None:
        self.replicas[replica.replica_id] = replica
        self._list = list(self.replicas.values())

    def remove_replica(self, replica: ReplicaId) -> None:
        self.replicas.pop(replica, None)
        self._list = list(self.replicas.values())

    def route(
        self, request: RouteRequest, among: Sequence[ReplicaState] | None = None
    ) -> RouteDecision:
        """Chooses a replica and books the request there (policy and replica state).
        ``among`` narrows the choice (the gateway: replicas serving the request's model,
        outside slow start's cap, not tried already); default: every replica."""
        if self.block_tokens is not None and request.block_tokens != self.block_tokens:
            raise UsageError(
                f"request {request.request_id!r} is hashed at {request.block_tokens}-token "
                f"blocks, but this router's policy works at {self.block_tokens} "
                "(RoutingContext.block_tokens): hash it at the engines' block size"
            )
        decision = self.policy.choose(request, self._list if among is None else among)
        self.policy.on_dispatch(request, decision)
        self.replicas[decision.replica].dispatch(_prefill_tokens(request, decision))
        return decision

    def prefill_done(
        self,
        request: RouteRequest,
        decision: RouteDecision,
        reported_cached_tokens: int | None = None,
    ) -> None:
        """The first token came back; ``reported_cached_tokens`` is what the engine reused
        (OpenAI ``usage.prompt_tokens_details.cached_tokens``) when known."""
        r = self.replicas.get(decision.replica)
        if r is not None:
            r.prefill_done(_prefill_tokens(request, decision), request.prompt_tokens)
        if reported_cached_tokens is not None:
            self.health.report(decision.replica, decision.cached_tokens, reported_cached_tokens)

    def complete(self, request: RouteRequest, decision: RouteDecision, output_tokens: int) -> None:
        r = self.replicas.get(decision.replica)
        if r is not None:
            r.complete(request.prompt_tokens + output_tokens)
        self.policy.on_complete(request, decision.replica)

    def cancel(self, request: RouteRequest, decision: RouteDecision) -> None:
        """The request ended before its first token (error, abort)."""
        r = self.replicas.get(decision.replica)
        if r is not None:
            r.cancel(_prefill_tokens(request, decision))
        self.policy.on_complete(request, decision.replica)


def _prefill_tokens(request: RouteRequest, decision: RouteDecision) -> int:
    return max(request.prompt_tokens - decision.cached_tokens, 0)
