"""The report's telemetry section: the signals of the Grafana dashboard (``dashboards/``), per
router over simulated time, the block histograms, and the early warning's alerts with reasons."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from kvtide.sim.scenario import RunResult
from kvtide.sim.svg import Line, line_chart
from kvtide.sim.telemetry import TelemetryResult
from kvtide.telemetry import metrics as m


def render_telemetry(results: Sequence[RunResult]) -> str:
    """HTML for the runs that carry telemetry (an empty string if none does)."""
    runs = [(r.summary.router, r.telemetry) for r in results if r.telemetry is not None]
    if not runs:
        return ""
    starts = [t.times_s[0] for _, t in runs if t.times_s]
    t0 = min(starts) if starts else 0.0

    def lines(pick: str, dashed_pick: str | None = None) -> list[Line]:
        out = []
        for router, t in runs:
            xs = [x - t0 for x in t.times_s]
            out.append(Line(router, xs, getattr(t, pick)))
            if dashed_pick is not None:
                out.append(Line(f"{router} baseline", xs, getattr(t, dashed_pick), dashed=True))
        return out

    first_router, first = runs[0]
    xs = [x - t0 for x in first.times_s]
    span = max((t.times_s[-1] - t0 for _, t in runs if t.times_s), default=0.0)
    # the early warning compares its fast window with a baseline: a shorter run has no signal
    # (a longer one can still have none: residence is unbounded while nothing is evicted)
    no_signal = "no data"
    if span < first.fast_window_s:
        no_signal = (
            f"no data: the signal needs {first.fast_window_s:.0f} s of simulated time (the "
            f"early warning's fast window) and this run's telemetry spans {span:.0f} s"
        )
    parts = [
        "<h2>Cache telemetry and early warning</h2>",
        "<p class='note'>The signals of kvtide's Grafana dashboard (dashboards/kvtide.json), "
        "computed from the same metrics (kvtide.telemetry) every "
        f"{_interval(first)} s of simulated time, summed over the replicas.</p>",
        "<h3>Evicted-then-wanted share of prompt tokens (the early warning's signal)</h3>",
        line_chart(
            lines("regret_fast", "regret_slow"),
            x_label="simulated time (s)",
            y_label="regret ratio, fast window (baseline dashed)",
            y_percent=True,
            empty=no_signal,
        ),
        "<h3>Residence: prompt tokens that arrive while a cached block stays (its drop is "
        "the early warning's second signal)</h3>",
        line_chart(
            lines("residence_fast", "residence_slow"),
            x_label="simulated time (s)",
            y_label="prompt tokens, fast window (baseline dashed)",
            empty=no_signal,
        ),
        f"<h3>Missed tokens by cause ({escape(first_router)})</h3>",
        line_chart(
            [Line(cause, xs, v) for cause, v in first.miss_tokens_per_s.items()],
            x_label="simulated time (s)",
            y_label="missed tokens / s",
        ),
        "<h3>Block churn per prompt token</h3>",
        line_chart(
            lines("churn_blocks_per_token"),
            x_label="simulated time (s)",
            y_label="blocks allocated / prompt token",
        ),
        "<h3>Device occupancy</h3>",
        line_chart(
            lines("occupancy"),
            x_label="simulated time (s)",
            y_label="cached / capacity",
            y_percent=True,
        ),
        "<h3>Rolling TTFT p99</h3>",
        line_chart(
            lines("ttft_p99_s"),
            x_label="simulated time (s)",
            y_label=f"TTFT p99 over the last {first.ttft_window_s:.0f} s (s)",
        ),
        _histograms(runs),
        _alerts(runs, t0),
    ]
    return "\n".join(parts)


def _interval(t: TelemetryResult) -> str:
    if len(t.times_s) < 2:
        return "?"
    return f"{t.times_s[1] - t.times_s[0]:g}"


def _histograms(runs: Sequence[tuple[str, TelemetryResult]]) -> str:
    head = "<tr><th>router</th><th>histogram</th><th>blocks</th><th>mean s</th>"
    head += "<th>p50 ≤ s</th><th>p90 ≤ s</th><th>p99 ≤ s</th></tr>"
    rows = []
    names = {
        m.BLOCK_LIFETIME.name: "lifetime",
        m.BLOCK_IDLE.name: "idle before eviction",
        m.BLOCK_REUSE_GAP.name: "reuse gap",
    }
    for router, t in runs:
        for name, label in names.items():
            h = t.histograms.get(name)
            if h is None or not h.count:
                continue
            mean = h.sum / h.count
            qs = "".join(f"<td>{_bound(h.quantile(q))}</td>" for q in (0.5, 0.9, 0.99))
            rows.append(
                f"<tr><td>{escape(router)}</td><td>{label}</td><td>{h.count:,}</td>"
                f"<td>{mean:,.1f}</td>{qs}</tr>"
            )
    return (
        "<h3>Block lifetimes, idle times and reuse gaps (every block)</h3>"
        "<p class='note'>Quantiles are bucket bounds of the Prometheus histograms.</p>"
        f"<table>{head}{''.join(rows)}</table>"
    )


def _bound(v: float) -> str:
    return "+Inf" if math.isinf(v) else ("–" if math.isnan(v) else f"{v:g}")


def _alerts(runs: Sequence[tuple[str, TelemetryResult]], t0: float) -> str:
    rows = [
        f"<tr><td>{escape(router)}</td><td>{a.time_s - t0:,.0f}</td><td>{escape(a.name)}</td>"
        f"<td style='text-align:left'>{escape(a.reason)}</td></tr>"
        for router, t in runs
        for a in t.alerts
    ]
    if not rows:
        return "<h3>Alerts</h3><p class='note'>The early warning raised no alert.</p>"
    head = "<tr><th>router</th><th>time (s)</th><th>alert</th><th>why</th></tr>"
    return f"<h3>Alerts</h3><table>{head}{''.join(rows)}</table>"
