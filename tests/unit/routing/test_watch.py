"""Predicted prefixes the engine evicted while the request waited: the watch, and what the
router and the index health make of it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.clock import ManualClock
from kvtide.core.events import AllBlocksCleared, BlockRemoved
from kvtide.routing.consistency import IndexHealth
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.routing.policies import RoutingContext
from kvtide.routing.registry import make_policy
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.routing.router import Router
from kvtide.routing.watch import EvictionWatch
from kvtide.types import BlockHash, ReplicaId

from .helpers import prompt

A, B = ReplicaId("a"), ReplicaId("b")

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("watch"), st.integers(0, 5), st.sampled_from([A, B]), st.integers(0, 3)),
        st.tuples(
            st.just("removed"),
            st.sampled_from([A, B]),
            st.lists(st.integers(0, 3), max_size=3),
        ),
        st.tuples(st.just("settle"), st.integers(0, 5)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_the_watch_answers_as_a_scan_of_every_watch(ops: list[tuple[object, ...]]) -> None:
    """Differential: a reference keeps (replica, block, evicted) per token and scans them all."""
    watch = EvictionWatch()
    ref: dict[int, list[object]] = {}
    for op in ops:
        if op[0] == "watch":
            _, token, replica, block = op
            watch.watch(token, replica, BlockHash(block))  # type: ignore[arg-type]
            ref[token] = [replica, block, False]  # type: ignore[index]
        elif op[0] == "removed":
            _, replica, blocks = op
            watch.removed(replica, [BlockHash(b) for b in blocks])  # type: ignore[arg-type, attr-defined]
            for entry in ref.values():
                if entry[0] == replica and entry[1] in blocks:  # type: ignore[operator]
                    entry[2] = True
        else:
            token = op[1]
            entry = ref.pop(token, None)  # type: ignore[call-overload]
            assert watch.settle(token) == (entry is not None and entry[2])
        assert len(watch) == len(ref)
    for token in list(ref):
        assert watch.settle(token) == ref.pop(token)[2]
    assert len(watch) == 0


def _fleet() -> tuple[Router, GlobalPrefixIndex, list[ReplicaState]]:
    index = GlobalPrefixIndex()
    replicas = [ReplicaState(A), ReplicaState(B)]
    ctx = RoutingContext(clock=ManualClock(), index=index)
    ctx.health = IndexHealth(window=4, min_window_tokens=100)
    return Router(make_policy("precise", ctx), replicas), index, replicas


def _shortfalls(router: Router, index: GlobalPrefixIndex, evict: bool) -> None:
    """Four requests predicted 64 cached tokens on A that the engine reports as 16: with
    ``evict``, A's events removed the predicted prefix's last three blocks while each waited."""
    for i in range(4):
        p = prompt([100 + i, 1, 2, 3])
        index.add(A, list(p))
        req = RouteRequest(p, 80, 16, request_id=f"q{i}")
        d = router.route(req)
        if not router.health.is_trusted:  # fallen back to hashing: the point is made
            router.cancel(req, d)
            return
        assert (d.replica, d.cached_tokens) == (A, 64)
        if evict:
            index.apply_all(A, [BlockRemoved((p[3],)), BlockRemoved((p[2], p[1]))])
        router.prefill_done(req, d, reported_cached_tokens=16)
        router.complete(req, d, output_tokens=1)


def test_a_prefix_evicted_in_the_queue_is_not_held_against_the_index() -> None:
    router, index, _ = _fleet()
    _shortfalls(router, index, evict=True)
    c = router.health.replicas[A]
    assert router.health.is_trusted
    assert c.evicted_queued_tokens == 4 * 48
    # the totals stay what was predicted and reported
    assert (c.predicted_tokens, c.reported_tokens, c.precision) == (256, 64, 0.25)
    assert router.health.summary().evicted_queued_tokens == 192
    assert router.watch is not None and len(router.watch) == 0


def test_the_same_shortfall_without_removals_distrusts_the_index() -> None:
    """A wrong index (a hash mismatch, lost removals): nothing marks the watch."""
    router, index, _ = _fleet()
    _shortfalls(router, index, evict=False)
    assert not router.health.is_trusted
    assert router.health.replicas[A].evicted_queued_tokens == 0


def test_an_engine_restart_is_no_excuse() -> None:
    router, index, _ = _fleet()
    p = prompt([7, 8, 9, 10])
    index.add(A, list(p))
    req = RouteRequest(p, 80, 16)
    d = router.route(req)
    index.apply_all(A, [AllBlocksCleared()])
    router.prefill_done(req, d, reported_cached_tokens=0)
    assert router.health.replicas[A].evicted_queued_tokens == 0


def test_only_removals_before_the_first_token_count_when_usage_comes_last() -> None:
    """A stream reports ``usage`` at its end: an eviction after the first token (the request
    done, its blocks freed) must not excuse it, one before must."""
    router, index, _ = _fleet()
    p = prompt([20, 21, 22, 23])
    index.add(A, list(p))
    late = RouteRequest(p, 80, 16)
    d = router.route(late)
    router.prefill_done(late, d)
    index.apply_all(A, [BlockRemoved((p[3],))])
    router.report(late, d, 16)
    assert router.health.replicas[A].evicted_queued_tokens == 0

    index.add(A, list(p))
    early = RouteRequest(p, 80, 16)
    d = router.route(early)
    index.apply_all(A, [BlockRemoved((p[3],))])
    router.prefill_done(early, d)
    router.report(early, d, 16)
    router.complete(early, d, 1)
    assert router.health.replicas[A].evicted_queued_tokens == 48


def test_a_removal_elsewhere_or_of_another_block_excuses_nothing() -> None:
    router, index, _ = _fleet()
    p = prompt([30, 31, 32, 33])
    index.add(A, list(p))
    other = prompt([40, 41])
    index.add(B, list(p[:2]) + list(other))
    req = RouteRequest(p, 80, 16)
    d = router.route(req)
    assert d.replica == A
    index.apply_all(B, [BlockRemoved((p[3], p[1]))])  # B's copy, not the predicted one
    index.apply_all(A, [BlockRemoved((other[1],))])
    router.prefill_done(req, d, reported_cached_tokens=16)
    assert router.health.replicas[A].evicted_queued_tokens == 0
