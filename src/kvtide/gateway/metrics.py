"""The gateway's Prometheus metrics, declared once, in a registry per app; the kvtide_router_*
and kvtide_alert_* families (``gateway.telemetry``) are served after them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

# the *_created series would double the exposition for no use here
disable_created_metrics()  # type: ignore[no-untyped-call]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# the gateway's own time: tenths of a millisecond on a quiet machine, more under load
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1)


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "kvtide_gateway_requests_total",
            "Requests answered, by endpoint and HTTP status",
            ["endpoint", "status"],
            registry=r,
        )
        self.first_byte = Histogram(
            "kvtide_gateway_first_byte_seconds",
            "Arrival to the first byte sent back",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "kvtide_gateway_overhead_seconds",
            "Arrival to the request handed to its engine's connection, first attempt: the "
            "gateway's own time (body, prompt identity, routing), with any wait for room at "
            "a capped replica; the engine's time is first_byte less this",
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "kvtide_gateway_request_duration_seconds",
            "Arrival to the last byte sent back",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.decisions = Counter(
            "kvtide_gateway_route_decisions_total",
            "Routing decisions by replica and by the branch the policy took",
            ["replica", "reason"],
            registry=r,
        )
        self.predicted_cached = Counter(
            "kvtide_gateway_predicted_cached_tokens_total",
            "Prompt tokens the policy predicted cached on the chosen replica",
            registry=r,
        )
        self.tenant_tokens = Counter(
            "kvtide_gateway_tenant_tokens_total",
            "Tokens the engines reported per tenant (usage): kind prompt, cached (of the "
            "prompt, served from the engine's prefix cache) or completion",
            ["tenant", "kind"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "kvtide_gateway_upstream_errors_total",
            "Failed upstream attempts, by replica and kind",
            ["replica", "kind"],
            registry=r,
        )
        self.retries = Counter(
            "kvtide_gateway_retries_total", "Requests retried on another replica", registry=r
        )
        self.client_disconnects = Counter(
            "kvtide_gateway_client_disconnects_total",
            "Requests whose client went away (upstream cancelled)",
            registry=r,
        )
        self.rejected = Counter(
            "kvtide_gateway_rejected_total",
            "Requests refused before routing, by reason",
            ["reason"],
            registry=r,
        )
        self.queued = Gauge(
            "kvtide_gateway_queued",
            "Requests waiting at the gateway for a replica under limits.max_in_flight_per_replica",
            registry=r,
        )
        self.queue_wait = Histogram(
            "kvtide_gateway_queue_wait_seconds",
            "Time a request waited at the gateway for a replica with room (queued ones only)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "kvtide_gateway_replica_in_flight",
            "Requests in flight through this gateway",
            ["replica"],
            registry=r,
        )
        self.healthy = Gauge(
            "kvtide_gateway_replica_healthy",
            "1 when the replica is routable",
            ["replica"],
            registry=r,
        )
        self.kv_events = Counter(
            "kvtide_gateway_kv_event_batches_total",
            "KV event batches received, by replica",
            ["replica"],
            registry=r,
        )
        self.kv_event_bootstrap_failures = Counter(
            "kvtide_gateway_kv_event_bootstrap_failures_total",
            "Replays of an engine's event buffer at the intake's (re)start that went "
            "unanswered or stopped short, each asked again later; by replica",
            ["replica"],
            registry=r,
        )
        self.prefix_cache_tokens = Gauge(
            "kvtide_gateway_prefix_cache_tokens",
            "Token ids the conversation-prefix tokenization cache holds (its bound: "
            "--prefix-cache-tokens)",
            registry=r,
        )
        self.prefix_cache_entries = Gauge(
            "kvtide_gateway_prefix_cache_entries",
            "Conversation prefixes the tokenization cache holds",
            registry=r,
        )
        self.chunk_memo_tokens = Gauge(
            "kvtide_gateway_chunk_memo_tokens",
            "Token ids the tokenizer's chunk memo holds: long prompts' ~1 KB chunks seen twice "
            "(token mode)",
            registry=r,
        )
        self.chunk_memo_chunks = Counter(
            "kvtide_gateway_chunk_memo_chunks_total",
            "Chunks of long prompts looked up in the tokenizer's chunk memo: hit (ids reused) "
            "or miss (tokenized)",
            ["result"],
            registry=r,
        )
        self.prompt_heads = Counter(
            "kvtide_gateway_prompt_heads_total",
            "Prompts routed on their first blocks, held nowhere further: the rest not tokenized "
            "(token mode, cold_heads)",
            registry=r,
        )
        self.prompt_head_rests = Counter(
            "kvtide_gateway_prompt_head_rests_total",
            "Heads whose rest was tokenized afterwards, for a follow-up that reached the head",
            registry=r,
        )
        self.access_log_dropped = Counter(
            "kvtide_gateway_access_log_dropped_total",
            "Access log lines lost: the writer fell behind (a stalled disk) or a write failed",
            registry=r,
        )
        self.state_degraded = Gauge(
            "kvtide_gateway_state_degraded",
            "1 while the shared state store is unreachable (local index in use)",
            registry=r,
        )

        self._children: dict[tuple[object, tuple[str, ...]], Any] = {}
        self._memo_exported: dict[str, int] = {}
        self._more: Callable[[], bytes] = bytes

    def export_chunk_memo(self, tokens: int, hits: int, misses: int) -> None:
        """At a scrape: the memo's own counts (kept on the request path with no metric call)
        into the gauge and counters, which move by what changed since the last scrape."""
        self.chunk_memo_tokens.set(tokens)
        for result, now in (("hit", hits), ("miss", misses)):
            before = self._memo_exported.get(result, 0)
            if now > before:
                self.child(self.chunk_memo_chunks, result).inc(now - before)
                self._memo_exported[result] = now

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, memoised: ``labels`` costs ~5 us a call, and a request
        touches four labelled series (the label values are bounded by config)."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def attach(self, more: Callable[[], bytes]) -> None:
        """``more()`` is rendered after this registry at each scrape (the telemetry's
        exposition, collected at that moment)."""
        self._more = more

    def render(self) -> bytes:
        return generate_latest(self.registry) + self._more()
