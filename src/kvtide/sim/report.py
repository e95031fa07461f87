"""The HTML report of a simulation: one self-contained page (inline SVG, no scripts) with the
setup, the table, TTFT CDFs, hit ratio and eviction velocity over time, per-replica load, and hit
ratio against cache capacity beside the infinite-cache ceiling."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from kvtide.display import DASH, count, number, plural, seconds, tokens
from kvtide.errors import ConfigError
from kvtide.routing.identity import RequestHasher
from kvtide.sim.capacity import CapacityCurve, capacity_curve
from kvtide.sim.scenario import (
    NUM_CDF_POINTS,
    RunResult,
    Scenario,
    describe_tiers,
    prepare,
)
from kvtide.sim.svg import PALETTE, Line, heatmap, line_chart
from kvtide.sim.telemetry_report import render_telemetry

CAPACITY_FACTORS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
SMOOTH_FRACTION = 0.1
"""The moving mean drawn over overlapping per-window series spans this fraction of a run's
windows: wide enough that five routers' lines separate, narrow enough to keep a burst."""

_STYLE = """
body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em;
  color: #222; line-height: 1.4; }
table { border-collapse: collapse; font-size: 14px; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f3f3f3; }
.setup { display: flex; flex-wrap: wrap; gap: 2em; }
.setup td:first-child { color: #555; }
.setup td { text-align: left; }
h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
.note { color: #555; font-size: 14px; }
svg { display: block; max-width: 100%; height: auto; }
pre { background: #f6f6f6; padding: 8px; font-size: 12px; overflow-x: auto; }
summary { cursor: pointer; color: #555; }
.wide { overflow-x: auto; }
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
    bt = prepared.block_tokens
    hasher = RequestHasher(bt, scenario.model)
    prompts = [(hasher(r), r.prompt_tokens) for r in prepared.requests]
    fleet_tokens = scenario.replicas * scenario.gpu_cache_tokens
    capacities = [max(bt, int(fleet_tokens * f)) for f in CAPACITY_FACTORS]
    return capacity_curve(prompts, bt, scenario.eviction, capacities)


def moving_mean(
    values: Sequence[float], window: int, weights: Sequence[float] | None = None
) -> list[float]:
    """Centred mean over ``window`` points, weighted (a hit ratio by the tokens admitted in
    its window, so a window with one request counts for one request), skipping NaN; NaN where
    the whole neighbourhood is NaN or weighs nothing."""
    arr = np.asarray(values, dtype=np.float64)
    w = np.ones_like(arr) if weights is None else np.asarray(weights, dtype=np.float64)
    half = window // 2
    out = []
    for i in range(arr.size):
        part = arr[max(0, i - half) : i + half + 1]
        weight = w[max(0, i - half) : i + half + 1]
        keep = ~np.isnan(part) & (weight > 0)
        total = float(weight[keep].sum())
        out.append(float((part[keep] * weight[keep]).sum() / total) if total else math.nan)
    return out


def render(
    scenario: Scenario,
    workload: dict[str, Any],
    results: Sequence[RunResult],
    curve: CapacityCurve,
) -> str:
    name = escape(str(workload["name"]))
    end_s = max((r.simulated_s for r in results), default=0.0)
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>kvtide simulate: {name}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>kvtide simulate — {name}</h1>",
        f"<p>{_lead(scenario, workload, results)}</p>",
        "<h2>Setup</h2>",
        _setup(scenario, workload),
        "<h2>Summary</h2>",
        _table(results),
        f"<p class='note'>Times in seconds. {DASH}: does not apply.</p>",
        "<h2>Time to first token</h2>",
        "<p class='note'>Cumulative distribution over requests; TTFT on a log scale.</p>",
        line_chart(
            [
                Line(
                    r.summary.router,
                    r.ttft_cdf_s,
                    list(np.linspace(0, 1, NUM_CDF_POINTS)),
                    color=_color(i),
                )
                for i, r in enumerate(results)
            ],
            x_label="time to first token (s)",
            y_label="fraction of requests",
            log_x=True,
            y_max=1.0,
            y_percent=True,
        ),
        "<h2>Hit ratio over time</h2>",
        "<p class='note'>Prompt tokens found cached at admission, per time window; a gap is a "
        "window in which no request was admitted.</p>",
        _over_time(results, "hit_ratio", "hit ratio", end_s, y_percent=True),
        "<h2>Eviction velocity over time</h2>",
        "<p class='note'>Blocks evicted from the GPU caches per second, all replicas.</p>",
        _over_time(results, "evictions_per_s", "blocks evicted / s", end_s),
        "<h2>Per-replica load over time</h2>",
        "<p class='note'>Fraction of each window a replica spent computing; an even colour "
        "down a column is a balanced fleet.</p>",
    ]
    for result in results:
        series = result.series
        busy = series.replica_busy
        parts.append(f"<h3>{escape(result.summary.router)}</h3>")
        parts.append(
            heatmap(
                busy,
                [f"replica {i}" for i in range(len(busy))],
                ends_s=[t - series.start_s for t in series.times_s],
                x_max=end_s,
                x_label="simulated time since the first arrival (s)",
                scale_label="busy fraction",
            )
        )
    parts += _capacity_section(scenario, results, curve)
    parts += [
        render_telemetry(results),
        "<h2>Definitions</h2><p class='note'>TTFT: arrival to first token. TPOT: seconds "
        "per output token after the first. E2E: arrival to last token. Hit ratio: prompt "
        "tokens found cached at first admission over all prompt tokens. Throughput: prompt "
        "and output tokens over first arrival to last finish. Imbalance: the busiest "
        "replica's computing seconds over the mean. Prefill Mtok: millions of tokens "
        "prefilled, recomputation after preemption included.</p>",
        "<details><summary>Run JSON</summary><pre>",
        escape(json.dumps([r.summary.to_json() for r in results], indent=1)),
        "</pre></details></body></html>",
    ]
    return "\n".join(parts)


def _lead(scenario: Scenario, workload: dict[str, Any], results: Sequence[RunResult]) -> str:
    routers = ", ".join(r.summary.router for r in results)
    return escape(
        f"{plural(int(workload['requests']), 'request')} over "
        f"{seconds(float(workload['span_s']))} through {scenario.replicas} × {scenario.model} "
        f"on {scenario.tp} × {scenario.gpu}, once per router: {routers}."
    )


def _over_time(
    results: Sequence[RunResult],
    field: str,
    y_label: str,
    end_s: float,
    *,
    y_percent: bool = False,
) -> str:
    """One line per run over time since the first arrival; with several runs the raw windows
    overlap, so each is drawn faint under its moving mean."""
    smooth = len(results) > 1
    lines = []
    window_s = 0.0
    span = 1
    for i, r in enumerate(results):
        xs = [t - r.series.start_s for t in r.series.times_s]
        ys: list[float] = getattr(r.series, field)
        weights = r.series.admitted_tokens if field == "hit_ratio" else None
        if len(xs) > 1:
            window_s = xs[1] - xs[0]
        color = _color(i)
        span = max(3, int(len(xs) * SMOOTH_FRACTION)) | 1  # odd: centred on its window
        if smooth:
            lines.append(Line(r.summary.router, xs, ys, faint=True, color=color))
            smoothed = moving_mean(ys, span, weights)
            lines.append(Line(r.summary.router, xs, smoothed, color=color))
        else:
            lines.append(Line(r.summary.router, xs, ys, color=color))
    legend = (
        [f"lines: mean of {span} windows", f"({seconds(span * window_s)}); faint: each"]
        if smooth
        else []
    )
    chart = line_chart(
        lines,
        x_label="simulated time since the first arrival (s)",
        y_label=y_label,
        x_min=0.0,
        x_max=end_s,
        y_percent=y_percent,
        legend_note=legend,
    )
    if not smooth:
        return chart
    weighting = ", weighted by the tokens admitted" if field == "hit_ratio" else ""
    return (
        f"<p class='note'>Bold lines: moving mean over {span} consecutive windows "
        f"({seconds(span * window_s)}){weighting}; faint lines: each window "
        f"({seconds(window_s)}), clipped to the range of the bold ones.</p>{chart}"
    )


def _color(run_index: int) -> str:
    """A run's colour, the same in every chart."""
    return PALETTE[run_index % len(PALETTE)]


