"""Fault injection for event delivery: lag and loss between engines and the index.

``LossyDelayedChannel`` numbers each replica's event batches like an engine publisher, holds
each for ``delay_s`` (+ uniform jitter) of clock time and drops it with probability
``loss_prob``. Feed what ``deliver`` returns to a ``SequencedIngest``: dropped batches show up
as sequence gaps, and the ingest repairs them (``resync`` with a snapshot of the engine's cache,
from ``next_seq``). With jitter, batches may arrive out of order; the ingest reorders them.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from kvtide.core.events import KVEvent
from kvtide.errors import ConfigError
from kvtide.types import ReplicaId


@dataclass(frozen=True, slots=True)
class SentBatch:
    replica: ReplicaId
    seq: int
    sent_s: float
    events: list[KVEvent] = field(compare=False)


@dataclass(slots=True)
class ChannelCounters:
    sent: int = 0
    dropped: int = 0
    delivered: int = 0


class LossyDelayedChannel:
    def __init__(
        self,
        rng: random.Random,
        *,
        delay_s: float = 0.0,
        jitter_s: float = 0.0,
        loss_prob: float = 0.0,
    ) -> None:
        if delay_s < 0 or jitter_s < 0:
            raise ConfigError("delay_s and jitter_s must be >= 0")
        if not 0.0 <= loss_prob < 1.0:
            raise ConfigError(f"loss_prob must lie in [0, 1), got {loss_prob}")
        self.rng = rng
        self.delay_s = delay_s
        self.jitter_s = jitter_s
        self.loss_prob = loss_prob
        self.counters = ChannelCounters()
        self._next_seq: dict[ReplicaId, int] = {}
        self._heap: list[tuple[float, int, SentBatch]] = []
        self._order = 0

    def send(self, replica: ReplicaId, events: list[KVEvent], now_s: float) -> int | None:
        """Publishes a batch (an empty one is not sent); returns its sequence number."""
        if not events:
            return None
        seq = self._next_seq.get(replica, 0)
        self._next_seq[replica] = seq + 1
        self.counters.sent += 1
        if self.loss_prob and self.rng.random() < self.loss_prob:
            self.counters.dropped += 1
            return seq
        due = now_s + self.delay_s
        if self.jitter_s:
            due += self.rng.uniform(0.0, self.jitter_s)
        self._order += 1
        heapq.heappush(self._heap, (due, self._order, SentBatch(replica, seq, now_s, events)))
        return seq

    def next_seq(self, replica: ReplicaId) -> int:
        """The sequence number the replica's next batch will carry: a snapshot taken now
        reflects every batch before it."""
        return self._next_seq.get(replica, 0)

    def next_due_s(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def deliver(self, now_s: float) -> list[SentBatch]:
        """Batches due by ``now_s``, in arrival order."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= now_s:
            out.append(heapq.heappop(heap)[2])
        self.counters.delivered += len(out)
        return out
