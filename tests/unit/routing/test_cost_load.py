"""``cost`` weighs the delay a prefill adds to the requests already on a replica (n x s, the
processor-sharing marginal cost): a block every prompt shares (a chat template's default
system prompt) no longer herds every session onto the replica that served first, and an
engine restarted with an empty cache gets requests again once the holders are loaded.
Both held the other way before: a queue of zero unprefilled tokens let the holder win by its
cached blocks however many requests it was running (bench/soak.py: the killed and restarted
engine served 0 requests after its restart).

The holder rule (``affinity_share``, 0.2 by default): a replica holding at least that share of
a prompt keeps it until it runs ``holder_slack`` requests more than the least loaded replica
or queues ``holder_extra`` (2) of the prompt's cold prefills more than the work cap allows,
wherever a copy elsewhere would evict (every other eligible replica's KV too full for the
prompt); a replica with room competes on cost; in a hot decision it binds to a private
prefix's holder (a conversation's history) and to a hot prefix's only while nothing is queued
there; without capacities the rule is off. Below the share, or past the slack or the work,
the cost decides as above."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def _holders_and_restarted(
    spec: str, sessions: int, capacity: int = 0
) -> tuple[list[ReplicaId], Router]:
    router, index = _router(3, spec, capacity)
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
    # with the rule and capacities known: r2 has room for every prompt (it copies them
    # evicting nothing), so it competes on cost and the decisions are the same
    with_rule, _ = _holders_and_restarted("cost", 8, capacity=1_000)
    assert with_rule == chosen


def _fill(index: GlobalPrefixIndex, replica: str, blocks: int) -> None:
    """Other sessions' blocks, ``blocks`` of them, cached on ``replica``."""
    start = 10_000 * (1 + int(replica[1:]))
    if blocks:
        index.add(ReplicaId(replica), list(prompt(list(range(start, start + blocks)))))


def _next_turn(
    spec: str,
    capacity: int = 100,
    r0_others: int = 70,
    r1_others: int = 100,
    r0_running: int = 3,
    r0_queued_tokens: int = 0,
) -> ReplicaId:
    """Where the next turn of a 30-block conversation held by r0 goes: half of its 60 blocks
    are new; r0 runs ``r0_running`` requests with ``r0_queued_tokens`` not yet prefilled, r1
    none; each holds ``*_others`` blocks of other sessions out of ``capacity`` (by default
    both are full)."""
    router, index = _router(2, spec, capacity)
    history = list(range(1, 31))
    index.add(ReplicaId("r0"), list(prompt(history)))
    _fill(index, "r0", r0_others)
    _fill(index, "r1", r1_others)
    r0 = router.replicas[ReplicaId("r0")]
    r0.num_requests = r0_running
    r0.queued_prefill_tokens = r0_queued_tokens
    return _decoding(router, index, [*history, *range(500, 530)])


def test_the_holder_keeps_a_conversation_where_a_copy_elsewhere_would_evict() -> None:
    assert _next_turn("cost:affinity_share=0") == "r1"  # the score alone moves it off r0
    assert _next_turn("cost") == "r0"  # the holder keeps it


def test_the_holder_keeps_it_until_the_slack_is_used() -> None:
    assert _next_turn("cost:holder_slack=3", r0_running=3) == "r0"
    assert _next_turn("cost:holder_slack=3", r0_running=4) == "r1"


