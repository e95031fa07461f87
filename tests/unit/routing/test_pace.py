"""``PrefillPace`` learns how much slower the engines prefill than the TTFT model, from the
first tokens of requests sent where nothing was queued, and ``cost``'s deadlines are in the
engines' seconds: a fleet 8x slower than the model gets deadlines 8x as long."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtide.clock import ManualClock
from kvtide.errors import ConfigError
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.routing.pace import PrefillPace
from kvtide.routing.policies import RoutingContext
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.routing.router import Router
from kvtide.routing.specs import build_policy
from kvtide.types import ReplicaId

from .helpers import prompt

BT = 16


def test_the_factor_is_one_until_enough_first_tokens() -> None:
    pace = PrefillPace(min_samples=4)
    for _ in range(3):
        pace.observe(0.1, 0.8)
    assert pace.factor == 1.0
    pace.observe(0.1, 0.8)
    assert pace.factor == pytest.approx(8.0)


def test_long_prefills_weigh_the_most() -> None:
    pace = PrefillPace(decay=1.0 / 1000, min_samples=1)
    pace.observe(1.0, 2.0)  # a long prefill, twice as slow as the model
    pace.observe(0.001, 0.010)  # a cached prompt: 10x, mostly the round trip
    assert pace.factor == pytest.approx(2.009 / 1.001, rel=1e-3)


def test_it_follows_a_fleet_that_slows_down() -> None:
    pace = PrefillPace(decay=1.0 / 32, min_samples=1)
    for _ in range(200):
        pace.observe(0.1, 0.1)
    for _ in range(200):
        pace.observe(0.1, 0.4)
    assert pace.factor == pytest.approx(4.0, rel=0.01)


@given(st.lists(st.tuples(st.floats(1e-4, 10.0), st.floats(0.0, 100.0)), min_size=4))
def test_the_factor_lies_between_the_smallest_and_largest_ratio(
    samples: list[tuple[float, float]],
) -> None:
    pace = PrefillPace()
    for predicted, observed in samples:
        pace.observe(predicted, observed)
    ratios = [o / p for p, o in samples]
    assert min(ratios) * (1 - 1e-9) <= pace.factor <= max(ratios) * (1 + 1e-9)


def test_nonsense_is_ignored_and_bad_settings_named() -> None:
    pace = PrefillPace(min_samples=1)
    for predicted, observed in ((0.0, 1.0), (-1.0, 1.0), (math.nan, 1.0), (1.0, math.inf)):
        pace.observe(predicted, observed)
    assert pace.samples == 0 and pace.factor == 1.0
    with pytest.raises(ConfigError, match="decay"):
        PrefillPace(decay=0.0)
    with pytest.raises(ConfigError, match="min_samples"):
        PrefillPace(min_samples=0)


def test_the_router_learns_the_pace_and_deadlines_follow_it() -> None:
    clock = ManualClock()
    ctx = RoutingContext(clock=clock, index=GlobalPrefixIndex(), block_tokens=BT)
    replicas = [ReplicaState(ReplicaId(f"r{i}")) for i in range(2)]
    router = Router(build_policy("cost:deadline_k=3", ctx), replicas)
    history = list(range(100, 160))
    ctx.index.add(ReplicaId("r0"), list(prompt(history)))  # type: ignore[union-attr]
    first = None
    for turn in range(6):  # one at a time: nothing queued at dispatch
        request = RouteRequest(prompt([*history, turn]), 61 * BT, BT, request_id=f"t{turn}")
        decision = router.route(request)
        assert decision.ttft_s is not None and decision.queue_tokens == 0
        first = first or decision
        clock.advance(8 * decision.ttft_s)  # the engines prefill 8x slower than the model
        router.prefill_done(request, decision, 60 * BT)
        router.complete(request, decision, 1)
    assert ctx.pace.factor == pytest.approx(8.0)
    request = RouteRequest(prompt([*history, 99]), 61 * BT, BT, request_id="late")
    late = router.route(request)
    assert first is not None and first.deadline_s is not None and late.deadline_s is not None
    assert late.deadline_s == pytest.approx(8 * first.deadline_s)


def test_a_request_behind_a_queue_or_cancelled_teaches_nothing() -> None:
    clock = ManualClock()
    ctx = RoutingContext(clock=clock, index=GlobalPrefixIndex(), block_tokens=BT)
    router = Router(build_policy("cost", ctx), [ReplicaState(ReplicaId("r0"))])
    ctx.index.add(ReplicaId("r0"), list(prompt([1, 2, 3])))  # type: ignore[union-attr]
    a = RouteRequest(prompt([1, 2, 3, 4]), 4 * BT, BT, request_id="a")
    b = RouteRequest(prompt([1, 2, 3, 5]), 4 * BT, BT, request_id="b")
    da = router.route(a)
    db = router.route(b)  # a's prefill is queued there
    assert db.queue_tokens > 0
    clock.advance(1.0)
    router.cancel(a, da)  # never got a first token
    router.prefill_done(b, db, 3 * BT)
    assert ctx.pace.samples == 0


def test_a_first_token_told_late_teaches_nothing() -> None:
    """A non-streamed answer: the gateway learns of the first token with the whole answer."""
    clock = ManualClock()
    ctx = RoutingContext(clock=clock, index=GlobalPrefixIndex(), block_tokens=BT)
    router = Router(build_policy("cost", ctx), [ReplicaState(ReplicaId("r0"))])
    ctx.index.add(ReplicaId("r0"), list(prompt([1, 2, 3])))  # type: ignore[union-attr]
    request = RouteRequest(prompt([1, 2, 3, 4]), 4 * BT, BT, request_id="whole")
    decision = router.route(request)
    clock.advance(5.0)
    router.prefill_done(request, decision, 3 * BT, on_time=False)
    router.complete(request, decision, 100)
    assert ctx.pace.samples == 0
