"""``cost`` weighs the delay a prefill adds to the requests already on a replica (n x s, the
processor-sharing marginal cost): a block every prompt shares (a chat template's default
system prompt) no longer herds every session onto the replica that served first, and an
engine restarted with an empty cache gets requests again once the holders are loaded.
Both held the other way before: a queue of zero unprefilled tokens let the holder win by its
cached blocks however many requests it was running (bench/soak.py: the killed and restarted
engine served 0 requests after its restart).

The holder rule (``affinity_share``, off by default): a replica holding at least that share of
a prompt keeps it until it runs ``holder_slack`` requests more than the least loaded replica;
below the share, or past the slack, the cost decides as above."""

from __future__ import annotations

import pytest

from kvtide.clock import ManualClock
from kvtide.errors import ConfigError
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.routing.policies import RoutingContext
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.routing.router import Router
from kvtide.routing.specs import build_policy
from kvtide.types import ReplicaId

from .helpers import prompt

BT = 16
PREAMBLE = 99_999
"""One block every prompt starts with (the template's default system prompt)."""


def _router(n: int, spec: str = "cost", capacity: int = 0) -> tuple[Router, GlobalPrefixIndex]:
    index = GlobalPrefixIndex()
    ctx = RoutingContext(clock=ManualClock(), index=index, block_tokens=BT)
    replicas = [ReplicaState(ReplicaId(f"r{i}"), capacity_blocks=capacity) for i in range(n)]
    return Router(build_policy(spec, ctx), replicas), index


def _decoding(router: Router, index: GlobalPrefixIndex, ids: list[int]) -> ReplicaId:
    """Routes a prompt of ``ids`` blocks; its first token comes back (it decodes on, in
    flight) and the replica's KV events announce its blocks."""
    hashes = prompt(ids)
    request = RouteRequest(hashes, len(ids) * BT, BT, request_id=f"q{ids[1]}")
    decision = router.route(request)
    router.prefill_done(request, decision)
    index.add(decision.replica, list(hashes))
    return decision.replica


def test_a_block_every_prompt_shares_does_not_herd_new_sessions_onto_one_replica() -> None:
    router, index = _router(3)
    index.add(ReplicaId("r0"), list(prompt([PREAMBLE])))
    chosen = [_decoding(router, index, [PREAMBLE, *range(100 * s, 100 * s + 40)]) for s in range(6)]
    assert set(chosen) == {"r0", "r1", "r2"}, chosen
    assert max(chosen.count(r) for r in set(chosen)) == 2


def _holders_and_restarted(spec: str, sessions: int) -> tuple[list[ReplicaId], Router]:
    router, index = _router(3, spec)
    system = list(range(1, 38))  # a 37-block system prompt, held by r0 and r1; r2 is empty
    for r in ("r0", "r1"):
        index.add(ReplicaId(r), list(prompt(system)))
    chosen = [
        _decoding(router, index, [*system, *range(1000 * s, 1000 * s + 7)])
        for s in range(1, sessions + 1)
    ]
    return chosen, router


def test_a_restarted_empty_replica_gets_requests_once_the_holders_run_several() -> None:
    # the cost alone (no holder rule): r2 takes over after a few
    chosen, router = _holders_and_restarted("cost:affinity_share=0", 8)
    # the first go where the system prompt is; r2 (restarted, empty) takes over once both
    # holders run enough that a 7-block prefill there delays more than r2's 44-block one
    assert chosen[:2] != ["r2", "r2"] and "r2" in chosen, chosen
    assert router.replicas[ReplicaId("r2")].num_requests >= 2


def test_the_holder_keeps_a_prompt_it_mostly_holds_until_the_slack_is_used() -> None:
    slack = 3
    chosen, router = _holders_and_restarted(f"cost:affinity_share=0.2:holder_slack={slack}", 12)
    # each holder takes sessions until it runs `slack` more than the empty r2 (0), i.e. the
    # first 2 x (slack + 1) stay where the system prompt is, then r2 gets its share
    first = 2 * (slack + 1)
    assert "r2" not in chosen[:first], chosen
    assert "r2" in chosen[first:], chosen
    loads = [r.num_requests for r in router.replicas.values()]
    assert max(loads) - min(loads) <= slack + 1, loads


def test_below_the_share_the_cost_decides_as_without_the_rule() -> None:
    # the system prompt is 37 of 44 blocks: a share of 0.9 turns the rule off for these
    with_rule, _ = _holders_and_restarted("cost:affinity_share=0.9", 8)
    without, _ = _holders_and_restarted("cost:affinity_share=0", 8)
    assert with_rule == without and "r2" in with_rule


def test_the_holder_rule_keeps_a_conversation_on_its_replica_when_the_cost_would_move_it() -> None:
    router, index = _router(2, "cost:affinity_share=0.2")
    history = list(range(1, 31))  # a 30-block conversation on r0
    index.add(ReplicaId("r0"), list(prompt(history)))
    busy = router.replicas[ReplicaId("r0")]
    busy.num_requests = 3  # r0 runs three others; r1 is idle
    nxt = [*history, *range(500, 530)]  # half of the next turn is new
    moved = _router(2, "cost:affinity_share=0")
    moved[1].add(ReplicaId("r0"), list(prompt(history)))
    moved[0].replicas[ReplicaId("r0")].num_requests = 3
    assert _decoding(moved[0], moved[1], nxt) == "r1"  # the score alone moves it off r0
    assert _decoding(router, index, nxt) == "r0"  # the holder keeps it


def test_bad_holder_options_are_config_errors() -> None:
    for spec in ("cost:affinity_share=1.5", "cost:affinity_share=-0.1", "cost:holder_slack=-1"):
        with pytest.raises(ConfigError):
            _router(2, spec)


def _full_holders(capacity: int, filler_blocks: int) -> tuple[Router, GlobalPrefixIndex]:
    """r0 holds a 37-block system prompt and ``filler_blocks`` of other prefixes, out of
    ``capacity`` blocks; r1 (restarted) holds nothing."""
    router, index = _router(2, "cost:affinity_share=0.2", capacity)
    index.add(ReplicaId("r0"), list(prompt(list(range(1, 38)))))
    index.add(ReplicaId("r0"), list(prompt(list(range(50_000, 50_000 + filler_blocks)))))
    return router, index


def test_where_the_holder_must_evict_an_empty_replica_with_room_competes_on_cost() -> None:
    system = list(range(1, 38))
    # r0 is full (37 + 963 of 1,000 blocks): each new session's 7 blocks evict there, while
    # r1 has room for all 44; the cost decides, and r1 takes sessions once r0 runs some
    router, index = _full_holders(1_000, 963)
    assert index.held_blocks(ReplicaId("r0")) == 1_000
    chosen = [
        _decoding(router, index, [*system, *range(1000 * s, 1000 * s + 7)]) for s in range(1, 9)
    ]
    assert chosen[0] == "r0" and "r1" in chosen, chosen
    # r0 with room to spare: the holder keeps them all (a copy on r1 would cost later)
    router, index = _full_holders(100_000, 963)
    chosen = [
        _decoding(router, index, [*system, *range(1000 * s, 1000 * s + 7)]) for s in range(1, 9)
    ]
    assert set(chosen) == {"r0"}, chosen


def test_the_index_counts_what_each_replica_holds() -> None:
    index = GlobalPrefixIndex()
    r = ReplicaId("r0")
    index.add(r, list(prompt(list(range(10)))))
    index.remove(r, list(prompt(list(range(10))))[6:])
    assert index.held_blocks(r) == 6 == index.replica_blocks()[r]
    index.clear_replica(r)
    assert index.held_blocks(r) == 0