def _capacity_section(
    scenario: Scenario, results: Sequence[RunResult], curve: CapacityCurve
) -> list[str]:
    fleet_tokens = scenario.replicas * scenario.gpu_cache_tokens
    tiered = any(len(r.summary.hit_ratio_by_tier) > 1 for r in results)
    which = "device (GPU) hit ratio" if tiered else "hit ratio"
    return [
        "<h2>Hit ratio against cache capacity</h2>",
        f"<p class='note'>{escape(scenario.eviction)} on one cache holding the whole fleet's "
        "GPU capacity (a router that loses nothing to placement), Belady's optimum at that "
        "capacity, the infinite cache (the ceiling: only first uses miss), and each router's "
        f"measured {which} at the fleet's capacity of {tokens(fleet_tokens)}. The y axis "
        "starts where the data does.</p>",
        line_chart(
            [
                Line(
                    f"{scenario.eviction}, one cache",
                    curve.capacity_tokens,
                    curve.policy_hit_ratio,
                    markers=True,
                    color="#222",
                ),
                Line(
                    "optimum (Belady)",
                    curve.capacity_tokens,
                    curve.optimum_hit_ratio,
                    markers=True,
                    color="#999",
                ),
                Line(
                    "infinite cache",
                    curve.capacity_tokens,
                    [curve.infinite_hit_ratio] * len(curve.capacity_tokens),
                    dashed=True,
                    color="#999",
                ),
                *[
                    Line(
                        f"{r.summary.router}: {r.summary.hit_ratio_by_tier.get('device', 0):.1%}",
                        [fleet_tokens],
                        [r.summary.hit_ratio_by_tier.get("device", r.summary.hit_ratio)],
                        points_only=True,
                        offset_px=12.0 * (i - (len(results) - 1) / 2),
                        color=_color(i),
                    )
                    for i, r in enumerate(results)
                ],
            ],
            x_label="KV capacity, whole fleet (tokens)",
            y_label=which,
            log_x=True,
            y_min=None,
            y_percent=True,
            x_format=count,
        ),
    ]


