"""The HTML report of a simulation: one self-contained page (inline SVG, no scripts) with the
table, TTFT CDFs, hit ratio and eviction velocity over time, per-replica load, and hit ratio
against cache capacity beside the infinite-cache ceiling."""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from kvtide.core.hashing import Namespace, request_block_hashes
from kvtide.errors import ConfigError
from kvtide.sim.capacity import CapacityCurve, capacity_curve
from kvtide.sim.scenario import NUM_CDF_POINTS, RunResult, Scenario, describe_setup, prepare
from kvtide.sim.svg import Line, heatmap, line_chart
from kvtide.sim.telemetry_report import render_telemetry

CAPACITY_FACTORS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)

_STYLE = """
body { font-family: sans-serif; max-width: 1000px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.note { color: #555; font-size: 13px; }
pre { background: #f6f6f6; padding: 8px; font-size: 12px; overflow-x: auto; }
"""


def write_report(
    directory: Path,
    scenario: Scenario,
    workload: dict[str, Any],
    results: Sequence[RunResult],
) -> Path:
    """Writes ``directory/index.html`` and returns its path."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{directory}: cannot create: {exc.strerror or exc}") from exc
    curve = _capacity(scenario)
    page = render(scenario, workload, results, curve)
    path = directory / "index.html"
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write: {exc.strerror or exc}") from exc
    return path


def _capacity(scenario: Scenario) -> CapacityCurve:
    prepared = prepare(scenario)
    seed = Namespace(model=scenario.model).seed
    bt = prepared.block_tokens
    prompts = [(request_block_hashes(r, bt, seed), r.prompt_tokens) for r in prepared.requests]
    fleet_tokens = scenario.replicas * scenario.gpu_cache_tokens
    capacities = [max(bt, int(fleet_tokens * f)) for f in CAPACITY_FACTORS]
    return capacity_curve(prompts, bt, scenario.eviction, capacities)


def render(
    scenario: Scenario,
    workload: dict[str, Any],
    results: Sequence[RunResult],
    curve: CapacityCurve,
) -> str:
    routers = [r.summary.router for r in results]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>kvtide simulate: {escape(str(workload['name']))}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>kvtide simulate — {escape(str(workload['name']))}</h1>",
        _setup(scenario, workload),
        "<h2>Summary</h2>",
        _table(results),
        "<h2>Time to first token</h2>",
        "<p class='note'>Cumulative distribution over requests (log scale).</p>",
        line_chart(
            [
                Line(r.summary.router, r.ttft_cdf_s, list(np.linspace(0, 1, NUM_CDF_POINTS)))
                for r in results
            ],
            x_label="TTFT (s)",
            y_label="fraction of requests",
            log_x=True,
            y_max=1.0,
            y_percent=True,
        ),
        "<h2>Hit ratio over time</h2>",
        "<p class='note'>Prompt tokens found cached at admission, per time window.</p>",
        line_chart(
            [Line(r.summary.router, r.series.times_s, r.series.hit_ratio) for r in results],
            x_label="simulated time (s)",
            y_label="hit ratio",
            y_percent=True,
        ),
        "<h2>Eviction velocity over time</h2>",
        line_chart(
            [Line(r.summary.router, r.series.times_s, r.series.evictions_per_s) for r in results],
            x_label="simulated time (s)",
            y_label="blocks evicted / s (fleet)",
        ),
        "<h2>Per-replica load over time</h2>",
        "<p class='note'>Fraction of each window a replica spent computing; an even "
        "colour down a column is a balanced fleet.</p>",
    ]
    for result in results:
        busy = result.series.replica_busy
        parts.append(f"<h3>{escape(result.summary.router)}</h3>")
        parts.append(heatmap(busy, [f"r{i}" for i in range(len(busy))], x_label="simulated time →"))
    fleet_tokens = scenario.replicas * scenario.gpu_cache_tokens
    parts += [
        "<h2>Hit ratio against cache capacity</h2>",
        f"<p class='note'>{escape(scenario.eviction)} on one cache holding the whole fleet's "
        "capacity (a router that loses nothing to placement), Belady's optimum at that capacity, "
        "the infinite cache (the "
        "ceiling: only first uses miss), and each router's measured hit ratio at the "
        f"fleet's capacity of {fleet_tokens:,} tokens.</p>",
        line_chart(
            [
                Line(
                    f"{scenario.eviction}, one cache",
                    curve.capacity_tokens,
                    curve.policy_hit_ratio,
                ),
                Line("optimum (Belady)", curve.capacity_tokens, curve.optimum_hit_ratio),
                Line(
                    "infinite cache",
                    curve.capacity_tokens,
                    [curve.infinite_hit_ratio] * len(curve.capacity_tokens),
                    dashed=True,
                ),
                *[
                    Line(r.summary.router, [fleet_tokens], [r.summary.hit_ratio], points_only=True)
                    for r in results
                ],
            ],
            x_label="KV capacity, whole fleet (tokens)",
            y_label="hit ratio",
            log_x=True,
            y_percent=True,
        ),
        render_telemetry(results),
        "<h2>Definitions</h2><p class='note'>TTFT: arrival to first token. TPOT: seconds "
        "per output token after the first. E2E: arrival to last token. Hit ratio: prompt "
        "tokens found cached at first admission over all prompt tokens. Throughput: prompt "
        "and output tokens over first arrival to last finish. Imbalance: the busiest "
        "replica's computing seconds over the mean. Prefill Mtok: tokens prefilled, "
        "recomputation after preemption included.</p>",
        "<h2>Run JSON</h2><pre>",
        escape(json.dumps([r.summary.to_json() for r in results], indent=1)),
        "</pre>",
        f"<p class='note'>routers: {escape(', '.join(routers))}</p></body></html>",
    ]
    return "\n".join(parts)


def _setup(scenario: Scenario, workload: dict[str, Any]) -> str:
    rows = {**{k: v for k, v in workload.items() if k != "params"}, **describe_setup(scenario)}
    cells = "".join(
        f"<tr><td>{escape(str(k))}</td><td>{escape(_short(v))}</td></tr>" for k, v in rows.items()
    )
    return f"<table>{cells}</table>"


def _short(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}"
    return str(value)


def _table(results: Sequence[RunResult]) -> str:
    head = (
        "<tr><th>router</th><th>eviction</th><th>requests</th><th>TTFT mean</th>"
        "<th>TTFT p50</th><th>TTFT p90</th><th>TTFT p99</th><th>TPOT p50</th>"
        "<th>E2E p50</th><th>E2E p99</th><th>hit ratio</th><th>tok/s</th>"
        "<th>imbalance</th><th>evict/s</th><th>prefill Mtok</th></tr>"
    )
    rows = []
    for r in results:
        s = r.summary
        rows.append(
            f"<tr><td>{escape(s.router)}</td><td>{escape(s.eviction)}</td><td>{s.requests}</td>"
            f"<td>{s.ttft_s.mean:.3f}</td><td>{s.ttft_s.p50:.3f}</td><td>{s.ttft_s.p90:.3f}</td>"
            f"<td>{s.ttft_s.p99:.3f}</td><td>{s.tpot_s.p50:.4f}</td><td>{s.e2e_s.p50:.2f}</td>"
            f"<td>{s.e2e_s.p99:.2f}</td><td>{s.hit_ratio:.1%}</td>"
            f"<td>{s.throughput_tok_s:,.0f}</td><td>{s.load_imbalance:.2f}</td>"
            f"<td>{s.evictions_per_s:,.0f}</td><td>{s.prefill_tokens_computed / 1e6:,.2f}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"
