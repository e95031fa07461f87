"""The simulator's telemetry: the same recorders and early-warning detector an engine runs,
ticked on the simulated clock, and the pool shrinks that test the detector.

Each replica gets an in-memory recorder fed by ``CacheTelemetry``; the detector reads the
fleet's sums (as ``kvtide alerts --by job`` does in Prometheus). ``TelemetryResult`` holds the
per-tick signals the report plots, the alerts, the block histograms and a rolling TTFT p99.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvtide.core.hashing import BlockHashes
from kvtide.errors import ConfigError
from kvtide.sim.fleet import Fleet
from kvtide.sim.loop import EventLoop
from kvtide.telemetry import metrics as m
from kvtide.telemetry.cache import CacheTelemetry
from kvtide.telemetry.detector import Alert, DetectorConfig, EarlyWarning, Sample, Signals
from kvtide.telemetry.recorders import Histogram, MemoryRecorder
from kvtide.telemetry.router import RouterTelemetry
from kvtide.types import BlockHash

Values = dict[tuple[str, tuple[str, ...]], float]


@dataclass(frozen=True, slots=True)
class PoolShrink:
    """From ``start_s`` (after the first arrival), every ``every_s`` each replica's device pool
    loses ``step_fraction`` of its original capacity, ``steps`` times (an engine given less KV
    memory step by step). Blocks locked by running requests are taken as they free up."""

    start_s: float
    every_s: float
    step_fraction: float
    steps: int

    def __post_init__(self) -> None:
        if self.start_s < 0 or self.every_s <= 0 or self.steps < 1:
            raise ConfigError("a pool shrink needs start >= 0, a positive step time and steps")
        if not 0 < self.step_fraction * self.steps < 1:
            raise ConfigError("a pool shrink must leave part of the pool (fraction x steps < 1)")


@dataclass(frozen=True, slots=True)
class TelemetryResult:
    """Per tick (``times_s``): rates over the tick, the detector's signals, a rolling TTFT p99
    over the requests that arrived in the last ``ttft_window_s``; and the alerts raised."""

    times_s: list[float]
    hit_ratio_by_tier: dict[str, list[float]]
    miss_tokens_per_s: dict[str, list[float]]
    evictions_per_s: dict[str, list[float]]
    churn_blocks_per_token: list[float]
    occupancy: list[float]
    capacity_blocks: list[float]
    regret_fast: list[float]
    regret_slow: list[float]
    cold_share: list[float]
    ttft_p99_s: list[float]
    ttft_window_s: float
    alerts: list[Alert]
    histograms: dict[str, Histogram]
    replication: list[float] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    """The detector's inputs at every tick: replay them through another ``DetectorConfig``."""
    residence_fast: list[float] = field(default_factory=list)
    """Prompt tokens that arrive while a cached block stays (the detector's residence signal;
    its baseline: ``residence_slow``); NaN where nothing was evicted (unbounded)."""
    residence_slow: list[float] = field(default_factory=list)
    fast_window_s: float = 150.0
    """The detector's fast window: its signals are NaN until a run has lasted that long."""

    def first_alert_s(self, name: str) -> float | None:
        return next((a.time_s for a in self.alerts if a.name == name), None)


