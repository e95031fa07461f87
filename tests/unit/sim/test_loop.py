"""The event loop: time order, then scheduling order; the clock follows."""

from __future__ import annotations

from kvtide.clock import ManualClock
from kvtide.sim.loop import EventLoop


def test_events_run_in_time_then_scheduling_order() -> None:
    clock = ManualClock()
    loop = EventLoop(clock)
    seen: list[tuple[float, str]] = []

    def note(name: str) -> None:
        seen.append((clock.now(), name))

    loop.at(2.0, note, "late")
    loop.at(1.0, note, "first at 1")
    loop.at(1.0, note, "second at 1")
    loop.at(0.5, lambda _: loop.at(1.0, note, "third at 1"))
    loop.run()
    assert seen == [(1.0, "first at 1"), (1.0, "second at 1"), (1.0, "third at 1"), (2.0, "late")]
    assert loop.num_events == 5 and len(loop) == 0


def test_an_event_in_the_past_runs_now() -> None:
    clock = ManualClock(5.0)
    loop = EventLoop(clock)
    times: list[float] = []
    loop.at(1.0, lambda _: times.append(clock.now()))
    loop.run()
    assert times == [5.0]


def test_run_until_leaves_later_events() -> None:
    clock = ManualClock()
    loop = EventLoop(clock)
    hits: list[float] = []
    for t in (1.0, 2.0, 3.0):
        loop.at(t, hits.append, t)
    loop.run(until_s=2.0)
    assert hits == [1.0, 2.0] and loop.next_s == 3.0