def test_the_holder_keeps_it_over_the_work_cap_by_two_of_its_prefills() -> None:
    # with q tokens queued at r0 and none at r1, the work cap for this 960-token turn is
    # ~1.25 x (q + 960) / 2 + 960 tokens: ~4,700 at q = 5,000, ~9,100 at q = 12,000; the
    # holder may hold two of its prefills more: ~6,600 and ~11,000
    assert _next_turn("cost", r0_queued_tokens=5_000) == "r0"
    assert _next_turn("cost", r0_queued_tokens=12_000) == "r1"
    # holder_extra=0: holders under the score's cap (before run 17); inf: only the slack
    assert _next_turn("cost:holder_extra=0", r0_queued_tokens=5_000) == "r1"
    assert _next_turn("cost:holder_extra=inf", r0_queued_tokens=12_000) == "r0"
    assert _next_turn("cost:affinity_share=0", r0_queued_tokens=5_000) == "r1"
    # the slack binds whatever the work
    assert _next_turn("cost:holder_slack=2:holder_extra=inf", r0_queued_tokens=5_000) == "r1"


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(2, 6),
    queued=st.lists(st.integers(0, 20_000), min_size=6, max_size=6),
    running=st.lists(st.integers(0, 24), min_size=6, max_size=6),
    extra=st.sampled_from([0.0, 2.0, 5.0]),
)
def test_the_holder_rule_binds_exactly_within_its_caps(
    n: int, queued: list[int], running: list[int], extra: float
) -> None:
    """Against a reference: the next turn of a conversation r0 holds (every KV full) goes to
    r0 exactly when r0 is within holder_slack requests of the least loaded replica and its
    queue within the work cap plus ``extra`` of the turn's cold prefills; otherwise where the
    score goes, under the work cap."""
    router, index = _router(n, f"cost:holder_extra={extra}", capacity=100)
    history = list(range(1, 31))
    index.add(ReplicaId("r0"), list(prompt(history)))
    for i, r in enumerate(router.replicas.values()):
        _fill(index, r.replica_id, 70 if i == 0 else 100)
        r.queued_prefill_tokens, r.num_requests = queued[i], running[i]
    ids = [*history, *range(500, 530)]
    request = RouteRequest(prompt(ids), len(ids) * BT, BT, request_id="turn")
    policy = router.policy
    reps = list(router.replicas.values())
    rate = policy.model.prefill_tokens_per_s()  # type: ignore[attr-defined]
    cap_s = policy.work_cap_s(reps, request.prompt_tokens)  # type: ignore[attr-defined]
    s = policy.model.prefill_time(request.prompt_tokens, 0)  # type: ignore[attr-defined]
    r0 = reps[0]
    binds = r0.num_requests <= min(running[:n]) + 16 and r0.queued_prefill_tokens <= (
        (cap_s + extra * s) * rate
    )
    chosen = router.route(request).replica
    if binds:
        assert chosen == r0.replica_id
    else:  # the queue it had before this request's prefill joined it
        assert queued[int(chosen[1:])] <= cap_s * rate * (1 + 1e-9)


def test_below_the_share_the_cost_decides_as_without_the_rule() -> None:
    # the conversation is 30 of the turn's 60 blocks
    assert _next_turn("cost:affinity_share=0.9") == "r1"
    assert _next_turn("cost:affinity_share=0.5") == "r0"


def test_a_replica_with_room_for_the_whole_prompt_competes_with_the_holder() -> None:
    assert _next_turn("cost", r1_others=0) == "r1"  # r1 copies it evicting nothing
    assert _next_turn("cost:affinity_share=0", r1_others=0) == "r1"
    assert _next_turn("cost", r1_others=50) == "r0"  # room for 50 of 60 blocks: not enough
    assert _next_turn("cost", capacity=0) == "r1"  # capacities unknown: the rule is off


def test_a_hot_prefix_leaves_its_one_holder_although_every_kv_is_full() -> None:
    # as test_policies' hot-prefix test, with every replica's KV full: the holder rule would
    # pin the prefix to its one holder (docs/gateways.md, run 5), so hot decisions are the cost's
    router, index = _router(4, "cost:epsilon=10", capacity=60)
    hot = list(range(1, 41))
    home = router.route(RouteRequest(prompt(hot), len(hot) * BT, BT)).replica
    index.add(home, list(prompt(hot)))
    for r in router.replicas:
        _fill(index, r, 20 if r == home else 60)
    chosen = []
    for i in range(12):
        ids = [*hot, 1000 + i]
        request = RouteRequest(prompt(ids), len(ids) * BT, BT, request_id=f"h{i}")
        chosen.append(router.route(request).replica)
    assert len(set(chosen)) >= 3, chosen
    assert chosen.count(home) <= 6, chosen


