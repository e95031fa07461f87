"""Time for everything below the gateway: the only module that reads the wall clock."""

from __future__ import annotations

import math
import time
from typing import Protocol

from kvtide.errors import ConfigError, UsageError


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since an arbitrary epoch; never goes backwards."""
        ...


class WallClock:
    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class EpochClock:
    """Seconds since the Unix epoch (``time.time()``): only for comparing with timestamps
    another process stamped the same way, as vLLM stamps its KV event batches. Unlike a
    ``WallClock`` it may step back (NTP), so what it measures is an estimate."""

    __slots__ = ()

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to: the simulator's and the tests' clock."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        if not -math.inf < start < math.inf:
            raise UsageError(f"ManualClock needs a finite start time, got {start!r}")
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if not 0 <= seconds < math.inf:  # also refuses NaN, which would freeze every comparison
            raise UsageError(f"ManualClock.advance needs finite seconds >= 0, got {seconds!r}")
        self._now += seconds

    def set(self, now: float) -> None:
        if not self._now <= now < math.inf:
            raise UsageError(
                f"ManualClock.set({now!r}): a clock cannot go backwards from {self._now!r} "
                "or leave the finite numbers"
            )
        self._now = now


class ScaledClock:
    """Wall time run ``speedup`` times faster, from 0 at construction: the emulated engine's
    clock, so that its timing model (seconds a GPU would take) plays out in real time / X.

    ``to_wall_s`` turns a span of this clock's seconds into the wall seconds to sleep."""

    __slots__ = ("_epoch_start", "_start", "speedup")

    def __init__(self, speedup: float = 1.0) -> None:
        if not speedup > 0 or speedup == float("inf"):
            raise ValueError("a clock's speedup must be a positive finite number")
        self.speedup = speedup
        self._start = time.monotonic()
        self._epoch_start = time.time()

    def now(self) -> float:
        return (time.monotonic() - self._start) * self.speedup

    def to_wall_s(self, seconds: float) -> float:
        return seconds / self.speedup

    def epoch_s(self, t: float) -> float:
        """The Unix time at which this clock reads ``t``: what a vLLM engine would stamp on
        an event published then (``time.time()``), so a router can tell its delay."""
        return self._epoch_start + t / self.speedup

    def from_epoch_s(self, epoch_s: float) -> float:
        """The inverse of ``epoch_s``."""
        return (epoch_s - self._epoch_start) * self.speedup


def epoch_s() -> int:
    """Whole seconds since the Unix epoch: the ``created`` stamp of API responses, never a
    duration (durations come from a Clock)."""
    return int(time.time())


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
