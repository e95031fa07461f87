"""Every kvtide metric, declared once: name, type, unit, help text and bounded label values.

Names follow ``kvtide_<subsystem>_<name>_<unit>`` in base units, ``_total`` on counters
(Prometheus naming). A label lists its values here, or is ``tenant`` (bounded by
``TenantLabels``: the top tenants plus ``other``); nothing else may appear as a label value.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kvtide.types import Tier


class Kind(enum.StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


TIERS = tuple(t.name.lower() for t in Tier)
MISS_CAUSES = ("cold", "evicted", "other_namespace", "partial_block", "recomputed")
"""Why prompt tokens were not served from the device: never seen (within the ghost memory);
evicted and wanted again; cached under another tenant's namespace; the partial last block;
found in a lower tier but recomputed because reloading was slower."""
ALERTS = ("pool_undersized", "cold_start", "fragmentation")
TENANT = "tenant"
"""The one open-ended label, bounded at run time by ``TenantLabels``."""

# Seconds from 10 ms to about 3 h: block lifetimes and reuse gaps span request latencies to
# session idle times (reuse gaps have a median of ~2 minutes on the Mooncake trace).
SECONDS_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.5,
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    10800.0,
)
_NAME = re.compile(r"^kvtide_(cache|router|alert)_[a-z_]+$")
_UNITS = ("_total", "_blocks", "_tokens", "_seconds", "_ratio", "_replicas")


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    kind: Kind
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.match(self.name) or not self.name.endswith(_UNITS):
            raise ValueError(f"metric name {self.name} breaks kvtide_<subsystem>_<name>_<unit>")
        if (self.kind is Kind.COUNTER) != self.name.endswith("_total"):
            raise ValueError(f"{self.name}: counters, and only counters, end in _total")
        if (self.kind is Kind.HISTOGRAM) != bool(self.buckets):
            raise ValueError(f"{self.name}: histograms, and only histograms, have buckets")
        for label in self.labels:
            if label != TENANT and label not in LABEL_VALUES:
                raise ValueError(f"{self.name}: label {label} has no bounded value set")


LABEL_VALUES: Mapping[str, tuple[str, ...]] = {
    "tier": TIERS,
    "cause": MISS_CAUSES,
    "alert": ALERTS,
}


def _c(name: str, unit: str, help: str, *labels: str) -> Metric:
    return Metric(name, Kind.COUNTER, unit, help, labels)


def _g(name: str, unit: str, help: str, *labels: str) -> Metric:
    return Metric(name, Kind.GAUGE, unit, help, labels)


def _h(name: str, help: str) -> Metric:
    return Metric(name, Kind.HISTOGRAM, "seconds", help, (), SECONDS_BUCKETS)


# --- the cache ------------------------------------------------------------------------------

LOOKUPS = _c(
    "kvtide_cache_lookups_total",
    "requests",
    "Request lookups per tier: every one on the device, in a lower tier those the tiers "
    "above did not fully serve.",
    "tier",
)
PROMPT_TOKENS = _c("kvtide_cache_prompt_tokens_total", "tokens", "Prompt tokens looked up.")
HIT_TOKENS = _c(
    "kvtide_cache_hit_tokens_total",
    "tokens",
    "Prompt tokens found cached, in the fastest tier holding them.",
    "tier",
)
MISS_TOKENS = _c(
    "kvtide_cache_miss_tokens_total",
    "tokens",
    "Prompt tokens not served from the device, by cause (recomputed: found in a lower tier, "
    "also counted as that tier's hit, but recomputed because reloading was slower).",
    "cause",
)
EVICTED_BLOCKS = _c(
    "kvtide_cache_evicted_blocks_total",
    "blocks",
    "Blocks evicted per tier; its rate is the eviction velocity.",
    "tier",
)
ALLOCATED_BLOCKS = _c(
    "kvtide_cache_allocated_blocks_total",
    "blocks",
    "Device pool block allocations; over the token rate, the churn ratio.",
)
FREED_BLOCKS = _c("kvtide_cache_freed_blocks_total", "blocks", "Device pool block frees.")
CAPACITY_BLOCKS = _g("kvtide_cache_capacity_blocks", "blocks", "Blocks per tier.", "tier")
CACHED_BLOCKS = _g(
    "kvtide_cache_cached_blocks", "blocks", "Blocks holding a cached prefix, per tier.", "tier"
)
USED_BLOCKS = _g(
    "kvtide_cache_used_blocks",
    "blocks",
    "Device pool blocks in use: cached prefixes plus private blocks (partial last blocks, "
    "generated tokens, slots reserved ahead).",
)
PINNED_RATIO = _g("kvtide_cache_pinned_ratio", "ratio", "Pinned device blocks over capacity.")
BLOCK_LIFETIME = _h(
    "kvtide_cache_block_lifetime_seconds",
    "Seconds from storing a device block to evicting it, every block.",
)
BLOCK_IDLE = _h(
    "kvtide_cache_block_idle_seconds",
    "Seconds a device block sat unused before it was evicted, every block.",
)
BLOCK_REUSE_GAP = _h(
    "kvtide_cache_block_reuse_gap_seconds",
    "Seconds between consecutive uses of a cached device block, every block hit.",
)
TENANT_CACHED_BLOCKS = _g(
    "kvtide_cache_tenant_cached_blocks", "blocks", "Device blocks stored by a tenant.", TENANT
)
TENANT_PROMPT_TOKENS = _c(
    "kvtide_cache_tenant_prompt_tokens_total", "tokens", "Prompt tokens per tenant.", TENANT
)
TENANT_HIT_TOKENS = _c(
    "kvtide_cache_tenant_hit_tokens_total",
    "tokens",
    "Device hit tokens per tenant (over the tenant's prompt tokens: its hit ratio).",
    TENANT,
)

# --- the router -----------------------------------------------------------------------------

INDEX_LAG = _g(
    "kvtide_router_index_lag_seconds",
    "seconds",
    "Index staleness: the latest KV event batch's delay, worst replica.",
)
INDEX_MAX_LAG = _g(
    "kvtide_router_index_max_lag_seconds", "seconds", "The worst KV event delay seen so far."
)
EVENTS_LOST = _c(
    "kvtide_router_events_lost_total",
    "batches",
    "KV event batches found missing by sequence gaps.",
)
RESYNCS = _c("kvtide_router_resyncs_total", "resyncs", "Replica indexes rebuilt from a snapshot.")
PREDICTED_TOKENS = _c(
    "kvtide_router_predicted_cached_tokens_total",
    "tokens",
    "Cached tokens the router's index predicted on the chosen replicas.",
)
REPORTED_TOKENS = _c(
    "kvtide_router_reported_cached_tokens_total",
    "tokens",
    "Cached tokens the engines reported reusing.",
)
REGRET_TOKENS = _c(
    "kvtide_router_regret_tokens_total",
    "tokens",
    "Routing regret: predicted and reported cached tokens that disagree (both directions).",
)
EVICTED_QUEUED_TOKENS = _c(
    "kvtide_router_evicted_queued_tokens_total",
    "tokens",
    "Predicted cached tokens the engine evicted while the request waited in its queue.",
)
PREFILL_PACE = _g(
    "kvtide_router_prefill_pace_ratio",
    "ratio",
    "The engines' prefill seconds over the routing TTFT model's, from recent first tokens "
    "(1 until learned).",
)
REPLICATION = _g(
    "kvtide_router_prefix_replication_replicas",
    "replicas",
    "Prefix replication factor: mean number of replicas holding each of the hottest prefixes.",
)

# --- the early warning ----------------------------------------------------------------------

ALERT_ACTIVE = _g("kvtide_alert_active_ratio", "ratio", "1 while an alert is firing.", "alert")
ALERT_FIRED = _c("kvtide_alert_fired_total", "alerts", "Alerts raised (firing edges).", "alert")

ALL: tuple[Metric, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Metric))
BY_NAME: Mapping[str, Metric] = {m.name: m for m in ALL}
