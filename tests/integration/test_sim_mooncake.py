"""The simulator on the head of the Mooncake conversation trace (skipped when absent):
cache-aware routing must hit more and wait less than round-robin on the same requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtide.engine.scheduler import EngineConfig
from kvtide.sim.scenario import Scenario, run

TRACE = Path(__file__).parents[2] / ".." / "shared" / "traces" / "mooncake_conversation.jsonl"

pytestmark = [
    pytest.mark.traces,
    pytest.mark.skipif(not TRACE.exists(), reason="../shared/traces not present"),
]


def test_cache_aware_routing_beats_round_robin_on_the_trace_head() -> None:
    base = Scenario(
        workload=str(TRACE),
        requests=1500,
        model="llama-3-70b",
        gpu="a800",
        tp=8,
        replicas=8,
        load=0.7,
        gpu_cache_tokens=1 << 20,
        engine=EngineConfig(prefill_only=True),
    )
    rr = run(base.with_(router="round_robin")).summary
    cost = run(base.with_(router="cost")).summary
    assert rr.requests == cost.requests == 1500
    assert cost.hit_ratio > rr.hit_ratio + 0.05
    assert cost.ttft_s.p50 < rr.ttft_s.p50
    assert cost.prefill_tokens_computed < rr.prefill_tokens_computed
