"""The real traces in ../shared/traces, read through the public entry point (skipped if absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtide.workloads import open_workload, stats

TRACES = Path(__file__).parents[3] / ".." / "shared" / "traces"

pytestmark = pytest.mark.traces


def _trace(name: str) -> str:
    path = TRACES / name
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    return str(path)


@pytest.mark.parametrize(
    ("name", "kind", "rows"),
    [
        ("mooncake_conversation.jsonl", "mooncake", 12_031),
        ("azure_conv_2023.csv", "azure", 19_366),
        ("bailian_traceA_excerpt.jsonl", "bailian", 18),
    ],
)
def test_every_row_is_read(name: str, kind: str, rows: int) -> None:
    workload = open_workload(_trace(name))

    assert workload.format == kind
    assert sum(1 for _ in workload) == rows


def test_mooncake_offers_the_published_infinite_cache_hit_ratio() -> None:
    summary = stats(open_workload(_trace("mooncake_conversation.jsonl")))

    assert summary["requests"] == 12_031
    assert summary["infinite_cache_hit_ratio"] == pytest.approx(0.37, abs=0.01)
