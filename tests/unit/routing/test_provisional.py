"""Provisional entries: a router's own decisions credited until the engines' events land."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvtide.clock import ManualClock
from kvtide.routing.index import GlobalPrefixIndex, PrefixMatch
from kvtide.routing.policies import RoutingContext
from kvtide.routing.provisional import ProvisionalEntries
from kvtide.routing.registry import make_policy
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.types import ReplicaId

from .helpers import prompt

A, B = ReplicaId("a"), ReplicaId("b")


def test_entries_last_while_in_flight_and_hold_s_after() -> None:
    clock = ManualClock()
    entries = ProvisionalEntries(clock.now, lambda: 1.0)
    turn1 = prompt([1, 2, 3])
    turn2 = prompt([1, 2, 3, 4, 5])
    entries.record("t1", A, turn1)
    entries.record("t2", B, turn2)
    assert entries.match(turn2) == {A: 3, B: 5}
    assert entries.match(prompt([1, 2, 9])) == {A: 2, B: 2}
    assert entries.match(prompt([7])) == {}
    clock.advance(10.0)
    assert entries.match(turn2) == {A: 3, B: 5}  # in flight: no expiry
    entries.done("t1")
    clock.advance(0.5)
    entries.expire()
    assert entries.match(turn2) == {A: 3, B: 5}
    clock.advance(0.5)
    entries.expire()
    assert entries.match(turn2) == {B: 5}
    entries.done("t2")
    clock.advance(1.0)
    entries.expire()
    assert entries.match(turn2) == {} and len(entries) == 0


def test_overlapping_entries_keep_shared_blocks_until_the_last_expires() -> None:
    clock = ManualClock()
    entries = ProvisionalEntries(clock.now, lambda: 0.0)
    entries.record("t1", A, prompt([1, 2]))
    entries.record("t2", A, prompt([1, 2, 3, 4]))
    entries.done("t1")
    assert entries.match(prompt([1, 2, 3, 4])) == {A: 4}
    entries.done("t2")
    assert len(entries) == 0


def test_merge_takes_the_longer_prefix_per_replica_in_every_tier() -> None:
    clock = ManualClock()
    entries = ProvisionalEntries(clock.now, lambda: 0.0)
    hashes = prompt([1, 2, 3, 4])
    entries.record("t", A, hashes)
    indexed = PrefixMatch(4, ({B: 1}, {B: 2}, {A: 2, B: 2}))
    merged = entries.merge(indexed, hashes)
    assert merged.within_tier == ({B: 1, A: 4}, {B: 2, A: 4}, {A: 4, B: 2})


def test_cost_sends_the_next_turn_to_the_previous_turns_replica_before_any_event() -> None:
    clock = ManualClock()
    index = GlobalPrefixIndex()  # events lag: the index learns nothing during this test
    ctx = RoutingContext(index=index, clock=clock)
    ctx.health.lag(ReplicaId("r0"), 0.5)  # worst lag seen: entries outlive a request by it
    policy = make_policy("cost", ctx)
    reps = [ReplicaState(f"r{i}") for i in range(8)]
    # a shared system prompt already indexed everywhere, then one session's turns
    system = list(range(16))
    for r in reps:
        index.add(r.replica_id, prompt(system))
    turn1 = RouteRequest(prompt([*system, 100, 101]), 18 * 16, 16, request_id="t1")
    d1 = policy.choose(turn1, reps)
    policy.on_dispatch(turn1, d1)
    policy.on_complete(turn1, d1.replica)
    clock.advance(0.25)
    turn2 = RouteRequest(prompt([*system, 100, 101, 102, 103]), 20 * 16, 16, request_id="t2")
    d2 = policy.choose(turn2, reps)
    assert (d2.replica, d2.cached_blocks) == (d1.replica, 18)
    clock.advance(0.25)  # past the hold: the index alone answers again
    assert policy.choose(turn2, reps).cached_blocks == 16
    off = make_policy("cost", RoutingContext(index=index, clock=clock), {"provisional": False})
    off.on_dispatch(turn1, d1)
    assert off.choose(turn2, reps).cached_blocks == 16


def test_precise_credits_its_own_decisions_too() -> None:
    clock = ManualClock()
    index = GlobalPrefixIndex()
    ctx = RoutingContext(index=index, clock=clock)
    policy = make_policy("precise", ctx)
    reps = [ReplicaState(f"r{i}") for i in range(8)]
    turn1 = RouteRequest(prompt([1, 2, 3]), 48, 16, request_id="t1")
    d1 = policy.choose(turn1, reps)
    assert d1.reason == "cold"
    policy.on_dispatch(turn1, d1)
    turn2 = RouteRequest(prompt([1, 2, 3, 4]), 64, 16, request_id="t2")
    d2 = policy.choose(turn2, reps)
    assert (d2.replica, d2.reason, d2.cached_blocks) == (d1.replica, "affinity", 3)
    policy.on_complete(turn1, d1.replica)  # no lag seen: the entry ends with its request
    assert policy.choose(turn2, reps).reason == "cold"


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["record", "done", "advance", "extend"]),
            st.integers(0, 7),  # request
            st.sampled_from([A, B, ReplicaId("c")]),
            st.lists(st.integers(0, 2), min_size=0, max_size=6),  # the prompt's blocks
        ),
        max_size=60,
    ),
    st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=7), min_size=1, max_size=5),
)
@example(  # extended after its end, within hold_s
    [("record", 0, A, [1, 2]), ("done", 0, A, []), ("extend", 0, A, [2, 2])], [[1, 2, 2, 2]]
)
@example(  # extended in flight, then a second entry of the same id
    [
        ("record", 0, A, [1]),
        ("extend", 0, A, [2]),
        ("done", 0, A, []),
        ("record", 0, B, [1, 1]),
        ("extend", 0, B, [0]),
        ("advance", 0, A, []),
        ("advance", 0, A, []),
        ("advance", 0, A, []),
    ],
    [[1, 2], [1, 1, 0]],
)
def test_matches_a_reference_that_scans_every_unexpired_entry(
    ops: list[tuple[str, int, ReplicaId, list[int]]], probes: list[list[int]]
) -> None:
    """Differential: per replica, the longest prefix of a probe whose blocks all belong to
    one of its entries in flight or within ``hold_s`` of their end, found by a scan; an
    entry extended (``extend``: the prompt's later blocks, known after it was recorded) holds
    them too, in flight or ending, and gives them up with the rest."""
    clock = ManualClock()
    entries = ProvisionalEntries(clock.now, lambda: 1.0)
    live: dict[str, tuple[ReplicaId, set[int]]] = {}
    ended: list[tuple[float, ReplicaId, set[int]]] = []
    recorded: dict[str, tuple[list[int], set[int]]] = {}  # the latest entry of each id
    for op, i, replica, ids in ops:
        rid = f"q{i}"
        if op == "record":
            hashes = prompt(ids)
            entries.record(rid, replica, hashes)
            if hashes and rid not in live:
                live[rid] = (replica, set(hashes.tolist()))
                recorded[rid] = (list(ids), live[rid][1])
        elif op == "done":
            entries.done(rid)
            if rid in live:
                ended.append((clock.now() + 1.0, *live.pop(rid)))
        elif op == "extend":
            if rid in recorded:
                longer = recorded[rid][0] + ids
                entries.extend(rid, prompt(longer))
                # its latest entry's set, live or ended (one gone by now counts for nothing)
                recorded[rid][1].update(prompt(longer).tolist())
                recorded[rid] = (longer, recorded[rid][1])
        else:
            clock.advance(0.4)
    entries.expire()
    now = clock.now()
    held: dict[ReplicaId, set[int]] = {}
    for replica, blocks in [*live.values(), *((r, b) for t, r, b in ended if t > now)]:
        held.setdefault(replica, set()).update(blocks)
    assert len(entries) == len(set().union(*held.values()))
    for ids in probes:
        ints = prompt(ids).tolist()
        want = {}
        for replica, blocks in held.items():
            n = 0
            while n < len(ints) and ints[n] in blocks:
                n += 1
            if n:
                want[replica] = n
        assert entries.match(prompt(ids)) == want
