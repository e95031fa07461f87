"""``kvtide doctor``'s reasoning: observed cache counters in, a diagnosis out.

``Observed`` is what any source (a Prometheus server, a scrape file, a KV event log, a simulator
JSON) can say about a cache or a fleet; ``diagnose`` turns it into the ceiling of the hit ratio,
what holds it below that ceiling (each limit with the tokens it costs), and what to change.
The ceilings a workload alone can give (Belady's optimum, the pool size that reaches N% of the
infinite cache) are computed by the caller and passed in as ``Bounds``.

Attribution, from the miss causes the core counts (``telemetry.metrics.MISS_CAUSES``):
an infinite cache still misses ``cold`` tokens (first sight) and ``partial_block`` tokens (the
unfilled tail is never cached), so the infinite-cache ratio is 1 minus those shares.
``evicted`` misses are capacity, ``other_namespace`` misses are tenant isolation or quota,
``recomputed`` misses are a lower tier too slow to reload from. A gateway beside the engines
adds the evicted misses it had predicted as hits, whose prefix the engine evicted while the
request waited in its queue (``routing.watch``): capacity lost to queueing, which a shorter
queue recovers as well as a larger pool. A gateway's access log has, per request, the tokens
predicted cached and those the engine served from cache, not the causes: what was predicted
and not served is its limit, and the ceiling needs the workload replayed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

CAUSES = ("cold", "evicted", "other_namespace", "partial_block", "recomputed")


@dataclass(slots=True)
class Observed:
    source: str
    prompt_tokens: float = 0.0
    hit_tokens: float = 0.0
    miss_tokens: dict[str, float] = field(default_factory=dict)
    evicted_blocks: float = 0.0
    capacity_blocks: float = 0.0
    cached_blocks: float = 0.0
    instances: int = 1
    events_lost: float = 0.0
    evicted_queued_tokens: float = 0.0
    """Tokens a router predicted cached that the engine evicted while the request waited in
    its queue (``kvtide_router_evicted_queued_tokens_total``): part of the evicted misses."""
    replication: float | None = None
    """Mean replicas holding a hot prefix (the router's gauge); None when unknown."""
    quota_tenants: list[str] = field(default_factory=list)
    alerts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the source could not say, or said besides the counters."""
    routing_hit_ratios: dict[str, float] = field(default_factory=dict)
    """Hit ratio per router, when a simulator JSON compares several."""
    miss_causes: bool = True
    """False for a source that cannot tell a cold miss from an evicted one (a gateway's
    access log) until a replay of the workload fills ``miss_tokens``."""
    identity_checked: int = 0
    """Requests whose prompt the gateway tokenized and the engine counted too (an access
    log), and of them those the two counted differently, with the engine's prompt tokens."""
    identity_mismatches: int = 0
    identity_mismatched_tokens: float = 0.0
    unserved_predicted_tokens: float = 0.0
    """Tokens the router predicted cached that the engines computed, request by request (an
    access log): evicted while the request queued, or an index behind the engines' events."""

    @property
    def hit_ratio(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else math.nan


@dataclass(frozen=True, slots=True)
class Bounds:
    """Ceilings computed on the workload itself (``kvtide doctor --workload``)."""

    infinite_hit_ratio: float
    optimum_hit_ratio: float
    """Belady's optimum at the observed total capacity (one cache of the fleet's size)."""
    capacity_tokens: int
    target_share: float
    target_capacity_tokens: int | None
    """The smallest capacity (one cache) whose hit ratio with the observed eviction policy
    reaches ``target_share`` of the infinite cache; None when even the workload's whole
    footprint does not."""
    target_hit_ratio: float | None
    policy_hit_ratio: float
    """The eviction policy's own hit ratio at the observed capacity, replayed."""
    simulated: str | None = None
    """A line from the fleet simulator at the proposed size, when it was run."""


@dataclass(frozen=True, slots=True)
class Limit:
    name: str
    tokens: float
    """Prompt tokens it cost over the observed span (0 where it cannot be counted)."""
    share: float
    why: str
    change: str
    detail: str = ""
    """A part of ``tokens`` worth its own line (printed under ``why``)."""


@dataclass(frozen=True, slots=True)
class Diagnosis:
    observed: Observed
    infinite_hit_ratio: float
    limits: list[Limit]
    bounds: Bounds | None

    def lines(self) -> list[str]:
        o = self.observed
        out = [f"source: {o.source} ({o.instances} instance{'s' if o.instances != 1 else ''})"]
        if not o.prompt_tokens:
            out.append("no prompt tokens observed: nothing to diagnose yet")
            out += [f"note: {n}" for n in o.notes]
            return out
        out.append(
            f"hit ratio now: {_pct(o.hit_ratio)} of {o.prompt_tokens:,.0f} prompt tokens"
            + (f"; device pool {o.capacity_blocks:,.0f} blocks" if o.capacity_blocks else "")
            + (
                f", {o.cached_blocks / o.capacity_blocks:.0%} cached"
                if o.capacity_blocks and o.cached_blocks
                else ""
            )
        )
        if o.miss_causes:
            out.append(
                f"could be: {_pct(self.infinite_hit_ratio)} with an infinite cache "
                "(only cold and partial-block misses left)"
            )
        else:
            out.append(
                "could be: not known from this source (no miss causes); --workload replays "
                "the workload for them"
            )
        b = self.bounds
        if b is not None:
            out.append(
                f"optimum at this size ({b.capacity_tokens:,} tokens, Belady): "
                f"{_pct(b.optimum_hit_ratio)}; the eviction policy replayed: "
                f"{_pct(b.policy_hit_ratio)}; infinite cache on the workload: "
                f"{_pct(b.infinite_hit_ratio)}"
            )
        if not self.limits and not o.miss_causes:
            out.append(
                "limits: none measurable from this source (the router's predicted hits were "
                "served); --workload replays the miss causes"
            )
        elif not self.limits:
            out.append("limits: none measurable; the cache is at its ceiling")
        for i, lim in enumerate(self.limits, 1):
            out.append(f"limit {i}: {lim.name} ({_pct(lim.share)} of prompt tokens): {lim.why}")
            if lim.detail:
                out.append(f"  {lim.detail}")
            out.append(f"  change: {lim.change}")
        if b is not None:
            if b.target_capacity_tokens is None:
                out.append(
                    f"pool size: no capacity up to the workload's footprint reaches "
                    f"{b.target_share:.0%} of the infinite cache"
                )
            else:
                out.append(
                    f"pool size: {b.target_capacity_tokens:,} tokens in all reach "
                    f"{_pct(b.target_hit_ratio or 0.0)} = {b.target_share:.0%} of the infinite "
                    f"cache ({b.target_capacity_tokens / max(1, b.capacity_tokens):.2f}x now)"
                )
            if b.simulated:
                out.append(f"  simulated: {b.simulated}")
        if o.alerts:
            out.append(f"alerts firing: {', '.join(o.alerts)}")
        out += [f"note: {n}" for n in o.notes]
        return out


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def diagnose(o: Observed, bounds: Bounds | None = None) -> Diagnosis:
    p = o.prompt_tokens
    miss = {c: o.miss_tokens.get(c, 0.0) for c in CAUSES}
    unavoidable = miss["cold"] + miss["partial_block"]
    infinite = 1.0 - unavoidable / p if p else math.nan
    limits: list[Limit] = []
    if p:
        queued = o.evicted_queued_tokens
        if miss["evicted"] > 0:
            why = (
                f"{miss['evicted']:,.0f} tokens missed after their blocks were evicted "
                f"({o.evicted_blocks:,.0f} blocks evicted)"
            )
            change = (
                "a larger device pool or a host tier (see the pool size below)"
                if bounds
                else "a larger device pool or a host tier; run doctor with --workload to size it"
            )
            detail = ""
            if queued > 0:
                detail = (
                    f"of them, {min(queued, miss['evicted']):,.0f} were predicted hits evicted "
                    "while queued at an engine"
                )
                change += "; or shorter engine queues"
            elif o.unserved_predicted_tokens > 0:  # an access log's, beside a replay's causes
                detail = (
                    f"observed: {o.unserved_predicted_tokens:,.0f} tokens the router predicted "
                    "cached were computed by the engines (evicted while queued, or an index "
                    "behind the engines' events)"
                )
            limits.append(
                Limit("capacity", miss["evicted"], miss["evicted"] / p, why, change, detail)
            )
        elif o.unserved_predicted_tokens > 0:  # an access log: per request, no causes
            unserved = o.unserved_predicted_tokens
            limits.append(
                Limit(
                    "predicted hits not served",
                    unserved,
                    unserved / p,
                    f"{unserved:,.0f} tokens the router predicted cached were computed by the "
                    "engines: evicted while their requests queued, or an index behind the "
                    "engines' KV events",
                    "engines that admit by the router's deadlines (cost:deadline_k=10 with "
                    "priority scheduling) keep a queued request's prefix; a lag or lost "
                    "batches in kvtide_router_* mean the index, not the engines",
                )
            )
        elif queued > 0:  # the router's view alone (no engine cache counters)
            limits.append(
                Limit(
                    "capacity (queue evictions)",
                    queued,
                    queued / p,
                    f"{queued:,.0f} tokens the router predicted cached were evicted while their "
                    "requests waited in the engines' queues",
                    "a larger device pool, or shorter engine queues (more replicas for this load)",
                )
            )
        if miss["other_namespace"] > 0:
            limits.append(
                Limit(
                    "tenant isolation / quota",
                    miss["other_namespace"],
                    miss["other_namespace"] / p,
                    f"{miss['other_namespace']:,.0f} tokens were cached under another tenant's "
                    "salt",
                    "share system prompts through a common namespace only where tenants may "
                    "see each other; raise the tenant's quota if it is the one evicting",
                )
            )
        if miss["partial_block"] > 0.02 * p:
            limits.append(
                Limit(
                    "fragmentation (block size)",
                    miss["partial_block"],
                    miss["partial_block"] / p,
                    f"{miss['partial_block']:,.0f} tokens sat in partly filled last blocks",
                    "a smaller block size (kvtide profile compares 8..128 tokens)",
                )
            )
        if miss["recomputed"] > 0:
            limits.append(
                Limit(
                    "slow lower tier",
                    miss["recomputed"],
                    miss["recomputed"] / p,
                    f"{miss['recomputed']:,.0f} tokens were found below the device and "
                    "recomputed because reloading was slower",
                    "a faster host link or larger chunks per copy (kvtide cost)",
                )
            )
        if o.routing_hit_ratios:
            best_name, best = max(o.routing_hit_ratios.items(), key=lambda kv: kv[1])
            gap = best - o.hit_ratio
            if gap > 0.005:
                limits.append(
                    Limit(
                        "routing spread",
                        gap * p,
                        gap,
                        f"router {best_name} reached {_pct(best)} on the same workload",
                        f"route with {best_name}",
                    )
                )
        elif o.replication is not None and o.replication > 1.5 and o.instances > 1:
            limits.append(
                Limit(
                    "routing spread",
                    0.0,
                    0.0,
                    f"hot prefixes are held by {o.replication:.2f} replicas on average: the "
                    "same prefix takes room on several pools",
                    "prefix-aware routing (kvtide simulate compares routers)",
                )
            )
    if o.identity_mismatches > 0:
        lost = o.identity_mismatched_tokens
        limits.append(
            Limit(
                "prefix identity",
                lost,
                lost / p if p else 0.0,
                f"{o.identity_mismatches:,} of {o.identity_checked:,} requests were counted "
                "other prompt tokens by the engine than by the gateway's tokenizer: the gateway "
                "hashes other blocks than the engine caches, so its index cannot match them",
                "give kvtide serve --tokenizer the engine's own files (tokenizer.json and the "
                "tokenizer_config.json with its chat template)",
            )
        )
    if o.events_lost > 0:
        limits.append(
            Limit(
                "event loss",
                0.0,
                0.0,
                f"{o.events_lost:,.0f} KV event batches lost: the router's index is wrong "
                "until the next resync",
                "check the event channel (ZMQ high-water mark, subscriber lag); resync on gaps",
            )
        )
    limits.sort(key=lambda lim: -lim.tokens)
    return Diagnosis(o, infinite, limits, bounds)
