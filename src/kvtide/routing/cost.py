"""``cost``: route to the smallest estimated time to first token, in seconds.

TTFT(replica) = queue wait (its queued prefill tokens at the prefill rate)
              + the prompt's own prefill given what that replica holds: device-tier blocks are
                free, host/disk blocks are reloaded or recomputed, whichever is sooner
                (overlapped layer by layer, as the cost model's ``onboard_time``).
Guard rails, so that router replicas without a coordinator agree and no replica melts:
- a hard bounded-load cap (a replica at ceil((1+eps) x average) requests is not eligible);
- a cold prefix (no replica holds ``min_cached_blocks``) goes where ``chash`` sends it;
- a hot prefix, whose requests in flight exceed one replica's share of all requests in flight,
  is spread over the ceil(its load / share) replicas of highest rendezvous weight for its key;
- while the index health says the index is wrong, everything goes where ``chash`` sends it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

from kvtide.errors import ConfigError
from kvtide.routing.chash import (
    RingCache,
    bounded_choice,
    prefix_key,
    rendezvous_top,
    tie_break,
)
from kvtide.routing.decision import RouteDecision
from kvtide.routing.index import PrefixMatch
from kvtide.routing.policies import BasePolicy, RoutingContext, check_epsilon
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.routing.ttft import TtftModel
from kvtide.types import ReplicaId, Tier

K = TypeVar("K")


def service_time(
    model: TtftModel, prompt_tokens: int, block_tokens: int, blocks: tuple[int, int, int]
) -> float:
    """Seconds to make a prompt resident and prefilled when its first ``blocks`` =
    (device, host, disk) blocks are held in those tiers."""
    d, h, k = blocks
    dt = min(d * block_tokens, prompt_tokens)
    lower = min((h + k) * block_tokens, prompt_tokens - dt)
    new = prompt_tokens - dt - lower
    if lower == 0:
        return model.prefill_time(new, dt)
    load_s = 0.0
    ht = min(h * block_tokens, lower)
    if ht:
        load_s += model.onboard_time(ht, ht, 0, Tier.HOST)
    if lower - ht:
        load_s += model.onboard_time(lower - ht, lower - ht, 0, Tier.DISK)
    with_reload = max(load_s, model.prefill_time(new, dt + lower))
    recompute = model.prefill_time(new + lower, dt)
    return min(with_reload, recompute)


class CostAware(BasePolicy):
    name = "cost"

    def __init__(
        self,
        ctx: RoutingContext,
        epsilon: float = 0.25,
        key_blocks: int = 16,
        vnodes: int = 160,
        min_cached_blocks: int = 1,
        hot_replication: bool = True,
    ) -> None:
        super().__init__(ctx)
        self.epsilon = check_epsilon(epsilon)
        if key_blocks < 1 or min_cached_blocks < 1:
            raise ConfigError("key_blocks and min_cached_blocks must be >= 1")
        self.key_blocks = int(key_blocks)
        self.min_cached_blocks = int(min_cached_blocks)
        self.hot_replication = bool(hot_replication)
        self.rings = RingCache(int(vnodes))
        self.index = ctx.require_index(self.name)
        self.model = ctx.ttft_model
        self.prefill_tokens_per_s = self.model.prefill_tokens_per_s()
        self._inflight: dict[int, int] = {}  # prefix key -> requests in flight
        self._inflight_at: dict[tuple[int, ReplicaId], int] = {}  # ... on each replica
        self._inflight_full: dict[int, int] = {}  # whole-prompt key -> requests in flight

    def prefix_match(self, request: RouteRequest) -> PrefixMatch:
        if request.prefix_match is not None:
            return request.prefix_match
        return self.index.match(request.block_hashes)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        cands = self.healthy(replicas)
        key = prefix_key(request, self.key_blocks)
        if not self.ctx.health.is_trusted:
            return self._hashed(cands, key, "fallback")
        match = self.prefix_match(request)
        if match.max_blocks < self.min_cached_blocks:
            return self._hashed(cands, key, "cold")
        total = sum([r.num_requests for r in cands])
        cap = math.ceil((1.0 + self.epsilon) * (total + 1) / len(cands))  # as load_cap()
        eligible = [r for r in cands if r.num_requests < cap]
        reason = "affinity"
        if self.hot_replication and len(cands) > 1:
            spread = self._spread(cands, eligible, key, total, request, match)
            if spread is not None:
                eligible, reason = spread, "hot"
        return self._cheapest(request, eligible, match, key, reason)

    def _spread(
        self,
        cands: list[ReplicaState],
        eligible: list[ReplicaState],
        key: int,
        total: int,
        request: RouteRequest,
        match: PrefixMatch,
    ) -> list[ReplicaState] | None:
        """The replicas a hot prefix may go to now, or None when the prefix is not hot.

        Hot: its requests in flight (counting this one) exceed one replica's share of all
        requests in flight. It then lives on the k = ceil(load / share) replicas of
        highest rendezvous weight, each taking at most ceil(load / k) of its requests in flight.
        A replica holding more of this request than the hot prefix itself (its session, say)
        stays eligible: spreading the shared part must not cost the private part's reuse.
        """
        share = (total + 1) / len(cands)
        load = self._inflight.get(key, 0) + 1
        if share < 1.0 or load <= share:
            return None
        k = min(len(cands), math.ceil(load / share))
        home = set(rendezvous_top(key, [r.replica_id for r in cands], k))
        per_replica = math.ceil(load / k)
        at = self._inflight_at
        key_len = min(self.key_blocks, request.num_blocks)
        full_load = self._inflight_full.get(_full_key(request, key), 0) + 1
        # a deeper hold is private (a session's history) unless the whole prompt is hot too
        deep = key_len if full_load <= share else request.num_blocks
        held = match.any_tier
        out = [
            r
            for r in eligible
            if held.get(r.replica_id, 0) > deep
            or (r.replica_id in home and at.get((key, r.replica_id), 0) < per_replica)
        ]
        return out or [r for r in eligible if r.replica_id in home] or None

    def _cheapest(
        self,
        request: RouteRequest,
        eligible: list[ReplicaState],
        match: PrefixMatch,
        key: int,
        reason: str,
    ) -> RouteDecision:
        bt = request.block_tokens
        p = request.prompt_tokens
        inv_rate = 1.0 / self.prefill_tokens_per_s
        model = self.model
        best: list[ReplicaState] = []
        best_s = math.inf
        best_blocks = (0, 0, 0)
        dev, host, disk = match.within_tier
        dev_get = dev.get
        if host is dev and disk is dev:  # nothing below the device tier: the common fast path
            memo1: dict[int, float] = {}
            best_d = 0
            for r in eligible:
                d = dev_get(r.replica_id, 0)
                service_s = memo1.get(d)
                if service_s is None:
                    service_s = memo1[d] = service_time(model, p, bt, (d, 0, 0))
                ttft_s = r.queued_prefill_tokens * inv_rate + service_s
                if ttft_s < best_s:
                    best_s, best, best_d = ttft_s, [r], d
                elif ttft_s == best_s:
                    best.append(r)
            best_blocks = (best_d, 0, 0)
        else:
            memo: dict[tuple[int, int, int], float] = {}
            for r in eligible:
                rid = r.replica_id
                d = dev_get(rid, 0)
                h = host.get(rid, 0)
                blocks = (d, h - d, disk.get(rid, 0) - h)
                service_s = memo.get(blocks)
                if service_s is None:
                    service_s = memo[blocks] = service_time(model, p, bt, blocks)
                ttft_s = r.queued_prefill_tokens * inv_rate + service_s
                if ttft_s < best_s:
                    best_s, best, best_blocks = ttft_s, [r], blocks
                elif ttft_s == best_s:
                    best.append(r)
        chosen = best[0] if len(best) == 1 else tie_break(key, best)
        cached = sum(best_blocks)
        return RouteDecision(
            chosen.replica_id,
            self.name,
            reason,
            cached_blocks=cached,
            cached_tokens=min(cached * bt, p),
            onboard_blocks=best_blocks[1] + best_blocks[2],
            queue_tokens=chosen.queued_prefill_tokens,
            ttft_s=best_s,
            score=best_s,
        )

    def _hashed(self, cands: list[ReplicaState], key: int, reason: str) -> RouteDecision:
        r, _ = bounded_choice(self.rings.ring(cands), key, cands, self.epsilon)
        return RouteDecision(r.replica_id, self.name, reason, queue_tokens=r.queued_prefill_tokens)

    def on_dispatch(self, request: RouteRequest, decision: RouteDecision) -> None:
        key = prefix_key(request, self.key_blocks)
        self._inflight[key] = self._inflight.get(key, 0) + 1
        at = (key, decision.replica)
        self._inflight_at[at] = self._inflight_at.get(at, 0) + 1
        full = _full_key(request, key)
        self._inflight_full[full] = self._inflight_full.get(full, 0) + 1

    def on_complete(self, request: RouteRequest, replica: ReplicaId) -> None:
        key = prefix_key(request, self.key_blocks)
        _decrement(self._inflight, key)
        _decrement(self._inflight_at, (key, replica))
        _decrement(self._inflight_full, _full_key(request, key))


def _full_key(request: RouteRequest, key: int) -> int:
    """The key of the whole prompt's full blocks (the last chained hash covers them all)."""
    return int(request.block_hashes[-1]) if request.num_blocks else key


def _decrement(counts: dict[K, int], key: K) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
