"""Router.set_policy: the next request routes with the new policy; requests in flight finish
with the one that routed them, so neither policy's in-flight bookkeeping goes wrong."""

from __future__ import annotations

import pytest

from kvtide.clock import ManualClock
from kvtide.errors import UsageError
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.routing.policies import RoutingContext
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.routing.router import Router
from kvtide.routing.specs import build_policy
from kvtide.types import ReplicaId

from .helpers import prompt


def _requests(n: int, first: int = 0) -> list[RouteRequest]:
    return [
        RouteRequest(prompt([7, 8, i]), 48, 16, request_id=f"q{i}") for i in range(first, first + n)
    ]


def test_a_policy_swap_keeps_each_policys_in_flight_counts_whole() -> None:
    ctx = RoutingContext(clock=ManualClock(), index=GlobalPrefixIndex())
    cost = build_policy("cost", ctx)
    router = Router(cost, [ReplicaState(ReplicaId(f"r{i}")) for i in range(3)])
    old = [(q, router.route(q)) for q in _requests(4)]
    assert sum(cost._inflight.values()) == 4  # type: ignore[attr-defined]
    chash = build_policy("chash", ctx)
    router.set_policy(chash)
    assert router.policy is chash and router.health is ctx.health
    new = [(q, router.route(q)) for q in _requests(3, first=10)]
    assert all(d.policy == "chash" for _, d in new)
    # completions interleaved: the old ones reach cost, the new ones chash
    for (q, d), (q2, d2) in zip(old[:3], new, strict=True):
        router.complete(q2, d2, 4)
        router.cancel(q, d)
    assert sum(cost._inflight.values()) == 1  # type: ignore[attr-defined]
    router.complete(*old[3], 4)
    assert not cost._inflight and router._retired == []  # type: ignore[attr-defined]
    assert router.num_in_flight == 0
    assert all(r.num_requests == 0 for r in router.replicas.values())


def test_a_swap_to_another_block_size_is_refused() -> None:
    ctx = RoutingContext(clock=ManualClock(), index=GlobalPrefixIndex())
    router = Router(build_policy("cost", ctx), [ReplicaState(ReplicaId("r0"))])
    other = RoutingContext(clock=ManualClock(), index=GlobalPrefixIndex(), block_tokens=32)
    with pytest.raises(UsageError, match="32-token"):
        router.set_policy(build_policy("cost", other))