def _setup(scenario: Scenario, workload: dict[str, Any]) -> str:
    w = workload
    params = w.get("params") or {}
    workload_rows = [
        ("workload", str(w["name"])),
        ("format", str(w["format"])),
        *(_param(k, v) for k, v in dict(params).items()),
        ("requests", f"{int(w['requests']):,}"),
        ("arrivals over", seconds(float(w["span_s"]))),
        ("offered load", _load(float(w["offered_load"]))),
        ("time scale", f"arrival gaps × {float(w['time_scale']):.4g}"),
        ("mean prompt", tokens(round(float(w["prompt_tokens_mean"])))),
        ("mean output", tokens(round(float(w["output_tokens_mean"])))),
        ("block", tokens(int(w["block_tokens"]))),
    ]
    engine = scenario.engine
    decode = f" + {scenario.decode_replicas} decode" if scenario.decode_replicas else ""
    fleet_rows = [
        ("model", scenario.model),
        ("GPU", f"{scenario.tp} × {scenario.gpu}"),
        ("replicas", f"{scenario.replicas}{decode}"),
        ("KV per replica", describe_tiers(scenario)),
        ("eviction", scenario.eviction),
        ("batch budget", f"{tokens(engine.max_batched_tokens)} per iteration"),
        ("scheduling", engine.scheduling_policy),
        ("prefill only", "yes" if engine.prefill_only else "no"),
        ("KV transfer", "yes" if scenario.kv_transfer else "no"),
        (
            "KV events",
            f"delay {seconds(scenario.event_delay_s)}, loss {scenario.event_loss:.1%}",
        ),
        ("outages", _outages(scenario)),
        ("seed", str(scenario.seed)),
    ]
    if scenario.coordinator_outage is not None:
        start, end = scenario.coordinator_outage
        fleet_rows.append(("coordinator down", f"{seconds(start)} to {seconds(end)}"))
    return (
        f"<div class='setup'>{_pairs('workload', workload_rows)}{_pairs('fleet', fleet_rows)}</div>"
    )


