"""``cost:deadline_k=K``: each decision carries a deadline, K x the request's own predicted
prefill s on the chosen replica (what it holds there is not prefilled) up to one engine
iteration's prefill c (``deadline_chunk`` tokens), K c ln(1 + s / c) in all, and
``RouteDecision.engine_priority`` makes it vLLM's integer ``priority``: arrival plus deadline
in milliseconds, so that a request whose prefix is cached is admitted before one that arrived
a little earlier with everything to prefill, and none is passed by requests arriving more than
its deadline after it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtide.clock import ManualClock
from kvtide.errors import ConfigError
from kvtide.routing.decision import RouteDecision
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.routing.policies import RoutingContext
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.routing.router import Router
from kvtide.routing.specs import build_policy
from kvtide.types import ReplicaId

from .helpers import prompt

BT = 16


def _router(spec: str) -> tuple[Router, GlobalPrefixIndex, RoutingContext]:
    index = GlobalPrefixIndex()
    ctx = RoutingContext(clock=ManualClock(), index=index, block_tokens=BT)
    replicas = [ReplicaState(ReplicaId(f"r{i}")) for i in range(3)]
    return Router(build_policy(spec, ctx), replicas), index, ctx


def _request(ids: list[int], tail: int = 0) -> RouteRequest:
    return RouteRequest(prompt(ids), len(ids) * BT + tail, BT, request_id=f"q{ids[0]}")


def _slack(ctx: RoutingContext, own_s: float, chunk: int = 8192) -> float:
    """The deadline per unit of k: own_s up to one chunk's prefill c, logarithmic beyond."""
    c = ctx.ttft_model.prefill_time(chunk, 0)
    return c * math.log1p(own_s / c)


def test_a_cold_request_gets_k_of_its_whole_prefill() -> None:
    router, _, ctx = _router("cost:deadline_k=3")
    request = _request(list(range(200)))
    decision = router.route(request)
    assert decision.reason == "cold"
    own = ctx.ttft_model.prefill_time(200 * BT, 0)
    assert decision.deadline_s == pytest.approx(3 * _slack(ctx, own))
    assert decision.engine_priority(100.0) == round((100.0 + decision.deadline_s) * 1000)


def test_without_a_chunk_the_deadline_is_k_prefills() -> None:
    router, _, ctx = _router("cost:deadline_k=3:deadline_chunk=0")
    decision = router.route(_request(list(range(200))))
    assert decision.deadline_s == pytest.approx(3 * ctx.ttft_model.prefill_time(200 * BT, 0))


def test_a_long_prompt_waits_logarithmically_not_in_proportion() -> None:
    """A 32k-token cold prompt (several iterations of prefill) is passed by short requests
    for k c ln(1 + s / c), not k s: the absolute tail is made of such prompts, and with k s
    each of them could wait k of its own multi-second prefills."""
    ctx = RoutingContext(clock=ManualClock(), index=GlobalPrefixIndex(), block_tokens=BT)
    replicas = [ReplicaState(ReplicaId(f"r{i}")) for i in range(2)]
    curved = Router(build_policy("cost:deadline_k=10", ctx), replicas)
    linear = Router(build_policy("cost:deadline_k=10:deadline_chunk=0", ctx), replicas)
    long_request = _request(list(range(2048)))  # 32,768 tokens
    short_request = _request(list(range(5000, 5010)))  # 160 tokens
    long_own = ctx.ttft_model.prefill_time(2048 * BT, 0)
    c = ctx.ttft_model.prefill_time(8192, 0)
    assert long_own > 4 * c
    long_c, long_l = curved.route(long_request), linear.route(long_request)
    short_c, short_l = curved.route(short_request), linear.route(short_request)
    assert long_l.deadline_s == pytest.approx(10 * long_own)
    assert long_c.deadline_s == pytest.approx(10 * c * math.log1p(long_own / c))
    assert long_c.deadline_s < long_l.deadline_s / 2
    # a short prefill keeps (nearly) its linear deadline: within 5% at 160 tokens
    assert short_c.deadline_s == pytest.approx(short_l.deadline_s, rel=0.05)
    # a short request arriving 8 s after the long one: the linear rule lets it pass
    later = 8.0
    assert short_l.engine_priority(later) < long_l.engine_priority(0.0)  # type: ignore[operator]
    assert short_c.engine_priority(later) > long_c.engine_priority(0.0)  # type: ignore[operator]


