"""One model, two clocks: a built-in workload through `kvtide simulate` (one replica) and through
`kvtide engine` driven by `kvtide load --prompt-format tokens` at the same arrival times, over
real sockets between three processes: the same requests, the same TTFTs and cached tokens.

The engine's own records (its clock, `--records`) must match the simulator within 10% (p50) and
20% (p99); the client-side TTFT adds the HTTP path's wall latency times the speedup, so it gets
a looser bound here (bench/two_clocks.py reports it at --speedup 1 and 10, docs/engine_server.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.two_clocks import Setup, drive_engine, engine_stats, simulate

pytestmark = pytest.mark.slow
SPEEDUP = 10.0


def test_kvtide_load_replays_the_simulators_requests_and_both_clocks_agree() -> None:
    setup = Setup(requests=120)
    sim = simulate(setup)
    rows, records = drive_engine(setup, SPEEDUP, sim["time_scale"])
    assert len(rows) == len(records) == setup.requests
    assert all(r["error"] is None for r in rows)
    # the simulator's requests, as they are: no re-tokenized text, no chat template
    assert [r["prompt_tokens"] for r in rows] == [r["trace_prompt_tokens"] for r in rows]
    assert sum(r["prompt_tokens"] for r in rows) == sim["prompt_tokens"]
    assert [r["output_tokens"] for r in rows] == [max(1, r["trace_output_tokens"]) for r in rows]
    assert max(r["sent_s"] - r["scheduled_s"] for r in rows) < 0.5  # sent on time (wall)

    stats = engine_stats(rows, records, SPEEDUP)
    assert abs(stats["engine_p50_s"] / sim["ttft_p50_s"] - 1) <= 0.10
    assert abs(stats["engine_p99_s"] / sim["ttft_p99_s"] - 1) <= 0.20
    assert abs(stats["cached_ratio"] - sim["cached_ratio"]) <= 0.01
    # the client's TTFT carries the HTTP path's wall latency x 10: only sane here
    assert 0.9 <= stats["ttft_p50_s"] / sim["ttft_p50_s"] <= 1.6
    assert abs(stats["ttft_p99_s"] / sim["ttft_p99_s"] - 1) <= 0.35