def _load(offered: float) -> str:
    if math.isfinite(offered):
        return f"{offered:.2f} of the fleet's prefill capacity"
    return f"{DASH} (every request arrives at one instant)"


def _param(key: str, value: object) -> tuple[str, str]:
    """A workload parameter, indented under the format; ``*_s`` keys are seconds."""
    if key.endswith("_s") and isinstance(value, int | float) and not isinstance(value, bool):
        return f"  {key.removesuffix('_s').replace('_', ' ')}", seconds(float(value))
    return f"  {key.replace('_', ' ')}", str(value)


def _outages(scenario: Scenario) -> str:
    if not scenario.outages:
        return "none"
    return "; ".join(
        f"replica {o.replica} from {seconds(o.start_s)}"
        + (f" to {seconds(o.end_s)}" if o.end_s is not None else " on")
        for o in scenario.outages
    )


def _pairs(title: str, rows: Sequence[tuple[str, str]]) -> str:
    cells = "".join(
        f"<tr><td>{escape(k).replace(' ', '&nbsp;', 2) if k.startswith('  ') else escape(k)}"
        f"</td><td>{escape(v)}</td></tr>"
        for k, v in rows
    )
    return f"<table><tr><th colspan='2'>{escape(title)}</th></tr>{cells}</table>"


def _table(results: Sequence[RunResult]) -> str:
    tiers = [
        t
        for t in ("device", "host", "disk")
        if any(t in r.summary.hit_ratio_by_tier for r in results)
    ]
    tier_heads = "".join(f"<th>{t} hits</th>" for t in tiers) if len(tiers) > 1 else ""
    hit_head = "hit ratio, all tiers" if len(tiers) > 1 else "hit ratio"
    head = (
        "<tr><th>router</th><th>eviction</th><th>requests</th><th>TTFT mean</th>"
        "<th>TTFT p50</th><th>TTFT p90</th><th>TTFT p99</th><th>TPOT p50</th>"
        f"<th>E2E p50</th><th>E2E p99</th><th>{hit_head}</th>{tier_heads}<th>tok/s</th>"
        "<th>imbalance</th><th>evict/s</th><th>prefill Mtok</th></tr>"
    )
    rows = []
    for r in results:
        s = r.summary
        cells = [
            escape(s.router),
            escape(s.eviction),
            f"{s.requests:,}",
            number(s.ttft_s.mean, ".3f"),
            number(s.ttft_s.p50, ".3f"),
            number(s.ttft_s.p90, ".3f"),
            number(s.ttft_s.p99, ".3f"),
            number(s.tpot_s.p50, ".4f"),
            number(s.e2e_s.p50, ".2f"),
            number(s.e2e_s.p99, ".2f"),
            f"{s.hit_ratio:.1%}",
            *([f"{s.hit_ratio_by_tier.get(t, 0.0):.1%}" for t in tiers] if len(tiers) > 1 else []),
            f"{s.throughput_tok_s:,.0f}",
            f"{s.load_imbalance:.2f}",
            f"{s.evictions_per_s:,.0f}",
            f"{s.prefill_tokens_computed / 1e6:,.2f}",
        ]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    # A narrow window scrolls the table instead of cutting its last columns.
    return f"<div class='wide'><table>{head}{''.join(rows)}</table></div>"
