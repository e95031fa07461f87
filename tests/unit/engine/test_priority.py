"""vLLM's scheduling policies: ``fcfs`` (arrival order) and ``priority`` ((priority, arrival),
lower first; the running request last in that order is the one preempted)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.clock import ManualClock
from kvtide.engine.scheduler import EngineConfig
from kvtide.errors import ConfigError

from .conftest import drive, make_engine, request

_waiting = st.lists(
    st.tuples(st.integers(-2, 2), st.sampled_from([0.0, 0.5, 1.0])), min_size=1, max_size=12
)


@settings(max_examples=100, deadline=None)
@given(_waiting, st.sampled_from(["fcfs", "priority"]))
def test_waiting_requests_are_admitted_in_the_policys_order(
    waiting: list[tuple[int, float]], policy: str
) -> None:
    """One sequence at a time, everything queued before the first iteration: the order of
    first tokens is the policy's order of the queue (a differential check against sorted)."""
    clock = ManualClock(1.0)
    engine = make_engine(clock, max_num_seqs=1, scheduling_policy=policy)
    for i, (priority, arrival_s) in enumerate(waiting):
        req, hashes = request(f"r{i}", [1000 * i + t for t in range(1, 6)], 1, arrival_s)
        engine.add(req, hashes, arrival_s=arrival_s, priority=priority)
    records = drive(engine, clock)
    served = [r.request_id for r in sorted(records, key=lambda r: r.first_token_s)]
    ids = range(len(waiting))
    if policy == "fcfs":
        expected = [f"r{i}" for i in ids]
    else:
        expected = [f"r{i}" for i in sorted(ids, key=lambda i: (*waiting[i], i))]
    assert served == expected


def test_under_priority_the_last_in_order_is_preempted_not_the_newest(
    engine_clock: ManualClock,
) -> None:
    """The story of test_scheduler's preemption test, with the older request of lower
    priority: it is the one preempted and recomputed."""
    engine = make_engine(engine_clock, capacity_blocks=6, scheduling_policy="priority")
    a, ha = request("a", list(range(1, 9)), output=10)
    b, hb = request("b", list(range(101, 109)), output=10)
    engine.add(a, ha, priority=5)
    engine.add(b, hb, priority=0)
    records = {r.request_id: r for r in drive(engine, engine_clock)}
    assert (records["a"].num_preemptions, records["b"].num_preemptions) == (1, 0)
    assert records["b"].finish_s < records["a"].finish_s
    engine.cache.pool.check()


def test_an_unknown_scheduling_policy_is_named() -> None:
    with pytest.raises(ConfigError, match="scheduling_policy must be one of fcfs, priority"):
        EngineConfig(scheduling_policy="lifo")
