"""The discrete-event loop: a heap of (time, seq, action, arg) driving a ManualClock.

Events at equal times run in the order they were scheduled (the sequence number breaks ties,
as in simpy), so a run is a pure function of its inputs. Cancelling is the caller's business:
an action that may be superseded carries a generation number and ignores stale calls.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from kvtide.clock import ManualClock

Action = Callable[[Any], None]


class EventLoop:
    __slots__ = ("_heap", "_seq", "clock", "num_events")

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, Action, Any]] = []
        self._seq = 0
        self.num_events = 0

    def at(self, time_s: float, action: Action, arg: Any = None) -> None:
        """Runs ``action(arg)`` at ``time_s`` (not before now)."""
        now = self.clock.now()
        self._seq += 1
        heapq.heappush(self._heap, (time_s if time_s > now else now, self._seq, action, arg))

    def __len__(self) -> int:
        return len(self._heap)

    @property
    def next_s(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def run(self, until_s: float | None = None) -> None:
        """Runs events in time order until none is left (or the next is after ``until_s``)."""
        heap = self._heap
        pop = heapq.heappop
        set_time = self.clock.set
        count = 0
        while heap:
            if until_s is not None and heap[0][0] > until_s:
                break
            time_s, _, action, arg = pop(heap)
            set_time(time_s)
            action(arg)
            count += 1
        self.num_events += count
