"""Parity: one trace routed by ``kvtide simulate``'s ``Fleet`` and by the gateway's routing
path, same policy, one ``ManualClock``: the same replica for every request.

What is covered, precisely. The simulator side is the real ``Fleet`` (its ``submit``, its
simulated engines and caches, its event channel and ingest). The gateway side is the real
``Gateway`` (built with the injected clock, never started: no HTTP, no engines) and the two
calls its HTTP handler makes for a ``/v1/completions`` request whose ``prompt`` is token ids:
``PromptHasher.completion`` + ``Gateway.route_request`` build the ``RouteRequest``, and
``Gateway.choose`` (what ``Proxy.forward`` calls) picks the replica. What the gateway learns
from the engines over the network is fed from the simulator's engines instead, in the same
order on the same clock: every KV-event batch the simulator's ingest commits is applied to the
gateway's index, and each first token / decode progress / finish the simulator's router hears
is told to the gateway's router for the gateway's own route and decision. Not covered: the
HTTP layer, ZMQ event translation, /metrics scraping (the capacity the scrape would give is
set from the simulator's), which the integration tests exercise against real engines.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest

from kvtide.clock import ManualClock
from kvtide.core.events import KVEvent
from kvtide.engine.timing import IterationTimer
from kvtide.gateway.app import Gateway
from kvtide.gateway.config import GatewayConfig, ReplicaSpec
from kvtide.routing import GlobalPrefixIndex, RouteDecision, RouteRequest, RoutingContext
from kvtide.routing.identity import RequestHasher
from kvtide.routing.specs import build_policy
from kvtide.sim.fleet import Fleet, FleetConfig
from kvtide.sim.loop import EventLoop
from kvtide.text import smollm2
from kvtide.types import ReplicaId, Request

BLOCK = 16
MODEL = "m"
REPLICAS = 3


class FlatCost:
    def prefill_compute_time(self, new_tokens: int, cached_tokens: int) -> float:
        return 0.0002 * new_tokens

    def prefill_memory_time(self, new_tokens: int, cached_tokens: int) -> float:
        return 0.0

    def decode_step_time(self, batch: int, context_tokens: int) -> float:
        return 0.005


def trace(seed: int, n: int) -> list[Request]:
    """Multi-turn conversations over a few shared system prompts, Poisson arrivals."""
    rng = random.Random(seed)
    systems = [rng.sample(range(1, 30_000), 96) for _ in range(3)]
    convs: list[list[int]] = []
    out: list[Request] = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(40.0)
        if not convs or rng.random() < 0.3:
            convs.append(list(rng.choice(systems)))
        conv = rng.choice(convs)
        conv += rng.sample(range(1, 30_000), rng.randint(8, 60))
        tokens = np.array(conv, dtype=np.int32)
        out.append(Request(f"q{i}", t, len(conv), rng.randint(4, 24), BLOCK, token_ids=tokens))
        conv += rng.sample(range(1, 30_000), 12)  # the answer, sent back next turn
    return out


def run_both(
    policy: str, requests: list[Request], feed_events: bool = True
) -> tuple[list[str], list[str], int]:
    clock = ManualClock(0.0)
    loop = EventLoop(clock)
    sim_index = GlobalPrefixIndex()
    ctx = RoutingContext(block_tokens=BLOCK, clock=clock, index=sim_index)
    specs = tuple(ReplicaSpec(f"http://r{i}", MODEL) for i in range(REPLICAS))  # ids r0, r1..
    gw = Gateway(GatewayConfig(replicas=specs, policy=policy), smollm2(), clock=clock)
    assert gw.prompts.is_exact  # the event-fed index, as in front of engines with events
    # --- taps: what the engines tell the gateway, from the simulator's engines, in order --
    apply_all = sim_index.apply_all

    teed: list[int] = []

    def tee_apply(replica: ReplicaId, events: Iterable[KVEvent]) -> Any:
        batch = list(events)
        teed.append(len(batch))
        gw.index.apply_all(replica, batch)
        return apply_all(replica, batch)

    clear = sim_index.clear_replica

    def tee_clear(replica: ReplicaId) -> Any:
        gw.index.clear_replica(replica)
        return clear(replica)

    if feed_events:
        sim_index.apply_all = tee_apply  # type: ignore[method-assign]
        sim_index.clear_replica = tee_clear  # type: ignore[method-assign]

    # the Fleet binds the index's methods now: the taps above must be in place first
    fleet = Fleet(
        FleetConfig(num_replicas=REPLICAS, capacity_blocks=256, block_tokens=BLOCK),
        build_policy(policy, ctx),
        sim_index,
        IterationTimer(FlatCost(), 0.0),
        loop,
        hasher=RequestHasher(BLOCK, model=MODEL),
        rng=random.Random(1),
        health=ctx.health,
    )
    tenant = gw.tenants.authenticate(None)
    for sim_r in fleet.replicas:
        gw_state = gw.replicas.by_id[sim_r.state.replica_id].state
        gw_state.capacity_blocks = sim_r.state.capacity_blocks  # what /metrics would give

    sim_choices: list[str] = []
    gw_choices: list[str] = []
    gw_flights: dict[str, tuple[RouteRequest, RouteDecision]] = {}
    sim_routes: dict[str, RouteRequest] = {}
    sim_router = fleet.router

    route = sim_router.route

    def tap_route(request: RouteRequest, among: Any = None) -> RouteDecision:
        decision = route(request, among)
        sim_choices.append(decision.replica)
        sim_routes[request.request_id] = request
        return decision

    prefill_done = sim_router.prefill_done

    def tap_prefill(request: RouteRequest, decision: RouteDecision, cached: Any = None) -> None:
        prefill_done(request, decision, cached)
        gw.router.prefill_done(*gw_flights[request.request_id], cached)

    complete = sim_router.complete

    def tap_complete(request: RouteRequest, decision: RouteDecision, output: int) -> None:
        flush()
        complete(request, decision, output)
        gw.router.complete(*gw_flights.pop(request.request_id), output)

    sim_router.route = tap_route  # type: ignore[method-assign]
    sim_router.prefill_done = tap_prefill  # type: ignore[method-assign]
    sim_router.complete = tap_complete  # type: ignore[method-assign]
    # decode progress: ``Fleet._wake`` tells its replica state after the wake's first tokens
    # and before its finishes; the gateway's state is told at that same point
    wake = fleet._wake
    pending: list[Any] = []  # [replica, engine decode tokens before the wake] during a wake

    def flush() -> None:
        if pending:
            replica, before = pending.pop()
            decoded = replica.engine.stats.decode_tokens - before
            if decoded:
                gw.replicas.by_id[replica.state.replica_id].state.decode_progress(decoded)

    def tap_wake(arg: Any) -> None:
        replica, generation = arg
        if generation == replica.generation:
            pending.append((replica, replica.engine.stats.decode_tokens))
        wake(arg)
        flush()

    fleet._wake = tap_wake  # type: ignore[method-assign]

    def arrive(request: Request) -> None:
        # the gateway first: both routers see the same state before this request
        assert request.token_ids is not None
        body = {"model": MODEL, "prompt": [int(t) for t in request.token_ids]}
        prompt = gw.prompts.completion(body, gw.seed(MODEL, tenant.salt))
        gw_route = gw.route_request(prompt, tenant, request.output_tokens)
        chosen = gw.choose(gw_route, MODEL)
        assert chosen is not None
        gw_choices.append(chosen[0].replica_id)
        fleet.submit(request)
        sim_route = sim_routes[request.request_id]
        assert gw_route.block_hashes.tolist() == sim_route.block_hashes.tolist()
        # the simulator's acks arrive under its request id
        gw_flights[request.request_id] = (gw_route, chosen[1])

    for r in requests:
        loop.at(r.arrival_s, arrive, r)
    loop.run()
    assert not gw_flights  # every request finished on both sides
    return sim_choices, gw_choices, sum(teed)


@pytest.mark.parametrize("policy", ["cost", "precise", "chash", "least_load"])
def test_gateway_routing_makes_the_simulators_decisions(policy: str) -> None:
    requests = trace(7, 300)
    sim, gw, events = run_both(policy, requests)
    assert events > 300  # the gateway's index was fed the simulated engines' KV events
    assert len(sim) == len(gw) == len(requests)
    mismatches = [(i, s, g) for i, (s, g) in enumerate(zip(sim, gw, strict=True)) if s != g]
    assert not mismatches, f"{len(mismatches)} differ, first {mismatches[:5]}"
    assert len(set(sim)) == REPLICAS  # the trace exercises every replica


def test_the_parity_harness_sees_a_gateway_that_misses_the_engines_events() -> None:
    """The control: the same run without the KV events fed to the gateway's index makes
    other decisions, so the parity above depends on the gateway reading the same index."""
    sim, gw, events = run_both("cost", trace(7, 300), feed_events=False)
    assert events == 0
    assert sum(s != g for s, g in zip(sim, gw, strict=True)) > 0
