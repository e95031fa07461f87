"""vLLM's Prometheus metrics, same names, types and buckets (vllm/v1/metrics/loggers.py, vLLM
0.33), on a registry of the server's own; latencies are the wall seconds clients see."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort")
CONTENT_TYPE = CONTENT_TYPE_LATEST


class EngineMetrics:
    """The counters, gauges and histograms of one engine; ``render()`` is the /metrics body."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ("model_name", "engine")
        values = (model_name, "0")
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r)

        self._running = gauge("vllm:num_requests_running", "Requests in model execution batches.")
        self._waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be processed.")
        self._usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent.")
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            labels,
            registry=r,
        ).labels(*values)
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            labels,
            registry=r,
        ).labels(*values)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=r
        ).labels(*values)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=r
        ).labels(*values)
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*labels, "finished_reason"),
            registry=r,
        )
        self.success = {f: success.labels(*values, f) for f in FINISH_REASONS}
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=r,
        ).labels(*values)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
            buckets=ITL_BUCKETS,
            registry=r,
        ).labels(*values)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            labels,
            buckets=E2E_BUCKETS,
            registry=r,
        ).labels(*values)
        self._values = values

    def bind_gauges(
        self,
        running: Callable[[], float],
        waiting: Callable[[], float],
        kv_usage: Callable[[], float],
    ) -> None:
        """Gauges read from the engine at scrape time (no bookkeeping on the hot path)."""
        self._running.labels(*self._values).set_function(running)
        self._waiting.labels(*self._values).set_function(waiting)
        self._usage.labels(*self._values).set_function(kv_usage)

    def first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)

    def inter_token(self, itl_s: float) -> None:
        self.itl.observe(itl_s)

    def finished(
        self, reason: str, prompt_tokens: int, output_tokens: int, cached_tokens: int, e2e_s: float
    ) -> None:
        """A request left the engine: its tokens count as vLLM counts them (prefix-cache
        queries are prompt tokens, hits the cached tokens reported in ``usage``)."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(output_tokens)
        self.prefix_queries.inc(prompt_tokens)
        self.prefix_hits.inc(cached_tokens)
        counter = self.success.get(reason)
        if counter is not None:
            counter.inc()
        if reason != "abort":
            self.e2e.observe(e2e_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