@given(
    st.floats(0.0, 100.0, allow_nan=False),
    st.floats(0.0, 100.0, allow_nan=False),
    st.sampled_from([1, 512, 2048, 8192, 65536]),
)
def test_the_deadline_keeps_shortest_first_and_never_exceeds_k_prefills(
    a: float, b: float, chunk: int
) -> None:
    ctx = RoutingContext(clock=ManualClock(), index=GlobalPrefixIndex(), block_tokens=BT)
    policy = build_policy(f"cost:deadline_k=3:deadline_chunk={chunk}", ctx)
    da, db = policy._deadline(a), policy._deadline(b)  # type: ignore[attr-defined]
    assert 0.0 <= da <= 3 * a * (1 + 1e-12)
    if a < b:
        assert da <= db  # the same order as k x prefill: less to prefill, due sooner
    c = ctx.ttft_model.prefill_time(chunk, 0)
    if a <= c / 100:
        assert da == pytest.approx(3 * a, rel=0.01)


@pytest.mark.parametrize("bad", ["-1", "0.5", "nan", "x"])
def test_a_bad_chunk_is_one_error_naming_it(bad: str) -> None:
    ctx = RoutingContext(clock=ManualClock(), index=GlobalPrefixIndex(), block_tokens=BT)
    with pytest.raises(ConfigError, match="deadline_chunk"):
        build_policy(f"cost:deadline_k=3:deadline_chunk={bad}", ctx)


def test_a_held_prefix_is_not_prefilled_so_its_deadline_is_earlier() -> None:
    router, index, ctx = _router("cost:deadline_k=3")
    history = list(range(1000, 1180))
    index.add(ReplicaId("r1"), list(prompt(history)))
    cold = router.route(_request(list(range(180)), tail=5))
    warm = router.route(_request([*history, 7, 8], tail=5))
    assert warm.replica == "r1" and warm.cached_blocks == 180
    new = 2 * BT + 5
    own = ctx.ttft_model.prefill_time(new, 180 * BT)
    assert warm.deadline_s == pytest.approx(3 * _slack(ctx, own))
    assert cold.deadline_s is not None and warm.deadline_s < cold.deadline_s / 5
    # the warm request arrived 200 ms later (the cold one's prefill is ~90 ms here) and still
    # goes first; one arriving after the cold one's deadline does not
    assert warm.engine_priority(10.2) < cold.engine_priority(10.0)  # type: ignore[operator]
    assert warm.engine_priority(10.3) > cold.engine_priority(10.0)  # type: ignore[operator]


def test_a_fully_cached_prompt_is_due_at_its_arrival() -> None:
    router, index, _ = _router("cost:deadline_k=3")
    ids = list(range(500, 540))
    index.add(ReplicaId("r2"), list(prompt(ids)))
    decision = router.route(_request(ids))
    assert decision.deadline_s == 0.0 and decision.engine_priority(2.0) == 2000


def test_without_the_option_no_deadline_and_no_priority() -> None:
    router, index, _ = _router("cost")
    index.add(ReplicaId("r0"), list(prompt([1, 2, 3])))
    for ids in ([1, 2, 3, 4], [9, 8, 7]):
        decision = router.route(_request(ids))
        assert decision.deadline_s is None and decision.engine_priority(5.0) is None


@pytest.mark.parametrize("bad", [-1, math.inf, math.nan])
def test_a_bad_k_is_one_error_naming_it(bad: float) -> None:
    ctx = RoutingContext(clock=ManualClock(), index=GlobalPrefixIndex(), block_tokens=BT)
    with pytest.raises(ConfigError, match="deadline_k"):
        build_policy(f"cost:deadline_k={bad}", ctx)


@given(
    st.lists(
        st.tuples(
            st.floats(0, 1e9, allow_nan=False),  # arrival, Unix seconds or a sim clock
            st.floats(0, 1e3, allow_nan=False),  # deadline_s
        ),
        min_size=2,
        max_size=20,
    )
)
def test_priorities_order_requests_by_deadline_to_the_millisecond(
    items: list[tuple[float, float]],
) -> None:
    decisions = [
        (arrival, RouteDecision(ReplicaId("r"), "cost", "affinity", deadline_s=d))
        for arrival, d in items
    ]
    for a1, d1 in decisions:
        for a2, d2 in decisions:
            p1, p2 = d1.engine_priority(a1), d2.engine_priority(a2)
            assert isinstance(p1, int) and isinstance(p2, int)
            due1, due2 = a1 + d1.deadline_s, a2 + d2.deadline_s  # type: ignore[operator]
            if due1 + 0.001 < due2:
                assert p1 <= p2