def _turn_of_a_hot_system_prompt() -> tuple[ReplicaId, str]:
    """Where the next turn of a conversation held by r0 goes while its 20-block system prompt
    is hot (8 other sessions of it decoding, held everywhere, every KV full), with r0 running
    5 more requests than any other replica: (replica, reason)."""
    router, index = _router(4, "cost", capacity=100)
    system = list(range(1, 21))
    for r in router.replicas:
        index.add(r, list(prompt(system)))
        _fill(index, r, 80)
    for s in range(8):  # new sessions of the system prompt, decoding
        _decoding(router, index, [*system, 7000 + s])
    history = [*system, *range(100, 130)]
    index.add(ReplicaId("r0"), list(prompt(history)))
    r0 = router.replicas[ReplicaId("r0")]
    r0.num_requests = max(r.num_requests for r in router.replicas.values()) + 5
    ids = [*history, *range(500, 530)]
    request = RouteRequest(prompt(ids), len(ids) * BT, BT, request_id="turn")
    decision = router.route(request)
    return decision.replica, decision.reason


def test_a_hot_system_prompt_does_not_move_a_conversation_off_its_holder() -> None:
    # the spread set keeps r0 (it holds more than the hot key); the cost alone would move the
    # turn to an idle replica and copy 30 blocks of history there. The conversation's history
    # is private (one request in flight on it), so the holder rule binds as on a cold prefix
    assert _turn_of_a_hot_system_prompt() == ("r0", "hot")


def test_a_hot_prefix_binds_only_to_a_holder_with_no_queue() -> None:
    # as test_a_hot_prefix_leaves_its_one_holder_although_every_kv_is_full, each request
    # prefilled before the next comes: the home, holding the hot prefix whole with nothing
    # queued, keeps it; queued, it spreads (previous test)
    router, index = _router(4, "cost:epsilon=10", capacity=60)
    hot = list(range(1, 41))
    home = _decoding(router, index, hot)
    for r in router.replicas:
        _fill(index, r, 20 if r == home else 60)
    chosen = [_decoding(router, index, [*hot, 1000 + i]) for i in range(6)]
    assert chosen == [home] * 6, chosen


def test_bad_holder_options_are_config_errors() -> None:
    for spec in (
        "cost:affinity_share=1.5",
        "cost:affinity_share=-0.1",
        "cost:holder_slack=-1",
        "cost:holder_extra=-1",
    ):
        with pytest.raises(ConfigError):
            _router(2, spec)


def test_the_index_counts_what_each_replica_holds() -> None:
    index = GlobalPrefixIndex()
    r = ReplicaId("r0")
    index.add(r, list(prompt(list(range(10)))))
    index.remove(r, list(prompt(list(range(10))))[6:])
    assert index.held_blocks(r) == 6 == index.replica_blocks()[r]
    index.clear_replica(r)
    assert index.held_blocks(r) == 0


def _long_prompt_between(spec: str) -> ReplicaId:
    """A 20k-token prompt sharing only a preamble block both replicas hold: r0 has one long
    prefill queued, r1 ten short requests in flight."""
    router, index = _router(2, spec)
    for r in ("r0", "r1"):
        index.add(ReplicaId(r), list(prompt([PREAMBLE])))
    r0, r1 = router.replicas[ReplicaId("r0")], router.replicas[ReplicaId("r1")]
    r0.dispatch(30_000)
    for _ in range(10):
        r1.dispatch(200)
    ids = [PREAMBLE, *range(5000, 5000 + 1249)]
    request = RouteRequest(prompt(ids), len(ids) * BT, BT, request_id="long")
    return router.route(request).replica


def test_the_weight_of_the_requests_in_flight_trades_their_delay_for_its_ttft() -> None:
    """n x s charges a long prefill for the delay it adds to the n requests already on a
    replica (their next tokens, with chunked prefill): weighted fully it goes behind the
    queue where nothing else runs; weighted 0 it goes where its own first token comes
    soonest."""
    assert _long_prompt_between("cost") == "r0"
    assert _long_prompt_between("cost:inflight_weight=0") == "r1"


@pytest.mark.parametrize("bad", ["-1", "inf", "nan", "x"])
def test_a_bad_inflight_weight_is_one_error_naming_it(bad: str) -> None:
    with pytest.raises(ConfigError, match="inflight_weight"):
        _router(2, f"cost:inflight_weight={bad}")
