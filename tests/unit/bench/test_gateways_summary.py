"""bench/gateways.py's workload rows: cached ratio, TTFT and TPOT from the load generator's
per-request rows, and several runs folded into medians."""

from __future__ import annotations

from typing import Any

import pytest

import gateways  # bench/gateways.py: tests/conftest.py puts bench/ on sys.path


def _row(ttft: float | None, tpot: float | None, error: str | None = None) -> dict[str, Any]:
    return {
        "error": error,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "prompt_tokens": 100,
        "cached_tokens": 25,
    }


def test_tpot_counts_answered_requests_that_decoded_past_their_first_token() -> None:
    rows = [
        _row(0.1, 0.02),
        _row(0.2, 0.04),
        _row(0.3, None),  # one output token: no TPOT
        _row(None, 9.0, error="http 500"),  # failed: in no latency
    ]
    got = gateways.summarize_rows(rows)
    assert got["requests"] == 4 and got["errors"] == 1
    assert got["cached_token_ratio"] == pytest.approx(0.25)
    assert got["ttft_s"]["p50"] == pytest.approx(0.2)
    assert got["tpot_s"]["p50"] == pytest.approx(0.03)
    assert got["tpot_s"]["p99"] == pytest.approx(0.02 + 0.99 * 0.02)


def test_no_tpot_when_no_request_decoded() -> None:
    got = gateways.summarize_rows([_row(0.1, None), _row(0.2, None)])
    assert got["tpot_s"] == {"p50": None, "p99": None}


def test_runs_fold_into_medians_of_each_quantile() -> None:
    runs = [
        gateways.summarize_rows([_row(t, t / 10) for t in (0.1, 0.2, 0.3)]),
        gateways.summarize_rows([_row(t, t / 10) for t in (0.4, 0.5, 0.6)]),
        gateways.summarize_rows([_row(t, t / 10) for t in (0.7, 0.8, 0.9)]),
    ]
    for r in runs:
        r.update(cpu_us_per_request=1.0, idle_cpu_ms_per_s=0.0, cpu_us_per_request_less_idle=1.0)
    got = gateways.median_row(runs)
    assert got["requests"] == 9 and got["runs"] == runs
    assert got["ttft_s"]["p50"] == pytest.approx(0.5)
    assert got["tpot_s"]["p50"] == pytest.approx(0.05)
    assert got["tpot_s"]["p99"] == pytest.approx(runs[1]["tpot_s"]["p99"])
