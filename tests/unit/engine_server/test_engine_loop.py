"""The emulated engine's wake order on a ManualClock: an arrival after a late timer first
applies the iterations already due, as the simulator's event heap would have."""

from __future__ import annotations

import pytest

from kvtide.clock import ManualClock
from kvtide.engine.driver import EngineDriver
from kvtide.engine.scheduler import RequestRecord
from kvtide.engine_server.engine_loop import EmulatedEngine
from kvtide.engine_server.metrics import EngineMetrics

from ..engine.conftest import make_engine


def test_an_arrival_after_a_late_timer_does_not_delay_the_running_request() -> None:
    clock = ManualClock()
    records: list[RequestRecord] = []
    engine = EmulatedEngine(
        EngineDriver(make_engine(clock)),
        clock,  # type: ignore[arg-type]  # now() is all that submit and step read
        EngineMetrics("m"),
        "m",
        ["x"],
        on_record=records.append,
    )
    a = engine.submit("a", list(range(1, 11)), 3, None)  # first token at 0.010
    clock.set(0.013)  # the timer for 0.010 has not fired yet
    engine.submit("b", list(range(101, 105)), 1, None)
    assert a.num_generated == 1  # a's first token went out before b was queued
    while (due := engine.driver.next_wake_s) is not None:
        clock.set(max(due, clock.now()))
        engine.step(clock.now())
    times = {r.request_id: (r.first_token_s, r.finish_s) for r in records}
    # as the simulator has it: a's decode run, planned at 0.010, is cut at its step boundary
    # after b's arrival (0.020), and b's prefill joins the iteration after that (5 ms); had b
    # been queued first, the iteration after a's prefill would have started at 0.013 instead
    expected = {"a": (0.010, 0.025), "b": (0.025, 0.025)}
    assert times.keys() == expected.keys()
    for rid, (first, finish) in expected.items():  # approx of a flat tuple: any pytest
        assert times[rid] == pytest.approx((first, finish)), rid
