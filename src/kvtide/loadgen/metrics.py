"""Serving metrics from per-request rows, defined as vLLM's ``benchmark_serving`` defines them.

- TTFT: send to first text chunk. E2E: send to last text chunk.
- TPOT (time per output token, first token excluded): ``(e2e - ttft) / (output_tokens - 1)``
  for requests with more than one output token; ``output_tokens`` from ``usage`` when the server
  reports it, else the generated text re-tokenized.
- ITL: every gap between consecutive text chunks, of all requests pooled.
- Percentiles: ``numpy.percentile`` (linear interpolation); mean, std (population), median.
- Goodput: completed requests per second whose TTFT and TPOT (0 for a single-token answer)
  are within every SLO given.
- Cached-token ratio: ``usage.prompt_tokens_details.cached_tokens`` summed over the summed
  ``usage.prompt_tokens`` of the requests that report both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None


def tpot_of(e2e_s: float, ttft_s: float, output_tokens: int) -> float | None:
    return (e2e_s - ttft_s) / (output_tokens - 1) if output_tokens > 1 else None


def distribution(values: Iterable[float]) -> dict[str, float | int | None]:
    """count, mean, std, median and the percentiles; None for each statistic of no values."""
    array = np.asarray(list(values), dtype=np.float64)
    stats: dict[str, float | int | None] = {"count": int(array.size)}
    names = ["mean", "std", "median", *(f"p{p}" for p in PERCENTILES)]
    if array.size == 0:
        stats.update(dict.fromkeys(names))
        return stats
    stats["mean"] = float(np.mean(array))
    stats["std"] = float(np.std(array))
    stats["median"] = float(np.median(array))
    for p in PERCENTILES:
        stats[f"p{p}"] = float(np.percentile(array, p))
    return stats


def is_good(row: dict[str, Any], slo: Slo) -> bool:
    if row["error"] is not None:
        return False
    if slo.ttft_s is not None and row["ttft_s"] > slo.ttft_s:
        return False
    return slo.tpot_s is None or (row["tpot_s"] or 0.0) <= slo.tpot_s


def summarize(rows: Sequence[dict[str, Any]], duration_s: float, slo: Slo) -> dict[str, Any]:
    """The run's summary from its request rows (see ``runner.row`` for their keys)."""
    done = [r for r in rows if r["error"] is None]
    output = sum(r["output_tokens"] for r in done)
    prompt = sum(
        r["trace_prompt_tokens"] if r["prompt_tokens"] is None else r["prompt_tokens"] for r in done
    )
    reported = [r for r in done if r["cached_tokens"] is not None and r["prompt_tokens"]]
    reported_prompt = sum(r["prompt_tokens"] for r in reported)
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    has_slo = slo.ttft_s is not None or slo.tpot_s is not None
    good = sum(is_good(r, slo) for r in rows) if has_slo else None
    return {
        "requests": len(rows),
        "completed": len(done),
        "failed": len(rows) - len(done),
        "errors": dict(sorted(Counter(r["error"] for r in rows if r["error"]).items())),
        "duration_s": duration_s,
        "request_throughput": len(done) * per_s,
        "good_requests": good,
        "request_goodput": None if good is None else good * per_s,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "output_throughput": output * per_s,
        "total_token_throughput": (prompt + output) * per_s,
        "cached_tokens": sum(r["cached_tokens"] for r in reported),
        "cached_token_ratio": (
            sum(r["cached_tokens"] for r in reported) / reported_prompt if reported_prompt else None
        ),
        "ttft_s": distribution(r["ttft_s"] for r in done),
        "tpot_s": distribution(r["tpot_s"] for r in done if r["tpot_s"] is not None),
        "itl_s": distribution(gap for r in done for gap in r["itl_s"]),
        "e2e_s": distribution(r["e2e_s"] for r in done),
    }
