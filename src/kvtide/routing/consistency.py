"""How well the router's index matches the engines: staleness, loss, regret, trust.

``IndexHealth`` is shared by event ingestion (which reports lag and sequence gaps) and by the
caller that learns what an engine really reused (``usage.prompt_tokens_details.cached_tokens``
in an OpenAI response, or the simulator's cache). A replica whose index is known to be wrong
(an unrepaired gap, or a recent window of predictions with low precision) is *untrusted*, and
index-driven policies fall back to bounded-load consistent hashing while any replica is.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvtide.types import ReplicaId


@dataclass(slots=True)
class ReplicaConsistency:
    """Running totals for one replica; tokens unless named otherwise."""

    predicted_tokens: int = 0  # cached tokens predicted at decision time
    reported_tokens: int = 0  # cached tokens the engine reported
    overlap_tokens: int = 0  # sum of min(predicted, reported): correctly predicted hits
    evicted_queued_tokens: int = 0  # predicted, then evicted while the request was queued
    num_reports: int = 0
    events_lost: int = 0  # missing sequence numbers (batches)
    gaps: int = 0
    resyncs: int = 0
    last_lag_s: float = 0.0
    max_lag_s: float = 0.0
    sum_lag_s: float = 0.0
    num_lag_samples: int = 0
    has_open_gap: bool = False
    is_low_precision: bool = False
    window: deque[tuple[int, int]] = field(default_factory=deque)
    window_predicted_tokens: int = 0  # sums over ``window``, kept as it slides
    window_overlap_tokens: int = 0

    @property
    def precision(self) -> float:
        """Of the cached tokens predicted, the fraction the engine really had (1.0 if none)."""
        return self.overlap_tokens / self.predicted_tokens if self.predicted_tokens else 1.0

    @property
    def recall(self) -> float:
        """Of the cached tokens the engine had, the fraction that was predicted (1.0 if none)."""
        return self.overlap_tokens / self.reported_tokens if self.reported_tokens else 1.0

    @property
    def regret_tokens(self) -> int:
        """Predicted-but-missing plus present-but-unpredicted tokens."""
        return self.predicted_tokens + self.reported_tokens - 2 * self.overlap_tokens

    @property
    def mean_lag_s(self) -> float:
        return self.sum_lag_s / self.num_lag_samples if self.num_lag_samples else 0.0


@dataclass(frozen=True, slots=True)
class HealthSummary:
    predicted_tokens: int
    reported_tokens: int
    overlap_tokens: int
    precision: float
    recall: float
    regret_tokens: int
    evicted_queued_tokens: int
    events_lost: int
    gaps: int
    resyncs: int
    max_lag_s: float
    mean_lag_s: float
    num_untrusted: int


class IndexHealth:
    """Per-replica consistency of an index, and whether routing may trust it.

    A replica turns untrusted on a sequence gap (until ``repaired``) or when the precision of
    its last ``window`` reports falls below ``min_precision`` with at least
    ``min_window_tokens`` predicted tokens in the window; it turns trusted again when the
    window's precision recovers. A report whose predicted prefix the engine evicted while the
    request waited in its queue (``evicted_queued``, from ``routing.watch``) enters the window
    as predicted no more than was reported: the index was right, the engine's KV pressure
    overtook it; the shortfall is counted in ``evicted_queued_tokens`` instead. Predictions
    keep being recorded while untrusted, so recovery is observed even when routing ignores
    the index.
    """

    def __init__(
        self,
        *,
        min_precision: float = 0.5,
        window: int = 32,
        min_window_tokens: int = 1024,
    ) -> None:
        self.min_precision = min_precision
        self.window = window
        self.min_window_tokens = min_window_tokens
        self.replicas: dict[ReplicaId, ReplicaConsistency] = {}
        self._untrusted: set[ReplicaId] = set()
        self.max_lag_s = 0.0
        """The worst event lag seen on any replica, seconds."""

    def _of(self, replica: ReplicaId) -> ReplicaConsistency:
        c = self.replicas.get(replica)
        if c is None:
            c = self.replicas[replica] = ReplicaConsistency()
        return c

    # --- trust -----------------------------------------------------------------------------

    @property
    def is_trusted(self) -> bool:
        """True when no replica's index is known to be wrong."""
        return not self._untrusted

    def is_replica_trusted(self, replica: ReplicaId) -> bool:
        return replica not in self._untrusted

    @property
    def untrusted(self) -> frozenset[ReplicaId]:
        return frozenset(self._untrusted)

    def _update(self, replica: ReplicaId, c: ReplicaConsistency) -> None:
        if c.has_open_gap or c.is_low_precision:
            self._untrusted.add(replica)
        else:
            self._untrusted.discard(replica)

    # --- ingestion side --------------------------------------------------------------------

    def lag(self, replica: ReplicaId, lag_s: float) -> None:
        """An event batch arrived ``lag_s`` seconds after the engine published it."""
        c = self._of(replica)
        lag_s = max(lag_s, 0.0)
        c.last_lag_s = lag_s
        c.max_lag_s = max(c.max_lag_s, lag_s)
        if lag_s > self.max_lag_s:
            self.max_lag_s = lag_s
        c.sum_lag_s += lag_s
        c.num_lag_samples += 1

    def gap(self, replica: ReplicaId, num_missing: int) -> None:
        c = self._of(replica)
        c.gaps += 1
        c.events_lost += num_missing
        c.has_open_gap = True
        self._update(replica, c)

    def repaired(self, replica: ReplicaId, *, resync: bool = False) -> None:
        c = self._of(replica)
        c.has_open_gap = False
        if resync:
            c.resyncs += 1
        self._update(replica, c)

    def forget(self, replica: ReplicaId) -> None:
        self.replicas.pop(replica, None)
        self._untrusted.discard(replica)

    # --- regret ----------------------------------------------------------------------------

    def report(
        self,
        replica: ReplicaId,
        predicted_tokens: int,
        reported_tokens: int,
        *,
        evicted_queued: bool = False,
    ) -> None:
        """The engine reused ``reported_tokens`` prompt tokens where ``predicted_tokens`` were
        predicted at decision time (both from the same request); ``evicted_queued``: the
        engine evicted the predicted prefix while the request waited (see the class)."""
        c = self._of(replica)
        overlap = min(predicted_tokens, reported_tokens)
        c.predicted_tokens += predicted_tokens
        c.reported_tokens += reported_tokens
        c.overlap_tokens += overlap
        c.num_reports += 1
        trusted_prediction = predicted_tokens
        if evicted_queued and reported_tokens < predicted_tokens:
            c.evicted_queued_tokens += predicted_tokens - reported_tokens
            trusted_prediction = reported_tokens
        w = c.window
        w.append((trusted_prediction, overlap))
        c.window_predicted_tokens += trusted_prediction
        c.window_overlap_tokens += overlap
        if len(w) > self.window:
            old_predicted, old_overlap = w.popleft()
            c.window_predicted_tokens -= old_predicted
            c.window_overlap_tokens -= old_overlap
        predicted = c.window_predicted_tokens
        if predicted >= self.min_window_tokens:
            c.is_low_precision = c.window_overlap_tokens / predicted < self.min_precision
        else:
            c.is_low_precision = False
        self._update(replica, c)

    def summary(self) -> HealthSummary:
        cs = list(self.replicas.values())
        pred = sum(c.predicted_tokens for c in cs)
        rep = sum(c.reported_tokens for c in cs)
        ovl = sum(c.overlap_tokens for c in cs)
        lags = sum(c.num_lag_samples for c in cs)
        return HealthSummary(
            predicted_tokens=pred,
            reported_tokens=rep,
            overlap_tokens=ovl,
            precision=ovl / pred if pred else 1.0,
            recall=ovl / rep if rep else 1.0,
            regret_tokens=pred + rep - 2 * ovl,
            evicted_queued_tokens=sum(c.evicted_queued_tokens for c in cs),
            events_lost=sum(c.events_lost for c in cs),
            gaps=sum(c.gaps for c in cs),
            resyncs=sum(c.resyncs for c in cs),
            max_lag_s=max((c.max_lag_s for c in cs), default=0.0),
            mean_lag_s=sum(c.sum_lag_s for c in cs) / lags if lags else 0.0,
            num_untrusted=len(self._untrusted),
        )
