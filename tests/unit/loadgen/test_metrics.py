"""The summary's definitions against numbers worked out by hand."""

from __future__ import annotations

from typing import Any

import pytest

from kvtide.loadgen import Slo, distribution, summarize


def make_row(
    ttft: float | None, e2e: float | None, out: int, itl: list[float], **kw: Any
) -> dict[str, Any]:
    tpot = (e2e - ttft) / (out - 1) if ttft is not None and e2e is not None and out > 1 else None
    return {
        "error": None, "ttft_s": ttft, "e2e_s": e2e, "output_tokens": out, "itl_s": itl,
        "tpot_s": tpot, "prompt_tokens": 100, "trace_prompt_tokens": 90, "cached_tokens": 40,
        **kw,
    }  # fmt: skip


def test_distribution_is_numpy_linear_interpolation() -> None:
    d = distribution([4.0, 1.0, 3.0, 2.0])
    # sorted 1,2,3,4: rank p/100*(n-1); p90 -> 2.7 -> 3 + 0.7*(4-3)
    assert d == {
        "count": 4, "mean": 2.5, "std": pytest.approx(1.118033988749895), "median": 2.5,
        "p50": 2.5, "p90": pytest.approx(3.7), "p95": pytest.approx(3.85),
        "p99": pytest.approx(3.97),
    }  # fmt: skip
    assert distribution([]) == {"count": 0, "mean": None, "std": None, "median": None,
                                "p50": None, "p90": None, "p95": None, "p99": None}  # fmt: skip


def test_summary_by_hand() -> None:
    rows = [
        make_row(0.1, 0.5, 5, [0.1, 0.1, 0.1, 0.1]),  # tpot 0.1
        make_row(0.3, 0.3, 1, []),  # one token: no tpot, counts as 0 for goodput
        make_row(0.2, 1.0, 3, [0.4, 0.4], cached_tokens=None),  # tpot 0.4, no cache report
        make_row(None, None, 0, [], error="http_503", prompt_tokens=None, cached_tokens=None),
        make_row(None, None, 0, [], error="timeout", prompt_tokens=None, cached_tokens=None),
    ]
    s = summarize(rows, duration_s=2.0, slo=Slo(ttft_s=0.25, tpot_s=0.2))
    assert (s["requests"], s["completed"], s["failed"]) == (5, 3, 2)
    assert s["errors"] == {"http_503": 1, "timeout": 1}
    assert s["request_throughput"] == 1.5
    assert s["output_tokens"] == 9 and s["output_throughput"] == 4.5
    assert s["prompt_tokens"] == 300 and s["total_token_throughput"] == 154.5
    # cached ratio over the requests that report it: (40 + 40) / (100 + 100)
    assert s["cached_tokens"] == 80 and s["cached_token_ratio"] == 0.4
    # good: row 1 (ttft .1 <= .25, tpot .1 <= .2); row 2 fails ttft; row 3 fails tpot
    assert s["good_requests"] == 1 and s["request_goodput"] == 0.5
    assert s["ttft_s"]["mean"] == pytest.approx(0.2) and s["ttft_s"]["median"] == 0.2
    assert s["tpot_s"]["count"] == 2 and s["tpot_s"]["mean"] == pytest.approx(0.25)
    assert s["itl_s"]["count"] == 6 and s["itl_s"]["mean"] == pytest.approx(0.2)
    assert s["e2e_s"]["p50"] == 0.5
    assert summarize(rows, 2.0, Slo())["request_goodput"] is None


def test_usage_absent_falls_back_to_the_trace_prompt_length() -> None:
    s = summarize(
        [make_row(0.1, 0.2, 2, [0.1], prompt_tokens=None, cached_tokens=None)], 1.0, Slo()
    )
    assert s["prompt_tokens"] == 90 and s["cached_token_ratio"] is None
