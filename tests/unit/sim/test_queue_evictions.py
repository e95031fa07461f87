"""Under KV pressure engines evict predicted prefixes while requests wait in their queues; the
simulator's index health tells that apart from a wrong index (``routing.watch``)."""

from __future__ import annotations

from kvtide.routing.consistency import HealthSummary
from kvtide.sim.fleet import Fleet
from kvtide.sim.scenario import Scenario, run

# chat sessions on engines whose KV holds about two conversations, at a pace that queues
SCARCE = Scenario(
    workload="builtin:chat:sessions=120,turns=6,duration_s=60,system_prompts=8,"
    "system_tokens=1200,user_tokens=200,output_tokens=32,think_s=15,max_prompt_tokens=4000",
    eviction="lru",
    gpu_cache_tokens=5440,
    time_scale=0.03,
    block_tokens=16,
    router="cost",
)


def test_the_shortfall_of_a_scarce_fleet_is_its_queues_evictions_not_the_index() -> None:
    fleets: list[Fleet] = []
    result = run(SCARCE, observe=lambda fleet, loop, model: fleets.append(fleet))
    h: HealthSummary = fleets[0].router.health.summary()
    # the engines reused well under what was predicted...
    assert h.precision < 0.9
    # ...and what they evicted from the predicted prefixes while the requests waited explains
    # all of it but rounding: the index itself was right
    assert h.evicted_queued_tokens > 0.1 * h.predicted_tokens
    assert h.overlap_tokens >= 0.99 * (h.predicted_tokens - h.evicted_queued_tokens)
    assert result.diagnostics["evicted_queued_tokens"] == h.evicted_queued_tokens
    assert h.num_untrusted == 0 and "route_fallback" not in result.diagnostics
