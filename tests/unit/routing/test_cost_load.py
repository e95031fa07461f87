"""``cost`` weighs the delay a prefill adds to the requests already on a replica (n x s, the
processor-sharing marginal cost): a block every prompt shares (a chat template's default
system prompt) no longer herds every session onto the replica that served first, and an
engine restarted with an empty cache gets requests again once the holders are loaded.
Both held the other way before: a queue of zero unprefilled tokens let the holder win by its
cached blocks however many requests it was running (bench/soak.py: the killed and restarted
engine served 0 requests after its restart)."""

from __future__ import annotations

from kvtide.clock import ManualClock
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


def _router(n: int) -> tuple[Router, GlobalPrefixIndex]:
    index = GlobalPrefixIndex()
    ctx = RoutingContext(clock=ManualClock(), index=index, block_tokens=BT)
    return Router(
        build_policy("cost", ctx), [ReplicaState(ReplicaId(f"r{i}")) for i in range(n)]
    ), index


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


def test_a_restarted_empty_replica_gets_requests_once_the_holders_run_several() -> None:
    router, index = _router(3)
    system = list(range(1, 38))  # a 37-block system prompt, held by r0 and r1
    for r in ("r0", "r1"):
        index.add(ReplicaId(r), list(prompt(system)))
    chosen = [
        _decoding(router, index, [*system, *range(1000 * s, 1000 * s + 7)]) for s in range(1, 9)
    ]
    # the first go where the system prompt is; r2 (restarted, empty) takes over once both
    # holders run enough that a 7-block prefill there delays more than r2's 44-block one
    assert chosen[:2] != ["r2", "r2"] and "r2" in chosen, chosen
    assert router.replicas[ReplicaId("r2")].num_requests >= 2
