"""Peer routers reimplemented from their documentation, for comparison in the same harness.

- ``peer_sglang``: SGLang router ``cache_aware`` (sgl-router docs; /work/shared/PEERS.md):
  per-worker approximate trees; when load is imbalanced (max - min > ``balance_abs`` and
  max > ``balance_rel`` x min, load = running requests) the least-loaded worker; else the
  longest match if its match ratio exceeds ``cache_threshold``; else the smallest tree. The
  real trees are character-level; here they are block-level shadow caches.
- ``peer_dynamo``: Dynamo KV router (docs.nvidia.com/dynamo, "KV Router"): cost =
  ``overlap_weight`` x potential prefill blocks + potential active decode blocks, lowest wins;
  with ``temperature`` > 0 a softmax over range-normalised costs is sampled.
- ``peer_llmd``: llm-d inference scheduler default profile: 3 x prefix-cache score + 2 x queue
  score + 2 x kv-cache-utilisation score, each in [0, 1]; the highest wins, ties at random.
- ``peer_preble``: Preble E2 (Srivatsa et al., ICLR'25): exploit the replica with the longest
  cached prefix when its cached tokens exceed the new ones, else explore the least loaded.
  Preble's load is the recent prefill + decode work; here the queued prefill plus decode
  context tokens. Its post-assignment rebalancing and prefix autoscaling are not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvtide.errors import ConfigError
from kvtide.routing.decision import RouteDecision
from kvtide.routing.index import PrefixMatch
from kvtide.routing.policies import BasePolicy, RoutingContext
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.routing.shadow import ShadowFleet
from kvtide.types import ReplicaId


class _MatchSource:
    """Where a peer learns cached prefixes: the event-fed index, or shadow caches of its own."""

    def __init__(
        self,
        ctx: RoutingContext,
        policy: str,
        source: str,
        capacity_blocks: int,
        ttl_s: float | None,
    ) -> None:
        if source not in ("precise", "approx"):
            raise ConfigError(f"{policy}: index must be 'precise' or 'approx', got {source!r}")
        self.fleet: ShadowFleet | None = None
        if source == "approx":
            self.fleet = ShadowFleet(
                capacity_blocks, ctx.clock, block_tokens=ctx.block_tokens, ttl_s=ttl_s
            )
            self.index = None
        else:
            self.index = ctx.require_index(policy)

    def match(self, request: RouteRequest) -> PrefixMatch:
        if self.fleet is not None:
            return self.fleet.match(request.block_hashes)
        if request.prefix_match is not None:
            return request.prefix_match
        assert self.index is not None
        return self.index.match(request.block_hashes)

    def record(self, request: RouteRequest, decision: RouteDecision) -> None:
        if self.fleet is not None:
            self.fleet.record(decision.replica, request.block_hashes)


def _decision(
    policy: str, reason: str, r: ReplicaState, blocks: int, request: RouteRequest, score: float
) -> RouteDecision:
    return RouteDecision(
        r.replica_id,
        policy,
        reason,
        cached_blocks=blocks,
        cached_tokens=min(blocks * request.block_tokens, request.prompt_tokens),
        queue_tokens=r.queued_prefill_tokens,
        score=score,
    )


class PeerSglang(BasePolicy):
    name = "peer_sglang"

    def __init__(
        self,
        ctx: RoutingContext,
        cache_threshold: float = 0.3,
        balance_abs: int = 64,
        balance_rel: float = 1.5,
        capacity_blocks: int = 65_536,
        ttl_s: float | None = None,
    ) -> None:
        super().__init__(ctx)
        self.cache_threshold = float(cache_threshold)
        self.balance_abs = int(balance_abs)
        self.balance_rel = float(balance_rel)
        self.source = _MatchSource(ctx, self.name, "approx", int(capacity_blocks), ttl_s)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        cands = self.healthy(replicas)
        loads = [r.num_requests for r in cands]
        hi, lo = max(loads), min(loads)
        if hi - lo > self.balance_abs and hi > self.balance_rel * lo:
            r = cands[loads.index(lo)]
            return _decision(self.name, "load", r, 0, request, float(lo))
        match = self.source.match(request)
        device = match.device
        best, best_blocks = None, 0
        for r in cands:
            b = device.get(r.replica_id, 0)
            if b > best_blocks:
                best, best_blocks = r, b
        n = max(request.num_blocks, 1)
        if best is not None and best_blocks / n > self.cache_threshold:
            return _decision(self.name, "affinity", best, best_blocks, request, best_blocks / n)
        fleet = self.source.fleet
        assert fleet is not None
        sizes = [fleet.held_blocks(r.replica_id) for r in cands]
        r = cands[sizes.index(min(sizes))]
        return _decision(self.name, "explore", r, device.get(r.replica_id, 0), request, 0.0)

    def on_dispatch(self, request: RouteRequest, decision: RouteDecision) -> None:
        self.source.record(request, decision)


class PeerDynamo(BasePolicy):
    name = "peer_dynamo"

    def __init__(
        self,
        ctx: RoutingContext,
        overlap_weight: float = 1.0,
        temperature: float = 0.0,
        index: str = "precise",
        capacity_blocks: int = 65_536,
    ) -> None:
        super().__init__(ctx)
        if temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {temperature}")
        self.overlap_weight = float(overlap_weight)
        self.temperature = float(temperature)
        self.source = _MatchSource(ctx, self.name, index, int(capacity_blocks), None)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        cands = self.healthy(replicas)
        device = self.source.match(request).device
        bt = request.block_tokens
        p = request.prompt_tokens
        new_blocks = -(-p // bt)
        w = self.overlap_weight
        costs = []
        for r in cands:
            o = device.get(r.replica_id, 0)
            prefill_blocks = (r.queued_prefill_tokens + p - o * bt) / bt
            active_blocks = r.decode_blocks + new_blocks
            costs.append(w * prefill_blocks + active_blocks)
        i = self._pick(costs)
        r = cands[i]
        return _decision(self.name, "cost", r, device.get(r.replica_id, 0), request, costs[i])

    def _pick(self, costs: list[float]) -> int:
        rng = self.ctx.rng
        if self.temperature <= 0:
            low = min(costs)
            ties = [i for i, c in enumerate(costs) if c == low]
            return ties[0] if len(ties) == 1 else rng.choice(ties)
        lo, hi = min(costs), max(costs)
        span = hi - lo or 1.0
        weights = [math.exp(-(c - lo) / span / self.temperature) for c in costs]
        return rng.choices(range(len(costs)), weights=weights)[0]

    def on_dispatch(self, request: RouteRequest, decision: RouteDecision) -> None:
        self.source.record(request, decision)


class PeerLlmd(BasePolicy):
    name = "peer_llmd"

    def __init__(
        self,
        ctx: RoutingContext,
        prefix_weight: float = 3.0,
        queue_weight: float = 2.0,
        kv_weight: float = 2.0,
        index: str = "precise",
        capacity_blocks: int = 65_536,
    ) -> None:
        super().__init__(ctx)
        self.weights = (float(prefix_weight), float(queue_weight), float(kv_weight))
        self.source = _MatchSource(ctx, self.name, index, int(capacity_blocks), None)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        cands = self.healthy(replicas)
        device = self.source.match(request).device
        n = max(request.num_blocks, 1)
        waiting = [r.num_requests - r.decode_sequences for r in cands]
        qmax, qmin = max(waiting), min(waiting)
        wp, wq, wk = self.weights
        scores = []
        for r, q in zip(cands, waiting, strict=True):
            prefix = device.get(r.replica_id, 0) / n
            queue = 1.0 if qmax == qmin else (qmax - q) / (qmax - qmin)
            scores.append(wp * prefix + wq * queue + wk * (1.0 - r.kv_utilization))
        top = max(scores)
        ties = [i for i, s in enumerate(scores) if s == top]
        i = ties[0] if len(ties) == 1 else self.ctx.rng.choice(ties)
        r = cands[i]
        return _decision(self.name, "score", r, device.get(r.replica_id, 0), request, top)

    def on_dispatch(self, request: RouteRequest, decision: RouteDecision) -> None:
        self.source.record(request, decision)


class PeerPreble(BasePolicy):
    name = "peer_preble"

    def __init__(
        self,
        ctx: RoutingContext,
        index: str = "approx",
        capacity_blocks: int = 65_536,
        ttl_s: float | None = None,
    ) -> None:
        super().__init__(ctx)
        self.source = _MatchSource(ctx, self.name, index, int(capacity_blocks), ttl_s)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        cands = self.healthy(replicas)
        device = self.source.match(request).device
        bt = request.block_tokens
        p = request.prompt_tokens
        best_blocks = max((device.get(r.replica_id, 0) for r in cands), default=0)
        cached = min(best_blocks * bt, p)
        if best_blocks and cached > p - cached:
            holders = [r for r in cands if device.get(r.replica_id, 0) == best_blocks]
            r = min(holders, key=_work)
            return _decision(self.name, "exploit", r, best_blocks, request, float(_work(r)))
        r = min(cands, key=_work)
        return _decision(
            self.name, "explore", r, device.get(r.replica_id, 0), request, float(_work(r))
        )

    def on_dispatch(self, request: RouteRequest, decision: RouteDecision) -> None:
        self.source.record(request, decision)

    def forget(self, replica: ReplicaId) -> None:
        if self.source.fleet is not None:
            self.source.fleet.forget(replica)


def _work(r: ReplicaState) -> int:
    return r.queued_prefill_tokens + r.decode_tokens
