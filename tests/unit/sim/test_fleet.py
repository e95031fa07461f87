"""The fleet: routing, KV events with delay and loss, replica failures, disaggregation."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

import numpy as np
import pytest

from kvtide.clock import ManualClock
from kvtide.core.events import BlockStored, KVEvent
from kvtide.core.hashing import BlockHashes, hash_tokens
from kvtide.core.node import Node
from kvtide.engine.scheduler import EngineConfig
from kvtide.engine.timing import IterationTimer
from kvtide.routing import GlobalPrefixIndex, ReplicaState, RouteDecision, RouteRequest
from kvtide.routing.affinity import Precise
from kvtide.routing.policies import RoundRobin, RoutingContext
from kvtide.sim.fleet import Fleet, FleetConfig, Outage
from kvtide.sim.loop import EventLoop
from kvtide.types import ReplicaId, Request

BLOCK = 4


class FlatCost:
    def prefill_compute_time(self, new_tokens: int, cached_tokens: int) -> float:
        return 0.001 * new_tokens

    def prefill_memory_time(self, new_tokens: int, cached_tokens: int) -> float:
        return 0.0

    def decode_step_time(self, batch: int, context_tokens: int) -> float:
        return 0.010


class RecordingRouter(RoundRobin):
    def __init__(self) -> None:
        super().__init__(RoutingContext(clock=ManualClock(), block_tokens=BLOCK))
        self.chosen: list[ReplicaId] = []
        self.completed: list[tuple[str, ReplicaId]] = []

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        decision = super().choose(request, replicas)
        self.chosen.append(decision.replica)
        return decision

    def on_complete(self, request: RouteRequest, replica: ReplicaId) -> None:
        self.completed.append((request.request_id, replica))


class RecordingIndex:
    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.applied: list[tuple[float, ReplicaId, KVEvent]] = []
        self.cleared: list[tuple[float, ReplicaId]] = []

    def apply_all(self, replica: ReplicaId, events: Iterable[KVEvent]) -> None:
        self.applied.extend((self.clock.now(), replica, e) for e in events)

    def clear_replica(self, replica: ReplicaId) -> None:
        self.cleared.append((self.clock.now(), replica))


def hasher(request: Request) -> BlockHashes:
    assert request.token_ids is not None
    return hash_tokens(request.token_ids, BLOCK, seed=3)


def make_fleet(
    index: object = None, transfer_s_per_token: float = 0.001, **config: object
) -> tuple[Fleet, RecordingRouter, RecordingIndex, EventLoop]:
    clock = ManualClock()
    loop = EventLoop(clock)
    router = RecordingRouter()
    index = index or RecordingIndex(clock)
    cfg = FleetConfig(capacity_blocks=64, block_tokens=BLOCK, **config)  # type: ignore[arg-type]
    fleet = Fleet(
        cfg,
        router,
        index,  # type: ignore[arg-type]
        IterationTimer(FlatCost(), 0.0),
        loop,
        hasher=hasher,
        rng=random.Random(0),
        transfer_s=lambda tokens: transfer_s_per_token * tokens,
        recompute_s=FlatCost().prefill_compute_time,
    )
    return fleet, router, index, loop  # type: ignore[return-value]


def arrive(fleet: Fleet, loop: EventLoop, rid: str, at_s: float, first_token: int) -> None:
    tokens = np.arange(first_token, first_token + 8, dtype=np.int32)
    req = Request(rid, at_s, 8, 3, BLOCK, token_ids=tokens)
    loop.at(at_s, fleet.submit, req)


def test_requests_spread_and_finish_with_exact_times() -> None:
    fleet, router, _index, loop = make_fleet(num_replicas=2)
    arrive(fleet, loop, "a", 0.0, 1)
    arrive(fleet, loop, "b", 0.0, 100)
    loop.run()
    assert router.chosen == ["r0", "r1"]
    records = sorted(fleet.metrics.records, key=lambda r: r.request_id)
    assert [r.first_token_s for r in records] == pytest.approx([0.008, 0.008])
    assert [r.finish_s for r in records] == pytest.approx([0.028, 0.028])


def test_a_new_arrival_cuts_a_decode_run_at_the_next_step() -> None:
    fleet, _, _, loop = make_fleet(num_replicas=1)
    tokens = np.arange(1, 9, dtype=np.int32)
    loop.at(0.0, fleet.submit, Request("long", 0.0, 8, 100, BLOCK, token_ids=tokens))
    arrive(fleet, loop, "late", 0.0500, 500)  # lands inside decode step 5 (0.048..0.058)
    loop.run()
    late = next(r for r in fleet.metrics.records if r.request_id == "late")
    # joins at 0.058, in one pass with the running request: 8 + 1 tokens of compute
    assert late.first_token_s == pytest.approx(0.058 + 0.009)


def test_kv_events_reach_the_router_after_the_delay() -> None:
    fleet, _router, index, loop = make_fleet(num_replicas=1, event_delay_s=0.5)
    arrive(fleet, loop, "a", 0.0, 1)
    loop.run()
    stored = [(t, rid) for t, rid, e in index.applied if isinstance(e, BlockStored)]
    # Announced when the 8-token prefill that computes them ends (0.008), then delayed.
    assert stored == [(pytest.approx(0.008 + 0.5), "r0")]


def test_lost_event_batches_are_noticed_and_resynced() -> None:
    index = GlobalPrefixIndex(1024)
    fleet, _, _, loop = make_fleet(index, num_replicas=1, event_loss=0.5)
    for i in range(40):
        arrive(fleet, loop, f"q{i}", 0.1 * i, 1 + 1000 * i)
    loop.run()
    assert fleet.ingest is not None
    counters = fleet.ingest.counters
    assert counters.gaps > 0 and counters.resyncs == counters.gaps
    assert fleet.channel.counters.dropped > 0


def test_a_failed_replica_hands_its_requests_to_the_others() -> None:
    fleet, router, index, loop = make_fleet(num_replicas=2, outages=(Outage(0, 0.004, 1.0),))
    arrive(fleet, loop, "a", 0.0, 1)  # r0, dies half way through its prefill
    arrive(fleet, loop, "b", 0.0, 100)  # r1
    arrive(fleet, loop, "c", 2.0, 200)  # r0 is back (but not its turn)
    loop.run()
    records = {r.request_id: r for r in fleet.metrics.records}
    assert router.chosen == ["r0", "r1", "r1", "r1"]  # the round-robin counter runs on
    assert records["a"].arrival_s == 0.0
    assert records["a"].first_token_s > 0.008  # restarted on r1 behind b
    assert index.cleared == [(0.004, "r0")]
    assert ("a", "r0") in router.completed  # the router hears that a left r0
    assert records["c"].first_token_s == pytest.approx(2.008)


def test_requests_wait_while_every_replica_is_down() -> None:
    fleet, _, _, loop = make_fleet(num_replicas=1, outages=(Outage(0, 0.0, 1.0),))
    arrive(fleet, loop, "a", 0.5, 1)
    loop.run()
    (record,) = fleet.metrics.records
    assert record.arrival_s == 0.5 and record.first_token_s == pytest.approx(1.008)


def test_disaggregated_requests_move_to_a_decode_replica() -> None:
    fleet, _, _, loop = make_fleet(num_replicas=1, num_decode_replicas=1)
    arrive(fleet, loop, "a", 0.0, 1)
    loop.run()
    (record,) = fleet.metrics.records
    assert record.first_token_s == pytest.approx(0.008)
    # 8 ms of KV transfer, then tokens 2 and 3 on the decode replica
    assert record.finish_s == pytest.approx(0.008 + 0.008 + 0.020)
    assert record.prefill_tokens == 8


def test_a_global_kv_pool_fetches_a_prefix_from_a_peer() -> None:
    fleet, _, _, loop = make_fleet(num_replicas=2, kv_transfer=True, transfer_s_per_token=0.0005)
    arrive(fleet, loop, "a", 0.0, 1)  # r0 computes blocks 1..8
    arrive(fleet, loop, "b", 1.0, 1)  # r1 (round robin) fetches them: 4 ms instead of 8
    loop.run()
    b = next(r for r in fleet.metrics.records if r.request_id == "b")
    assert (b.hit_tokens, b.fetched_tokens) == (8, 8)
    assert b.prefill_tokens == 1  # the last prompt token is always computed
    assert b.first_token_s == pytest.approx(1.0 + 0.001 + 0.004)
    assert fleet.hit_tokens_by_tier == {"device": 0, "remote": 8}


def test_the_event_fed_index_ends_holding_exactly_what_each_cache_holds() -> None:
    """Chunked prefills (4 tokens an iteration), shared prefixes, evictions, two replicas:
    blocks announced as their chunks complete add up to each cache's contents."""
    index = GlobalPrefixIndex(1024)
    engine = EngineConfig(max_batched_tokens=4)
    fleet, _, _, loop = make_fleet(index, num_replicas=2, engine=engine)
    seen: set[int] = set()
    for i in range(60):
        start = 1 + 50 * (i % 40)
        tokens = np.arange(start, start + 24 + i % 9, dtype=np.int32)
        req = Request(f"q{i}", 0.003 * i, len(tokens), 1 + i % 4, BLOCK, token_ids=tokens)
        seen.update(hasher(req).tolist())
        loop.at(req.arrival_s, fleet.submit, req)
    loop.run()
    assert sum(r.cache.tree.num_evicted_total for r in fleet.replicas) > 0
    for replica in fleet.replicas:
        rid = replica.state.replica_id
        assert {h for h in seen if index.holds(rid, h)} == cached_blocks(replica.cache.tree.root)


