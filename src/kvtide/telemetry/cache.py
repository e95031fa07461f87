"""CacheTelemetry: a cache's counters and per-block histograms turned into kvtide metrics.

The core counts (``KVCache.stats``, ``TieredCache.stats``); ``collect`` reads those totals and
records what changed since the previous call, so the request path pays nothing for counters.
Call it at whatever cadence suits (each engine iteration, each scrape, each simulator tick).
"""

from __future__ import annotations

from kvtide.core.cache import KVCache
from kvtide.core.tiers import TieredCache
from kvtide.telemetry.blocks import BlockTelemetry
from kvtide.telemetry.labels import TenantLabels
from kvtide.telemetry.metrics import (
    ALLOCATED_BLOCKS,
    CACHED_BLOCKS,
    CAPACITY_BLOCKS,
    EVICTED_BLOCKS,
    FREED_BLOCKS,
    HIT_TOKENS,
    LOOKUPS,
    MISS_TOKENS,
    PINNED_RATIO,
    PROMPT_TOKENS,
    TENANT_CACHED_BLOCKS,
    TENANT_HIT_TOKENS,
    TENANT_PROMPT_TOKENS,
    USED_BLOCKS,
    Metric,
)
from kvtide.telemetry.recorders import Labels, Recorder
from kvtide.types import Tier


class CacheTelemetry:
    """Records one replica's cache: a ``KVCache``, or a ``TieredCache`` (pass it as ``tiers``
    and its device as ``cache``). Counters are recorded as increments of the core's totals;
    gauges are set; block histograms come from a ``BlockTelemetry`` on the device."""

    def __init__(
        self,
        recorder: Recorder,
        cache: KVCache,
        *,
        tiers: TieredCache | None = None,
        tenants: TenantLabels | None = None,
    ) -> None:
        if tiers is not None and tiers.device is not cache:
            raise ValueError("cache must be the tiered cache's device tier")
        self.recorder = recorder
        self.cache = cache
        self.tiers = tiers
        self.tenants = tenants or TenantLabels()
        self.blocks = BlockTelemetry(cache)
        self._last: dict[tuple[str, Labels], float] = {}
        self._last_tenant: dict[str, tuple[int, int]] = {}

    def _add(self, metric: Metric, total: float, labels: Labels = ()) -> None:
        key = (metric.name, labels)
        delta = total - self._last.get(key, 0.0)
        if delta:
            self._last[key] = total
            self.recorder.inc(metric, delta, labels)

    def collect(self) -> None:
        """Records everything that changed since the previous call."""
        rec, cache, add = self.recorder, self.cache, self._add
        s = cache.stats()
        device = ("device",)
        add(LOOKUPS, s.lookups, device)
        add(PROMPT_TOKENS, s.prompt_tokens)
        add(HIT_TOKENS, s.hit_tokens, device)
        add(MISS_TOKENS, s.miss_tokens_cold, ("cold",))
        add(MISS_TOKENS, s.miss_tokens_evicted, ("evicted",))
        add(MISS_TOKENS, s.miss_tokens_other_namespace, ("other_namespace",))
        add(MISS_TOKENS, s.miss_tokens_partial, ("partial_block",))
        add(EVICTED_BLOCKS, s.evicted_blocks, device)
        add(ALLOCATED_BLOCKS, s.allocations_total)
        add(FREED_BLOCKS, s.frees_total)
        rec.set(CAPACITY_BLOCKS, s.capacity_blocks, device)
        rec.set(CACHED_BLOCKS, s.cached_blocks, device)
        rec.set(USED_BLOCKS, cache.pool.num_used)
        rec.set(PINNED_RATIO, s.pinned_blocks / s.capacity_blocks)
        if self.tiers is not None:
            recomputed = 0
            for tier, t in self.tiers.stats().tiers.items():
                if tier is Tier.DEVICE:
                    continue
                labels = (tier.name.lower(),)
                add(LOOKUPS, t.lookups, labels)
                add(HIT_TOKENS, t.hit_tokens, labels)
                add(EVICTED_BLOCKS, t.evicted_blocks, labels)
                rec.set(CAPACITY_BLOCKS, t.capacity_blocks, labels)
                rec.set(CACHED_BLOCKS, t.cached_blocks, labels)
                recomputed += t.hit_tokens - t.reloaded_tokens
            add(MISS_TOKENS, recomputed, ("recomputed",))
        self._collect_tenants()
        self.blocks.flush(rec)

    def _collect_tenants(self) -> None:
        tokens = self.cache.tenant_tokens()
        names = self.tenants
        names.assign({t: p for t, (p, _) in tokens.items()})
        last = self._last_tenant
        labels_seen: set[str] = set()
        for tenant, (p, h) in tokens.items():
            # Per tenant, not per label: a tenant promoted out of "other" keeps both monotonic.
            label = (names.label(tenant),)
            labels_seen.add(label[0])
            lp, lh = last.get(tenant, (0, 0))
            if p != lp:
                self.recorder.inc(TENANT_PROMPT_TOKENS, p - lp, label)
            if h != lh:
                self.recorder.inc(TENANT_HIT_TOKENS, h - lh, label)
            last[tenant] = (p, h)
        occupancy: dict[str, int] = dict.fromkeys(labels_seen, 0)
        for tenant, blocks in self.cache.tree.usage_blocks.items():
            name = names.label(tenant)
            occupancy[name] = occupancy.get(name, 0) + blocks
        for name, blocks in occupancy.items():
            self.recorder.set(TENANT_CACHED_BLOCKS, blocks, (name,))
