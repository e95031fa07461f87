"""Workloads with no time span (one request, or every request at one instant) end, and sample
a bounded number of times: the sampling interval comes from what is simulated, not the span."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtide.sim.scenario import NUM_WINDOWS, Scenario, run


def _jsonl(path: Path, rows: list[dict[str, object]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _mooncake(n: int) -> list[dict[str, object]]:
    return [
        {"timestamp": 0, "input_length": 1500, "output_length": 200, "hash_ids": [0, 1 + i, 9]}
        for i in range(n)
    ]


def _bailian(n: int) -> list[dict[str, object]]:
    return [
        {
            "chat_id": i,
            "timestamp": 1.5,
            "input_length": 40,
            "output_length": 30,
            "hash_ids": [i, 7, 8],
        }
        for i in range(n)
    ]


def _tokens(n: int) -> list[dict[str, object]]:
    return [
        {"timestamp": 2.0, "token_ids": list(range(i, i + 300)), "output_tokens": 50}
        for i in range(n)
    ]


def _azure(path: Path, n: int) -> str:
    rows = "".join("2023-11-16 18:15:46.6805900,900,80\n" for _ in range(n))
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    return str(path)


SHAPES = {
    "mooncake one line": lambda p: _jsonl(p / "t.jsonl", _mooncake(1)),
    "mooncake one instant": lambda p: _jsonl(p / "t.jsonl", _mooncake(40)),
    "bailian one line": lambda p: _jsonl(p / "t.jsonl", _bailian(1)),
    "bailian one instant": lambda p: _jsonl(p / "t.jsonl", _bailian(40)),
    "tokens one line": lambda p: _jsonl(p / "t.jsonl", _tokens(1)),
    "tokens one instant": lambda p: _jsonl(p / "t.jsonl", _tokens(40)),
    "azure one row": lambda p: _azure(p / "t.csv", 1),
    "azure one instant": lambda p: _azure(p / "t.csv", 40),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("router", ["round_robin", "cost"])
def test_a_workload_without_a_time_span_ends_with_bounded_samples(
    tmp_path: Path, shape: str, router: str
) -> None:
    spec = SHAPES[shape](tmp_path)
    result = run(Scenario(workload=spec, replicas=2, router=router))
    assert result.summary.requests >= 1
    assert result.simulated_s > 0  # the work itself takes time even when arrivals do not
    # The first sample, at most 2 * NUM_WINDOWS - 1 by the sampler, and the final one.
    assert len(result.series.times_s) <= 2 * NUM_WINDOWS


def test_a_run_much_longer_than_its_arrivals_keeps_few_samples() -> None:
    """An offered load of 1000 squeezes the arrivals into a sliver of the run: the sampler
    widens its interval instead of ticking over the whole run at the sliver's rate."""
    result = run(Scenario(workload="builtin:chat:sessions=20", requests=60, load=1000.0))
    assert result.summary.requests == 60
    assert NUM_WINDOWS // 2 <= len(result.series.times_s) <= 2 * NUM_WINDOWS
