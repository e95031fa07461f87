"""Link: processor sharing of bandwidth among transfers in flight, on a ManualClock."""

from __future__ import annotations

import pytest

from kvtide.clock import ManualClock
from kvtide.costs.link import Link
from kvtide.errors import ConfigError


def test_one_transfer_takes_bytes_over_bandwidth(clock: ManualClock) -> None:
    link = Link(10.0, clock)
    t = link.submit(100)
    assert link.completion_s(t) == 10.0
    assert link.next_completion_s() == 10.0
    clock.advance(9.0)
    assert link.num_active == 1 and t.done_s is None
    clock.advance(1.0)
    assert link.num_active == 0
    assert t.done_s == 10.0
    assert link.take_completed() == [t]
    assert link.take_completed() == []


def test_two_equal_concurrent_transfers_take_twice_as_long(clock: ManualClock) -> None:
    link = Link(10.0, clock)
    alone = Link(10.0, ManualClock()).estimate_s(100)
    a, b = link.submit(100), link.submit(100)
    assert alone == 10.0
    assert link.completion_s(a) == link.completion_s(b) == 2 * alone
    clock.advance(20.0)
    assert link.take_completed() == [a, b]
    assert a.done_s == b.done_s == 20.0


def test_a_late_transfer_slows_the_first_one_down(clock: ManualClock) -> None:
    link = Link(10.0, clock)
    a = link.submit(100)
    clock.advance(5.0)  # a has 50 bytes left
    assert link.estimate_s(100) == 15.0  # 50 shared (10 s), then 50 alone (5 s)
    b = link.submit(100)
    assert link.completion_s(a) == 15.0
    assert link.completion_s(b) == 20.0
    assert link.next_completion_s() == 15.0
    clock.set(20.0)
    assert [t.done_s for t in link.take_completed()] == [15.0, 20.0]
    assert link.next_completion_s() is None


def test_load_is_the_share_taken_by_transfers_in_flight(clock: ManualClock) -> None:
    link = Link(10.0, clock)
    assert link.load == 0.0
    link.submit(100)
    assert link.load == 0.5
    link.submit(100)
    assert link.load == pytest.approx(2 / 3)
    clock.advance(20.0)
    assert link.load == 0.0
    assert link.num_transfers_total == 2 and link.bytes_total == 200


def test_an_empty_transfer_is_done_at_once(clock: ManualClock) -> None:
    link = Link(10.0, clock)
    t = link.submit(0)
    assert t.done_s == 0.0 and link.num_active == 0
    assert link.estimate_s(0) == 0.0


def test_bad_bandwidth_and_bad_sizes_are_refused(clock: ManualClock) -> None:
    with pytest.raises(ConfigError):
        Link(0.0, clock)
    with pytest.raises(ConfigError):
        Link(float("inf"), clock)
    with pytest.raises(ValueError):
        Link(1.0, clock).submit(-1)
