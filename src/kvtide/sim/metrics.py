"""What a simulated run measured: per-request latencies, hit ratios, load, eviction, over time.

``MetricsCollector`` takes finished requests and periodic fleet samples; ``summarize`` turns
them into a ``RunSummary`` whose ``to_json`` is the run object of ``kvtide simulate --json``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvtide.engine.scheduler import RequestRecord


@dataclass(frozen=True, slots=True)
class Percentiles:
    """NaN throughout when there was nothing to measure."""

    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray) -> Percentiles:
        arr = np.asarray(values, dtype=np.float64)
        if arr.size == 0:  # nothing to measure (TPOT when no request decodes): not a zero
            return cls(math.nan, math.nan, math.nan, math.nan)
        p50, p90, p99 = np.percentile(arr, [50, 90, 99])
        return cls(float(arr.mean()), float(p50), float(p90), float(p99))

    def to_json(self) -> dict[str, float | None]:
        """``None`` for a metric that does not apply (JSON has no NaN)."""
        values = {"mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99}
        return {k: None if math.isnan(v) else v for k, v in values.items()}


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One run's headline numbers; ``to_json`` has exactly the keys of the JSON contract.

    ``load_imbalance`` is max/mean of the replicas' busy seconds; ``throughput_tok_s`` counts
    prompt and output tokens of finished requests over first arrival to last finish;
    ``prefill_tokens_computed`` includes recomputation after preemption.
    """

    router: str
    eviction: str
    requests: int
    ttft_s: Percentiles
    tpot_s: Percentiles
    e2e_s: Percentiles
    hit_ratio: float
    hit_ratio_by_tier: Mapping[str, float]
    throughput_tok_s: float
    load_imbalance: float
    evictions_per_s: float
    prefill_tokens_computed: int

    def to_json(self) -> dict[str, object]:
        return {
            "router": self.router,
            "eviction": self.eviction,
            "requests": self.requests,
            "ttft_s": self.ttft_s.to_json(),
            "tpot_s": self.tpot_s.to_json(),
            "e2e_s": self.e2e_s.to_json(),
            "hit_ratio": self.hit_ratio,
            "hit_ratio_by_tier": dict(self.hit_ratio_by_tier),
            "throughput_tok_s": self.throughput_tok_s,
            "load_imbalance": self.load_imbalance,
            "evictions_per_s": self.evictions_per_s,
            "prefill_tokens_computed": self.prefill_tokens_computed,
        }


@dataclass(frozen=True, slots=True)
class FleetSample:
    """Cumulative fleet counters at one instant (the collector differences them)."""

    time_s: float
    hit_tokens: int
    prompt_tokens: int
    evicted_blocks: int
    busy_s: Sequence[float]
    queued: Sequence[int]


@dataclass(frozen=True, slots=True)
class TimeSeries:
    """Per-window values, window i ending at ``times_s[i]``."""

    start_s: float = 0.0
    """When the first window starts (the first arrival): plots count time from here."""
    times_s: list[float] = field(default_factory=list)
    hit_ratio: list[float] = field(default_factory=list)
    """NaN for a window in which no request was admitted."""
    admitted_tokens: list[int] = field(default_factory=list)
    """Prompt tokens admitted in each window: the weight of its hit ratio."""
    evictions_per_s: list[float] = field(default_factory=list)
    replica_busy: list[list[float]] = field(default_factory=list)
    """Per replica, the fraction of each window it spent computing."""
    replica_queued: list[list[int]] = field(default_factory=list)
    """Per replica, requests waiting or running at the end of each window."""


class MetricsCollector:
    __slots__ = ("_last", "records", "samples")

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []
        self.samples: list[FleetSample] = []

    def record(self, record: RequestRecord) -> None:
        self.records.append(record)

    def sample(self, sample: FleetSample) -> None:
        self.samples.append(sample)

    def series(self) -> TimeSeries:
        samples = self.samples
        if len(samples) < 2:
            return TimeSeries()
        out = TimeSeries(start_s=samples[0].time_s)
        num_replicas = len(samples[0].busy_s)
        out.replica_busy.extend([] for _ in range(num_replicas))
        out.replica_queued.extend([] for _ in range(num_replicas))
        for prev, cur in itertools.pairwise(samples):
            span = cur.time_s - prev.time_s
            if span <= 0:
                continue
            out.times_s.append(cur.time_s)
            prompt = cur.prompt_tokens - prev.prompt_tokens
            hits = cur.hit_tokens - prev.hit_tokens
            out.hit_ratio.append(hits / prompt if prompt else math.nan)  # nothing admitted
            out.admitted_tokens.append(prompt)
            out.evictions_per_s.append((cur.evicted_blocks - prev.evicted_blocks) / span)
            for i in range(num_replicas):
                out.replica_busy[i].append(min(1.0, (cur.busy_s[i] - prev.busy_s[i]) / span))
                out.replica_queued[i].append(cur.queued[i])
        return out

    def summarize(
        self,
        *,
        router: str,
        eviction: str,
        busy_s: Sequence[float],
        evicted_blocks: int,
        hit_tokens_by_tier: Mapping[str, int],
    ) -> RunSummary:
        records = self.records
        arrival = np.fromiter((r.arrival_s for r in records), np.float64, len(records))
        first = np.fromiter((r.first_token_s for r in records), np.float64, len(records))
        finish = np.fromiter((r.finish_s for r in records), np.float64, len(records))
        prompt = np.fromiter((r.prompt_tokens for r in records), np.int64, len(records))
        output = np.fromiter((r.output_tokens for r in records), np.int64, len(records))
        prefill = sum(r.prefill_tokens for r in records)
        # TPOT applies to requests that decoded past their first token: not to one-token
        # outputs, nor to a prefill-only pool whose requests end at the first token.
        multi = (output > 1) & (finish > first)
        tpot = (finish[multi] - first[multi]) / (output[multi] - 1)
        total_prompt = int(prompt.sum())
        span = float(finish.max() - arrival.min()) if records else 0.0
        busy = np.asarray(busy_s, dtype=np.float64)
        by_tier = {
            tier: (hits / total_prompt if total_prompt else 0.0)
            for tier, hits in hit_tokens_by_tier.items()
        }
        return RunSummary(
            router=router,
            eviction=eviction,
            requests=len(records),
            ttft_s=Percentiles.of(first - arrival),
            tpot_s=Percentiles.of(tpot),
            e2e_s=Percentiles.of(finish - arrival),
            hit_ratio=sum(by_tier.values()),
            hit_ratio_by_tier=by_tier,
            throughput_tok_s=float(prompt.sum() + output.sum()) / span if span > 0 else 0.0,
            load_imbalance=float(busy.max() / busy.mean()) if busy.size and busy.mean() else 1.0,
            evictions_per_s=evicted_blocks / span if span > 0 else 0.0,
            prefill_tokens_computed=int(prefill),
        )
