"""vLLM's Prometheus metrics, same names, types and buckets (vllm/v1/metrics/loggers.py, vLLM
0.33), exposed with prometheus-client; latencies are the wall seconds clients see.

The values live in plain ints and floats and reach prometheus-client through one collector at
scrape time: an inter-token latency is observed once per streamed token, and
``Histogram.observe`` (a lock and a Python loop over the buckets, ~19 µs here) cost more than
the rest of a token's path; ``bisect`` into a list costs well under a microsecond.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from kvtide.telemetry.online import EngineTelemetry
from kvtide.telemetry.recorders import PrometheusRecorder

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
"""vLLM's ``PromptTokenStats.ALL_SOURCES``, the labels of ``vllm:prompt_tokens_by_source``."""
CONTENT_TYPE = CONTENT_TYPE_LATEST
LABELS = ("model_name", "engine")


class _Histogram:
    """Bucket counts (``le`` inclusive, as Prometheus), a sum and a count."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = list(bounds)
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, n in zip([*map(repr, self.bounds), "+Inf"], self.counts, strict=True):
            running += n
            out.append((bound, float(running)))
        return out


class EngineMetrics:
    """The counters, gauges and histograms of one engine; ``render()`` is the /metrics body."""

    def __init__(self, model_name: str, *, kv_connector: bool = False) -> None:
        """``kv_connector``: the engine runs a KV connector (``--kv-transfer-config``), whose
        queries vLLM counts for every request."""
        self.labels = [model_name, "0"]
        self.kv_connector = kv_connector
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.external_queries = 0
        self.external_hits = 0
        self.cached_tokens = 0
        self.kv_expired = 0  # a prefill's held blocks let go unread (the NIXL lease ran out)
        self.reads_after_expiry = 0  # reads of blocks no longer held
        self.by_source = dict.fromkeys(PROMPT_SOURCES, 0)
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.ttft = _Histogram(TTFT_BUCKETS)
        self.itl = _Histogram(ITL_BUCKETS)
        self.e2e = _Histogram(E2E_BUCKETS)
        zero: Callable[[], float] = lambda: 0.0  # noqa: E731
        self._gauges = {"running": zero, "waiting": zero, "usage": zero}
        self._evicted_blocks = zero
        self._cache_info: dict[str, str] = {}
        self.registry = CollectorRegistry()
        self.registry.register(_Families(self))
        self._telemetry: EngineTelemetry | None = None

    def attach_telemetry(self, telemetry: EngineTelemetry) -> None:
        """Serves the kvtide_* families (``kvtide.telemetry``) after the vllm:* ones; a scrape
        also ticks the online early warning, so it runs while the engine sleeps."""
        self._telemetry = telemetry

    def set_cache_config(self, block_size: int, num_gpu_blocks: int) -> None:
        """vLLM's ``cache_config_info`` (its CacheConfig as labels, value 1); the two labels a
        router reads to learn the engine's KV capacity."""
        self._cache_info = {"block_size": str(block_size), "num_gpu_blocks": str(num_gpu_blocks)}

    def bind_gauges(
        self,
        running: Callable[[], float],
        waiting: Callable[[], float],
        kv_usage: Callable[[], float],
        evicted_blocks: Callable[[], float] | None = None,
    ) -> None:
        """Gauges (and the eviction counter) read from the engine at scrape time, no
        bookkeeping on the hot path."""
        self._gauges = {"running": running, "waiting": waiting, "usage": kv_usage}
        if evicted_blocks is not None:
            self._evicted_blocks = evicted_blocks

    def prefilled(self, prompt_tokens: int, cached_tokens: int, loaded_tokens: int = 0) -> None:
        """A request's prefill completed (its first token is out): its prompt counts now, as
        vLLM counts a prompt in the iteration that prefilled it, and a request aborted while
        waiting never does. ``cached_tokens`` are the engine's (local hit and
        ``loaded_tokens``, the KV a remote prefill brought); prefix-cache queries are prompt
        tokens and hits the local part, the connector's queries what the local hit left and
        its hits what it loaded (vLLM's ``PrefillStats``)."""
        local = cached_tokens - loaded_tokens
        self.prompt_tokens += prompt_tokens
        self.prefix_queries += prompt_tokens
        self.prefix_hits += local
        if self.kv_connector:
            self.external_queries += prompt_tokens - local
            self.external_hits += loaded_tokens
        self.cached_tokens += cached_tokens
        by_source = self.by_source
        by_source["local_compute"] += prompt_tokens - cached_tokens
        by_source["local_cache_hit"] += local
        by_source["external_kv_transfer"] += loaded_tokens

    def first_token(self, ttft_s: float) -> None:
        """A request's first generated token, ``ttft_s`` after its arrival."""
        self.generation_tokens += 1
        self.ttft.observe(ttft_s)

    def inter_token(self, itl_s: float) -> None:
        """A later generated token, ``itl_s`` after the request's previous one."""
        self.generation_tokens += 1
        self.itl.observe(itl_s)

    def ended(self, reason: str, e2e_s: float) -> None:
        """A request left the engine ("stop", "length" or "abort"); its tokens were counted
        as they were processed."""
        if reason in self.success:
            self.success[reason] += 1
        if reason != "abort":
            self.e2e.observe(e2e_s)

    def render(self) -> bytes:
        body = generate_latest(self.registry)
        tel = self._telemetry
        if tel is None:
            return body
        tel.tick()
        assert isinstance(tel.recorder, PrometheusRecorder)
        return body + tel.recorder.exposition()

    def families(self) -> Iterator[Metric]:
        lab = self.labels
        gauges = self._gauges
        if self._cache_info:
            names = list(self._cache_info)
            info = GaugeMetricFamily(
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
                labels=[*names, "engine"],
            )
            info.add_metric([*self._cache_info.values(), lab[1]], 1.0)
            yield info
        for name, doc, key in (
            ("vllm:num_requests_running", "Requests in model execution batches.", "running"),
            ("vllm:num_requests_waiting", "Requests waiting to be processed.", "waiting"),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent.", "usage"),
        ):
            g = GaugeMetricFamily(name, doc, labels=LABELS)
            g.add_metric(lab, float(gauges[key]()))
            yield g
        for name, doc, value in (
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                self.prefix_queries,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                self.prefix_hits,
            ),
            (
                "vllm:external_prefix_cache_queries",
                "External prefix cache queries from KV connector cross-instance cache sharing, "
                "in terms of number of queried tokens.",
                self.external_queries,
            ),
            (
                "vllm:external_prefix_cache_hits",
                "External prefix cache hits from KV connector cross-instance cache sharing, "
                "in terms of number of cached tokens.",
                self.external_hits,
            ),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens),
            (
                "vllm:prompt_tokens_cached",
                "Number of cached prompt tokens (local + external).",
                self.cached_tokens,
            ),
            (
                "vllm:generation_tokens",
                "Number of generation tokens processed.",
                self.generation_tokens,
            ),
        ):
            c = CounterMetricFamily(name, doc, labels=LABELS)
            c.add_metric(lab, float(value))
            yield c
        # not a vLLM metric: blocks the device cache evicted, so a dashboard can show eviction
        # velocity (vLLM exposes none; its KV events carry the same as BlockRemoved)
        evicted = CounterMetricFamily(
            "kvtide_engine_evicted_blocks",
            "KV blocks evicted from the device cache.",
            labels=LABELS,
        )
        evicted.add_metric(lab, float(self._evicted_blocks()))
        yield evicted
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            labels=(*LABELS, "source"),
        )
        for source, n in self.by_source.items():
            by_source.add_metric([*lab, source], float(n))
        yield by_source
        if self.kv_connector:
            for name, doc, value in (
                (
                    "vllm:nixl_num_kv_expired_reqs",
                    "Number of requests that had their KV expire. "
                    "NOTE: This metric is tracked on the P instance.",
                    self.kv_expired,
                ),
                (
                    "vllm:nixl_num_notifications_after_expiry",
                    "Number of completion notifications for requests that were no longer "
                    "tracked, usually because their KV lease expired.",
                    self.reads_after_expiry,
                ),
            ):
                c = CounterMetricFamily(name, doc, labels=LABELS)
                c.add_metric(lab, float(value))
                yield c
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=(*LABELS, "finished_reason"),
        )
        for reason, n in self.success.items():
            success.add_metric([*lab, reason], float(n))
        yield success
        for name, doc, hist in (
            (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                self.ttft,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                self.itl,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                self.e2e,
            ),
        ):
            h = HistogramMetricFamily(name, doc, labels=LABELS)
            h.add_metric(lab, hist.cumulative(), hist.total)
            yield h


class _Families(Collector):
    def __init__(self, metrics: EngineMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self.metrics.families()