class FleetTelemetry:
    """Ticks every ``config.interval_s`` of simulated time from ``start_s``."""

    def __init__(
        self,
        fleet: Fleet,
        loop: EventLoop,
        start_s: float,
        config: DetectorConfig | None = None,
        shrink: PoolShrink | None = None,
        ttft_window_s: float = 300.0,
    ) -> None:
        self.fleet = fleet
        self.loop = loop
        self.start_s = start_s
        self.config = config or DetectorConfig()
        self.shrink = shrink
        self.ttft_window_s = ttft_window_s
        self.recorders = [MemoryRecorder() for _ in fleet.replicas]
        self.caches = [
            CacheTelemetry(rec, r.cache, tiers=r.engine.tiers)
            for rec, r in zip(self.recorders, fleet.replicas, strict=True)
        ]
        self.router_recorder = MemoryRecorder()
        self.router = RouterTelemetry(
            self.router_recorder, fleet.router.health, self._holders, pace=fleet.router.pace
        )
        self.detector = EarlyWarning(self.config, self.router_recorder, log=False)
        self._original = [r.cache.capacity_blocks for r in fleet.replicas]
        self._owed = [0] * len(fleet.replicas)
        self._ticks: list[tuple[float, Values]] = []
        self._replication: list[float] = []
        self._samples: list[Sample] = []

    def _holders(self, path: Sequence[BlockHash]) -> int:
        hashes = list(path)
        return sum(
            1
            for r in self.fleet.replicas
            if r.is_healthy and r.cache.match(hashes, touch=False).num_blocks == len(path)
        )

    def routed(self, hashes: BlockHashes) -> None:
        self.router.routed(hashes)

    def start(self) -> None:
        self.loop.at(self.start_s, self._tick)
        if self.shrink is not None:
            for k in range(self.shrink.steps):
                self.loop.at(
                    self.start_s + self.shrink.start_s + k * self.shrink.every_s, self._shrink_step
                )

    def _shrink_step(self, _: object = None) -> None:
        assert self.shrink is not None
        for i, original in enumerate(self._original):
            self._owed[i] += round(original * self.shrink.step_fraction)
        self._take_owed()

    def _take_owed(self) -> None:
        for i, replica in enumerate(self.fleet.replicas):
            if self._owed[i]:
                self._owed[i] -= replica.cache.shrink(self._owed[i])

    def _tick(self, _: object = None) -> None:
        self._take_owed()
        now = self.loop.clock.now()
        for tel in self.caches:
            tel.collect()
        self.router.collect()
        sample = Sample.of(now, self.recorders)
        self._samples.append(sample)
        self.detector.update(sample)
        merged: Values = {}
        for rec in self.recorders:
            for key, v in rec.values.items():
                merged[key] = merged.get(key, 0.0) + v
        self._ticks.append((now, merged))
        self._replication.append(self.router_recorder.value(m.REPLICATION))
        # The scenario's own sampler keeps one event on the loop while anything else is left:
        # one more than that means the run goes on.
        if len(self.loop) > 1:
            self.loop.at(now + self.config.interval_s, self._tick)

    # --- the result -----------------------------------------------------------------------

    def result(self) -> TelemetryResult:
        ticks = self._ticks
        times = [t for t, _ in ticks[1:]]
        tiers = m.TIERS
        hit: dict[str, list[float]] = {t: [] for t in tiers}
        miss: dict[str, list[float]] = {c: [] for c in m.MISS_CAUSES}
        evict: dict[str, list[float]] = {t: [] for t in tiers}
        churn, occupancy, capacity = [], [], []
        for (t0, a), (t1, b) in itertools.pairwise(ticks):
            span = t1 - t0

            def d(
                metric: m.Metric, labels: tuple[str, ...] = (), a: Values = a, b: Values = b
            ) -> float:
                key = (metric.name, labels)
                return b.get(key, 0.0) - a.get(key, 0.0)

            prompt = d(m.PROMPT_TOKENS)
            for tier in tiers:
                hit[tier].append(d(m.HIT_TOKENS, (tier,)) / prompt if prompt else math.nan)
                evict[tier].append(d(m.EVICTED_BLOCKS, (tier,)) / span)
            for cause in m.MISS_CAUSES:
                miss[cause].append(d(m.MISS_TOKENS, (cause,)) / span)
            churn.append(d(m.ALLOCATED_BLOCKS) / prompt if prompt else math.nan)
            cap = b.get((m.CAPACITY_BLOCKS.name, ("device",)), 0.0)
            capacity.append(cap)
            cached = b.get((m.CACHED_BLOCKS.name, ("device",)), 0.0)
            occupancy.append(cached / cap if cap else math.nan)
        signals = {g.time_s: g for g in self.detector.signals}
        nan_signals = Signals.empty()
        per_tick = [signals.get(t, nan_signals) for t in times]
        histograms = {}
        for metric in (m.BLOCK_LIFETIME, m.BLOCK_IDLE, m.BLOCK_REUSE_GAP):
            h = Histogram(metric.buckets)
            for rec in self.recorders:
                part = rec.histogram(metric)
                h.counts = [x + y for x, y in zip(h.counts, part.counts, strict=True)]
                h.sum += part.sum
            histograms[metric.name] = h
        return TelemetryResult(
            times_s=times,
            hit_ratio_by_tier={t: v for t, v in hit.items() if any(x > 0 for x in v)},
            miss_tokens_per_s={c: v for c, v in miss.items() if any(v)},
            evictions_per_s={t: v for t, v in evict.items() if any(v)},
            churn_blocks_per_token=churn,
            occupancy=occupancy,
            capacity_blocks=capacity,
            regret_fast=[g.regret_fast for g in per_tick],
            regret_slow=[g.regret_slow for g in per_tick],
            cold_share=[g.cold_share for g in per_tick],
            ttft_p99_s=self._rolling_ttft_p99(times),
            ttft_window_s=self.ttft_window_s,
            alerts=list(self.detector.history),
            histograms=histograms,
            replication=self._replication[1:],
            samples=list(self._samples),
            residence_fast=[_finite(g.residence_fast) for g in per_tick],
            residence_slow=[_finite(g.residence_slow) for g in per_tick],
            fast_window_s=self.config.fast_s,
        )

    def _rolling_ttft_p99(self, times: Sequence[float]) -> list[float]:
        records = self.fleet.metrics.records
        arrival = np.fromiter((r.arrival_s for r in records), np.float64, len(records))
        ttft = np.fromiter((r.first_token_s - r.arrival_s for r in records), np.float64)
        order = np.argsort(arrival, kind="stable")
        arrival, ttft = arrival[order], ttft[order]
        out = []
        for t in times:
            lo, hi = np.searchsorted(arrival, [t - self.ttft_window_s, t], side="right")
            window = ttft[lo:hi]
            out.append(float(np.percentile(window, 99)) if window.size >= 20 else math.nan)
        return out


def _finite(x: float) -> float:
    return x if math.isfinite(x) else math.nan
