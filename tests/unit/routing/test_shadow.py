"""ShadowFleet as its own index: its matches are the longest prefixes its trees hold, whatever
was recorded, evicted, expired or forgotten; evictions reach removal listeners."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.clock import ManualClock
from kvtide.core.hashing import BlockHashes
from kvtide.errors import UsageError
from kvtide.routing.index import Occupancy, RemovalFeed
from kvtide.routing.shadow import ShadowFleet
from kvtide.types import ReplicaId

from .helpers import random_prompt, tree_hashes, true_prefix

R = [ReplicaId(f"r{i}") for i in range(4)]


_op = st.tuples(
    st.sampled_from(["record", "record", "record", "forget", "wait"]),
    st.integers(0, 3),
    st.integers(0, 2**32),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_op, max_size=60), st.integers(0, 2**32))
def test_matches_are_the_longest_prefixes_the_trees_hold(
    ops: list[tuple[str, int, int]], seed: int
) -> None:
    clock = ManualClock()
    fleet = ShadowFleet(40, clock, ttl_s=5.0, expire_every_s=1.0)
    queries = random.Random(seed)
    for action, r, s in ops:
        rng = random.Random(s)
        if action == "record":
            fleet.record(R[r], random_prompt(rng, alphabet=3, max_blocks=30))
        elif action == "forget":
            fleet.forget(R[r])
        else:
            clock.advance(rng.uniform(0.5, 4.0))
        fleet.maybe_expire()
        held = {r: tree_hashes(shadow.tree) for r, shadow in fleet._shadows.items()}
        for _ in range(3):
            q = random_prompt(queries, alphabet=3, max_blocks=35)
            got = fleet.match(q)
            want = {r: n for r, hashes in held.items() if (n := true_prefix(hashes, q))}
            assert got.num_blocks == len(q)
            assert dict(got.device) == want == dict(got.any_tier)
            lengths = list(got.device.values())
            assert lengths == sorted(lengths)  # holders by prefix length, as the index gave
        for replica in R:
            assert fleet.held_blocks(replica) == len(held.get(replica, ()))


def test_evictions_reach_removal_listeners_and_leave_the_matches() -> None:
    fleet = ShadowFleet(4, ManualClock())
    seen: list[tuple[ReplicaId, list[int]]] = []
    fleet.subscribe_removals(lambda r, hashes: seen.append((r, [int(h) for h in hashes])))
    a = BlockHashes.from_ints([11, 12, 13])
    b = BlockHashes.from_ints([21, 22])
    fleet.record(R[0], a)
    fleet.record(R[0], b)  # 5 blocks into 4: a's last block goes
    assert seen == [(R[0], [13])]
    assert fleet.match(a).device == {R[0]: 2}
    assert fleet.match(b).device == {R[0]: 2}
    assert fleet.held_blocks(R[0]) == 4 and fleet.held_blocks(R[1]) == 0


def test_a_partly_matched_run_counts_its_shared_blocks_and_ties_keep_first_seen_order() -> None:
    fleet = ShadowFleet(100, ManualClock())
    fleet.record(R[2], BlockHashes.from_ints([1, 2, 3, 4, 5]))
    fleet.record(R[1], BlockHashes.from_ints([1, 2, 3]))
    fleet.record(R[3], BlockHashes.from_ints([1, 2, 3, 4, 9]))
    m = fleet.match(BlockHashes.from_ints([1, 2, 3, 4, 7]))
    assert list(m.device.items()) == [(R[1], 3), (R[2], 4), (R[3], 4)]
    fleet.forget(R[2])  # its place goes to the next replica seen
    fleet.record(R[0], BlockHashes.from_ints([1, 2, 3, 4]))
    m = fleet.match(BlockHashes.from_ints([1, 2, 3, 4, 7]))
    assert list(m.device.items()) == [(R[1], 3), (R[0], 4), (R[3], 4)]
    assert fleet.match(BlockHashes.from_ints([8])).device == {}


def test_is_the_index_a_routing_context_asks_for() -> None:
    fleet = ShadowFleet(10, ManualClock())
    assert isinstance(fleet, Occupancy) and isinstance(fleet, RemovalFeed)
    fleet.record(R[0], BlockHashes.from_ints([1, 2]))
    fleet.clear_replica(R[0])
    assert fleet.match(BlockHashes.from_ints([1, 2])).device == {}
    try:
        fleet.apply_all(R[0], [])
    except UsageError as exc:
        assert "record()" in str(exc)
    else:
        raise AssertionError("a shadow took engine events")
