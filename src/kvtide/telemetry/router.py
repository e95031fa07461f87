"""RouterTelemetry: index staleness, lost events, routing regret and the prefix replication
factor, from the routing package's ``IndexHealth`` and a count of replicas holding a block."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvtide.routing.consistency import IndexHealth
from kvtide.routing.pace import PrefillPace
from kvtide.telemetry.metrics import (
    EVENTS_LOST,
    EVICTED_QUEUED_TOKENS,
    INDEX_LAG,
    INDEX_MAX_LAG,
    PREDICTED_TOKENS,
    PREFILL_PACE,
    REGRET_TOKENS,
    REPLICATION,
    REPORTED_TOKENS,
    RESYNCS,
    Metric,
)
from kvtide.telemetry.recorders import Recorder
from kvtide.types import BlockHash


class HotPrefixes:
    """The most requested prefixes (their block at ``depth_blocks``, or a shorter prompt's
    last full block), counted with Space-Saving (Metwally et al., ICDT'05): ``capacity``
    counters whose top entries are the heavy hitters, in O(1) memory per counter.

    The counters are also filed by count (the paper's stream-summary), so a new prefix finds
    the smallest counter among the distinct counts (a few), not among the 64 counters: that
    scan cost ~9 us, paid by every request of one-off traffic. Of several smallest counters,
    the one that reached that count first goes."""

    __slots__ = ("_by_count", "capacity", "counts", "depth_blocks", "paths")

    def __init__(self, capacity: int = 64, depth_blocks: int = 4) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.depth_blocks = depth_blocks
        self.counts: dict[BlockHash, int] = {}
        self.paths: dict[BlockHash, tuple[BlockHash, ...]] = {}
        self._by_count: dict[int, dict[BlockHash, None]] = {}
        """count -> the keys with it, in the order they reached it (a dict as an ordered set)."""

    def add(self, hashes: Sequence[BlockHash]) -> None:
        depth = min(len(hashes), self.depth_blocks)
        if not depth:
            return
        key = hashes[depth - 1]
        counts = self.counts
        n = counts.get(key)
        if n is not None:
            self._leave(n, key)
        else:
            if len(counts) < self.capacity:
                n = 0
            else:  # replace the smallest counter, inheriting its count (the Space-Saving step)
                n = min(self._by_count)  # as many keys as distinct counts: a few
                victim = next(iter(self._by_count[n]))
                del counts[victim], self.paths[victim]
                self._leave(n, victim)
            self.paths[key] = tuple(hashes[:depth])
        counts[key] = n + 1
        bucket = self._by_count.get(n + 1)
        if bucket is None:
            self._by_count[n + 1] = {key: None}
        else:
            bucket[key] = None

    def _leave(self, n: int, key: BlockHash) -> None:
        """``key`` no longer counts ``n`` (it counts one more, or is replaced)."""
        bucket = self._by_count[n]
        del bucket[key]
        if not bucket:
            del self._by_count[n]

    def top(self, k: int) -> list[tuple[BlockHash, ...]]:
        """The ``k`` most counted prefixes, as block-hash paths from the root."""
        return [self.paths[h] for h in sorted(self.counts, key=lambda h: -self.counts[h])[:k]]


class RouterTelemetry:
    """``holders(path)`` counts the replicas holding the prefix ``path`` (from the router's
    index, or in the simulator the caches themselves); the replication factor is its mean over the
    ``top`` hottest prefixes; ``pace`` the router's (``Router.pace``): the factor in use,
    1 until it has learned one. Call ``routed`` per routed request, ``collect`` periodically."""

    def __init__(
        self,
        recorder: Recorder,
        health: IndexHealth,
        holders: Callable[[Sequence[BlockHash]], int],
        *,
        hot: HotPrefixes | None = None,
        top: int = 16,
        pace: PrefillPace | None = None,
    ) -> None:
        self.recorder = recorder
        self.health = health
        self.pace = pace
        self.holders = holders
        self.hot = hot or HotPrefixes()
        self.top = top
        self._last: dict[str, float] = {}

    def routed(self, hashes: Sequence[BlockHash]) -> None:
        self.hot.add(hashes)

    def _add(self, metric: Metric, total: float) -> None:
        last = self._last.get(metric.name)
        if last is None:  # the series exists from the first collect, at 0 if nothing yet
            last = self._last[metric.name] = 0.0
            self.recorder.inc(metric, 0.0)
        delta = total - last
        if delta > 0:
            self._last[metric.name] = total
            self.recorder.inc(metric, delta)

    def collect(self) -> None:
        s = self.health.summary()
        rec = self.recorder
        latest = max((c.last_lag_s for c in self.health.replicas.values()), default=0.0)
        rec.set(INDEX_LAG, latest)
        rec.set(INDEX_MAX_LAG, s.max_lag_s)
        self._add(EVENTS_LOST, s.events_lost)
        self._add(RESYNCS, s.resyncs)
        self._add(PREDICTED_TOKENS, s.predicted_tokens)
        self._add(REPORTED_TOKENS, s.reported_tokens)
        self._add(REGRET_TOKENS, s.regret_tokens)
        self._add(EVICTED_QUEUED_TOKENS, s.evicted_queued_tokens)
        if self.pace is not None:
            rec.set(PREFILL_PACE, self.pace.factor)
        hot = self.hot.top(self.top)
        if hot:
            rec.set(REPLICATION, sum(self.holders(h) for h in hot) / len(hot))
