"""Consistent hashing: stable placement, ~1/n movement, bounded loads, rendezvous."""

from __future__ import annotations

import random

import pytest

from kvtide.clock import ManualClock
from kvtide.core.hashing import BlockHashes
from kvtide.errors import ConfigError, NoHealthyReplica
from kvtide.routing.chash import HashRing, bounded_choice, prefix_key, rendezvous_top
from kvtide.routing.policies import RoutingContext
from kvtide.routing.registry import make_policy
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.types import ReplicaId

from .helpers import prompt

IDS = [ReplicaId(f"r{i}") for i in range(16)]


def _keys(n: int) -> list[int]:
    rng = random.Random(5)
    return [rng.getrandbits(64) for _ in range(n)]


def test_ring_is_the_same_in_every_process_and_order() -> None:
    a = HashRing(IDS)
    b = HashRing(reversed(IDS))
    assert [a.owner(k) for k in _keys(200)] == [b.owner(k) for k in _keys(200)]
    assert list(a.walk(123))[:1] == [a.owner(123)]
    assert sorted(a.walk(123)) == sorted(IDS)


@pytest.mark.parametrize("change", ["join", "leave"])
def test_a_membership_change_moves_about_one_nth_of_the_keys(change: str) -> None:
    keys = _keys(20_000)
    before = HashRing(IDS)
    after = HashRing([*IDS, ReplicaId("new")] if change == "join" else IDS[1:])
    moved = sum(before.owner(k) != after.owner(k) for k in keys) / len(keys)
    expected = 1 / 17 if change == "join" else 1 / 16
    assert abs(moved - expected) < 0.35 * expected
    # and only keys that involve the changed replica move
    for k in keys[:2000]:
        if before.owner(k) != after.owner(k):
            assert ReplicaId("new") in (after.owner(k),) or before.owner(k) == IDS[0]


def test_keys_spread_evenly_over_replicas() -> None:
    ring = HashRing(IDS)
    counts: dict[ReplicaId, int] = {}
    for k in _keys(32_000):
        counts[ring.owner(k)] = counts.get(ring.owner(k), 0) + 1
    assert max(counts.values()) / (32_000 / 16) < 1.3


def test_bounded_choice_walks_past_replicas_at_the_cap() -> None:
    reps = [ReplicaState(r) for r in IDS[:4]]
    ring = HashRing(r.replica_id for r in reps)
    key = 42
    order = list(ring.walk(key))
    by_id = {r.replica_id: r for r in reps}
    by_id[order[0]].num_requests = 3  # total 3 + 1 new: cap = ceil(1.25 * 4 / 4) = 2
    chosen, skipped = bounded_choice(ring, key, reps, epsilon=0.25)
    assert (chosen.replica_id, skipped) == (order[1], 1)


def test_prefix_key_uses_the_chained_hash_of_the_first_k_blocks() -> None:
    p = prompt([1, 2, 3, 4, 5])
    req = RouteRequest(p, 80, 16, request_id="x")
    assert prefix_key(req, 2) == p[1]
    assert prefix_key(req, 99) == p[4]
    empty = RouteRequest(BlockHashes(), 5, 16, request_id="x", session_id="s")
    assert prefix_key(empty, 2) == prefix_key(RouteRequest(BlockHashes(), 9, 16, session_id="s"), 2)


def test_rendezvous_top_is_stable_when_others_leave() -> None:
    top = rendezvous_top(7, IDS, 3)
    assert len(set(top)) == 3
    rest = [r for r in IDS if r not in top[1:]]
    assert rendezvous_top(7, rest, 1) == top[:1]


def test_chash_policy_sends_a_prefix_to_one_replica_until_it_fills() -> None:
    policy = make_policy(
        "chash", RoutingContext(clock=ManualClock()), {"epsilon": 0.5, "key_blocks": 2}
    )
    reps = [ReplicaState(r) for r in IDS[:4]]
    req = RouteRequest(prompt([1, 2, 3]), 48, 16)
    first = policy.choose(req, reps)
    assert first.reason == "hash"
    by_id = {r.replica_id: r for r in reps}
    by_id[first.replica].num_requests = 5  # cap = ceil(1.5 * 6 / 4) = 3
    second = policy.choose(req, reps)
    assert second.replica != first.replica and second.reason == "overload"


def test_chash_needs_a_healthy_replica_and_sane_options() -> None:
    policy = make_policy("chash", RoutingContext(clock=ManualClock()))
    with pytest.raises(NoHealthyReplica):
        policy.choose(RouteRequest(prompt([1]), 16, 16), [ReplicaState("a", healthy=False)])
    with pytest.raises(ConfigError):
        make_policy("chash", RoutingContext(clock=ManualClock()), options={"epsilon": 0})
    with pytest.raises(ConfigError):
        make_policy("chash", RoutingContext(clock=ManualClock()), options={"nope": 1})
    with pytest.raises(ConfigError):
        make_policy("nope", RoutingContext(clock=ManualClock()))
