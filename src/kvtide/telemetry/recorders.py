"""Recorders: where metric updates go. Null (drops them), in memory (the simulator and tests
read values back) and Prometheus (the in-memory values, exposed through ``prometheus_client``).

Callers hold a ``Recorder`` and call it unconditionally: the null one is a null object, so
hot code never asks ``if recorder:``. Histograms take pre-bucketed batches
(``observe_buckets``) so that per-block observations can be buffered and counted in bulk.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric as PromMetric
from prometheus_client.registry import Collector

from kvtide.telemetry.metrics import ALL, Kind, Metric

Labels = tuple[str, ...]


class Recorder(Protocol):
    def inc(self, metric: Metric, value: float = 1.0, labels: Labels = ()) -> None: ...

    def set(self, metric: Metric, value: float, labels: Labels = ()) -> None: ...

    def observe(self, metric: Metric, value: float, labels: Labels = ()) -> None: ...

    def observe_buckets(
        self, metric: Metric, counts: Sequence[int], total: float, labels: Labels = ()
    ) -> None:
        """Adds ``counts[i]`` observations to bucket i of ``metric.buckets`` (the last entry:
        above the highest bound) whose values add up to ``total``."""
        ...


class NullRecorder:
    """Drops everything."""

    __slots__ = ()

    def inc(self, metric: Metric, value: float = 1.0, labels: Labels = ()) -> None:
        pass

    def set(self, metric: Metric, value: float, labels: Labels = ()) -> None:
        pass

    def observe(self, metric: Metric, value: float, labels: Labels = ()) -> None:
        pass

    def observe_buckets(
        self, metric: Metric, counts: Sequence[int], total: float, labels: Labels = ()
    ) -> None:
        pass


class Histogram:
    """Non-cumulative bucket counts (one more than the bounds: the overflow) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding quantile ``q`` (inf past the last bound)."""
        total = self.count
        if not total:
            return math.nan
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= q * total:
                return self.bounds[i] if i < len(self.bounds) else math.inf
        return math.inf


class MemoryRecorder:
    """Keeps every value in dictionaries keyed by (metric name, label values)."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, Labels], float] = {}
        self.histograms: dict[tuple[str, Labels], Histogram] = {}

    def inc(self, metric: Metric, value: float = 1.0, labels: Labels = ()) -> None:
        key = (metric.name, labels)
        self.values[key] = self.values.get(key, 0.0) + value

    def set(self, metric: Metric, value: float, labels: Labels = ()) -> None:
        self.values[(metric.name, labels)] = value

    def observe(self, metric: Metric, value: float, labels: Labels = ()) -> None:
        h = self._histogram(metric, labels)
        h.counts[bisect.bisect_left(metric.buckets, value)] += 1
        h.sum += value

    def observe_buckets(
        self, metric: Metric, counts: Sequence[int], total: float, labels: Labels = ()
    ) -> None:
        h = self._histogram(metric, labels)
        for i, c in enumerate(counts):
            h.counts[i] += c
        h.sum += total

    def _histogram(self, metric: Metric, labels: Labels) -> Histogram:
        key = (metric.name, labels)
        h = self.histograms.get(key)
        if h is None:
            h = self.histograms[key] = Histogram(metric.buckets)
        return h

    # --- reading back ------------------------------------------------------------------

    def value(self, metric: Metric, labels: Labels = ()) -> float:
        return self.values.get((metric.name, labels), 0.0)

    def total(self, metric: Metric) -> float:
        """The sum over every label set of ``metric``."""
        return sum(v for (name, _), v in self.values.items() if name == metric.name)

    def by_label(self, metric: Metric) -> dict[Labels, float]:
        return {labels: v for (name, labels), v in self.values.items() if name == metric.name}

    def histogram(self, metric: Metric, labels: Labels = ()) -> Histogram:
        return self.histograms.get((metric.name, labels)) or Histogram(metric.buckets)


class PrometheusRecorder(MemoryRecorder):
    """The in-memory values served as Prometheus metric families from ``registry`` (its own
    ``CollectorRegistry``: mount it with ``prometheus_client.make_asgi_app(registry)`` or
    render it with ``exposition()``). Updates are dictionary writes; the families are built
    only when scraped."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__()
        self.registry = registry or CollectorRegistry(auto_describe=False)
        self.registry.register(_Families(self))

    def exposition(self) -> bytes:
        """The Prometheus text format of every declared metric."""
        return generate_latest(self.registry)


class _Families(Collector):
    def __init__(self, source: MemoryRecorder) -> None:
        self.source = source

    def collect(self) -> Iterator[PromMetric]:
        values, histograms = self.source.values, self.source.histograms
        for metric in ALL:
            # prometheus_client adds the _total suffix of counters itself.
            base = metric.name.removesuffix("_total")
            labels = list(metric.labels)
            if metric.kind is Kind.HISTOGRAM:
                hfam = HistogramMetricFamily(base, metric.help, labels=labels, unit="")
                for (name, lv), h in histograms.items():
                    if name == metric.name:
                        cumulative, buckets = 0, []
                        for bound, c in zip((*h.bounds, math.inf), h.counts, strict=True):
                            cumulative += c
                            buckets.append((_bound(bound), float(cumulative)))
                        hfam.add_metric(list(lv), buckets, h.sum)
                yield hfam
                continue
            family: CounterMetricFamily | GaugeMetricFamily
            if metric.kind is Kind.COUNTER:
                family = CounterMetricFamily(base, metric.help, labels=labels)
            else:
                family = GaugeMetricFamily(base, metric.help, labels=labels)
            for (name, lv), v in values.items():
                if name == metric.name:
                    family.add_metric(list(lv), v)
            yield family


def _bound(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))