def cached_blocks(root: Node) -> set[int]:
    out: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        out.update(BlockHashes(node.key).tolist())
        stack.extend(node.children.values())
    return out


def test_precise_routing_follows_the_blocks_once_they_are_computed() -> None:
    clock = ManualClock()
    loop = EventLoop(clock)
    index = GlobalPrefixIndex(1024)
    policy = Precise(RoutingContext(clock=clock, block_tokens=BLOCK, index=index))
    fleet = Fleet(
        FleetConfig(num_replicas=4, capacity_blocks=64, block_tokens=BLOCK),
        policy,
        index,
        IterationTimer(FlatCost(), 0.0),
        loop,
        hasher=hasher,
        rng=random.Random(0),
    )
    prompt = np.arange(1, 33, dtype=np.int32)  # 8 blocks: a 32 ms prefill
    first = Request("first", 0.0, 32, 1, BLOCK, token_ids=prompt)
    again = Request("again", 1.0, 32, 1, BLOCK, token_ids=prompt)
    loop.at(0.0, fleet.submit, first)
    loop.at(1.0, fleet.submit, again)
    loop.run()
    records = {r.request_id: r for r in fleet.metrics.records}
    assert records["again"].hit_tokens == 32  # routed to the replica that computed it
    assert fleet.route_reasons  # the policy explained itself
