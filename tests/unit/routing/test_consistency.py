"""Index health: regret, precision/recall, trust, and the router's bookkeeping."""

from __future__ import annotations

import random

import pytest

from kvtide.clock import ManualClock
from kvtide.errors import ConfigError
from kvtide.routing.consistency import IndexHealth
from kvtide.routing.faults import LossyDelayedChannel
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.routing.policies import RoutingContext
from kvtide.routing.registry import make_policy
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.routing.router import Router
from kvtide.types import ReplicaId

from .helpers import prompt

A, B = ReplicaId("a"), ReplicaId("b")


def test_regret_precision_and_recall() -> None:
    h = IndexHealth()
    h.report(A, predicted_tokens=100, reported_tokens=60)  # over-predicted by 40
    h.report(A, predicted_tokens=0, reported_tokens=30)  # missed 30
    c = h.replicas[A]
    assert (c.overlap_tokens, c.regret_tokens) == (60, 70)
    assert c.precision == 0.6 and c.recall == pytest.approx(60 / 90)
    assert h.summary().regret_tokens == 70


def test_a_window_of_wrong_predictions_distrusts_the_index_until_it_recovers() -> None:
    h = IndexHealth(min_precision=0.5, window=4, min_window_tokens=100)
    for _ in range(4):
        h.report(A, 100, 10)
    assert not h.is_trusted and h.untrusted == {A}
    for _ in range(4):
        h.report(A, 100, 100)
    assert h.is_trusted


def test_router_books_dispatch_prefill_and_completion() -> None:
    idx = GlobalPrefixIndex()
    p = prompt(list(range(4)))
    idx.add(A, p)
    reps = [ReplicaState(A), ReplicaState(B)]
    router = Router(make_policy("precise", RoutingContext(clock=ManualClock(), index=idx)), reps)
    req = RouteRequest(p, 70, 16)
    d = router.route(req)
    assert d.replica == A and d.cached_tokens == 64
    assert (reps[0].num_requests, reps[0].queued_prefill_tokens) == (1, 6)
    router.prefill_done(req, d, reported_cached_tokens=48)
    assert (reps[0].queued_prefill_tokens, reps[0].decode_tokens) == (0, 70)
    assert router.health.replicas[A].precision == 0.75
    router.complete(req, d, output_tokens=10)
    assert (reps[0].num_requests, reps[0].decode_tokens) == (0, 0)


def test_channel_delays_and_drops_deterministically() -> None:
    ch = LossyDelayedChannel(random.Random(1), delay_s=1.0, loss_prob=0.5)
    clock = ManualClock()
    sent = [ch.send(A, [], clock.now())]
    from kvtide.core.events import AllBlocksCleared

    for _ in range(20):
        sent.append(ch.send(A, [AllBlocksCleared()], clock.now()))
    assert sent[0] is None and sent[1:] == list(range(20))
    assert ch.deliver(0.5) == []
    got = ch.deliver(1.0)
    assert len(got) == 20 - ch.counters.dropped and 0 < ch.counters.dropped < 20
    assert [b.seq for b in got] == sorted(b.seq for b in got)
    with pytest.raises(ConfigError):
        LossyDelayedChannel(random.Random(1), loss_prob=1.0)
