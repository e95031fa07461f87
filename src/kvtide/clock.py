"""Time for everything below the gateway: the only module that reads the wall clock."""

from __future__ import annotations

import time
from typing import Protocol

from kvtide.errors import ConfigError


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since an arbitrary epoch; never goes backwards."""
        ...


class WallClock:
    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to: the simulator's and the tests' clock."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._now += seconds

    def set(self, now: float) -> None:
        if now < self._now:
            raise ValueError("a clock cannot go backwards")
        self._now = now


def require_clock(clock: object, owner: str) -> Clock:
    """``clock`` if it can tell the time; otherwise a ``ConfigError`` naming ``owner``.

    Nothing defaults to a ``ManualClock``: a wall-clock caller that forgot its clock would see
    frozen time (pins never expire, TTLs never pass) without any error.
    """
    if not callable(getattr(clock, "now", None)):
        raise ConfigError(
            f"{owner} needs a clock with now(): kvtide.WallClock() for real time, "
            f"kvtide.ManualClock() for simulated time; got {clock!r}"
        )
    return clock  # type: ignore[return-value]
