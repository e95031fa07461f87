"""Prefix-affinity policies: ``approx`` (shadow caches) and ``precise`` (event-fed index).

Both send a request to the replica predicted to hold the longest prefix of it, among replicas
under the bounded-load cap of ``chash``; a cold prefix (no replica holds ``min_cached_blocks``)
goes where ``chash`` sends it, so independent router replicas place new prefixes alike. Ties
between equally good replicas go to the highest rendezvous weight of the request's key.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtide.errors import ConfigError
from kvtide.routing.chash import RingCache, bounded_choice, prefix_key, tie_break
from kvtide.routing.decision import RouteDecision
from kvtide.routing.index import PrefixMatch
from kvtide.routing.policies import BasePolicy, RoutingContext, check_epsilon, load_cap
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.routing.shadow import ShadowFleet
from kvtide.types import ReplicaId


class PrefixAffinity(BasePolicy):
    name = "affinity"

    def __init__(
        self,
        ctx: RoutingContext,
        epsilon: float = 0.25,
        key_blocks: int = 16,
        vnodes: int = 160,
        min_cached_blocks: int = 1,
    ) -> None:
        super().__init__(ctx)
        self.epsilon = check_epsilon(epsilon)
        if key_blocks < 1 or min_cached_blocks < 1:
            raise ConfigError("key_blocks and min_cached_blocks must be >= 1")
        self.key_blocks = int(key_blocks)
        self.min_cached_blocks = int(min_cached_blocks)
        self.rings = RingCache(int(vnodes))

    def prefix_match(self, request: RouteRequest) -> PrefixMatch:
        raise NotImplementedError

    def uses_index_health(self) -> bool:
        return True

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        cands = self.healthy(replicas)
        key = prefix_key(request, self.key_blocks)
        bt = request.block_tokens
        if self.uses_index_health() and not self.ctx.health.is_trusted:
            return self._hashed(request, cands, key, "fallback")
        match = self.prefix_match(request)
        device = match.device
        if not device:
            return self._hashed(request, cands, key, "cold")
        cap = load_cap(cands, self.epsilon)
        best_blocks = 0
        best_requests = 0
        ties: list[ReplicaState] = []
        capped = False
        get = device.get
        for r in cands:
            b = get(r.replica_id, 0)
            if b < best_blocks or b == 0:
                continue
            q = r.num_requests
            if q + 1 > cap:
                capped = True
                continue
            if b > best_blocks or q < best_requests:
                best_blocks, best_requests, ties = b, q, [r]
            elif q == best_requests:
                ties.append(r)
        if best_blocks < self.min_cached_blocks:
            return self._hashed(request, cands, key, "overload" if capped else "cold")
        r = ties[0] if len(ties) == 1 else tie_break(key, ties)
        return RouteDecision(
            r.replica_id,
            self.name,
            "affinity",
            cached_blocks=best_blocks,
            cached_tokens=min(best_blocks * bt, request.prompt_tokens),
            queue_tokens=r.queued_prefill_tokens,
        )

    def _hashed(
        self, request: RouteRequest, cands: list[ReplicaState], key: int, reason: str
    ) -> RouteDecision:
        r, _ = bounded_choice(self.rings.ring(cands), key, cands, self.epsilon)
        return RouteDecision(r.replica_id, self.name, reason, queue_tokens=r.queued_prefill_tokens)


class Precise(PrefixAffinity):
    """``precise``: predictions from the global index fed by the engines' KV events."""

    name = "precise"

    def __init__(
        self,
        ctx: RoutingContext,
        epsilon: float = 0.25,
        key_blocks: int = 16,
        vnodes: int = 160,
        min_cached_blocks: int = 1,
    ) -> None:
        super().__init__(ctx, epsilon, key_blocks, vnodes, min_cached_blocks)
        self.index = ctx.require_index(self.name)

    def prefix_match(self, request: RouteRequest) -> PrefixMatch:
        if request.prefix_match is not None:
            return request.prefix_match
        return self.index.match(request.block_hashes)


class Approx(PrefixAffinity):
    """``approx``: predictions from per-replica shadow caches updated by its own decisions.

    ``capacity_blocks`` should be the replicas' KV capacity; ``ttl_s`` drops shadow entries
    idle that long (SGLang's router prunes its trees on a timer for the same reason).
    """

    name = "approx"

    def __init__(
        self,
        ctx: RoutingContext,
        capacity_blocks: int = 65_536,
        ttl_s: float | None = 600.0,
        epsilon: float = 0.25,
        key_blocks: int = 16,
        vnodes: int = 160,
        min_cached_blocks: int = 1,
    ) -> None:
        super().__init__(ctx, epsilon, key_blocks, vnodes, min_cached_blocks)
        self.fleet = ShadowFleet(
            int(capacity_blocks), ctx.clock, block_tokens=ctx.block_tokens, ttl_s=ttl_s
        )

    def uses_index_health(self) -> bool:
        return False  # the shadow index is ours: engine-side gaps do not make it wrong

    def prefix_match(self, request: RouteRequest) -> PrefixMatch:
        return self.fleet.match(request.block_hashes)

    def on_dispatch(self, request: RouteRequest, decision: RouteDecision) -> None:
        self.fleet.record(decision.replica, request.block_hashes)

    def forget(self, replica: ReplicaId) -> None:
        self.fleet.forget(replica)
