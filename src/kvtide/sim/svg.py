"""Small inline-SVG charts (line charts and heatmaps) for a self-contained HTML report."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
)
WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 150, 16, 44


@dataclass(frozen=True, slots=True)
class Line:
    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    dashed: bool = False
    points_only: bool = False


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.3g}"


def line_chart(
    lines: Sequence[Line],
    *,
    x_label: str,
    y_label: str,
    log_x: bool = False,
    y_min: float | None = 0.0,
    y_max: float | None = None,
    y_percent: bool = False,
) -> str:
    """An SVG line chart; a legend on the right names each line."""
    xs = [x for line in lines for x in line.xs if not log_x or x > 0]
    ys = [y for line in lines for y in line.ys if not math.isnan(y)]
    if not xs or not ys:
        return "<p><em>no data</em></p>"
    fx = (lambda v: math.log10(v)) if log_x else (lambda v: v)
    x0, x1 = fx(min(xs)), fx(max(xs))
    if x1 <= x0:
        x1 = x0 + 1
    lo = min(ys) if y_min is None else y_min
    hi = max(ys) if y_max is None else y_max
    if hi <= lo:
        hi = lo + 1
    if y_max is None:  # round the top up to a tick, leaving the highest line some room
        hi = next((t for t in _ticks(lo, hi * 1.05) if t >= hi * 1.02), hi * 1.05)
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(v: float) -> float:
        return LEFT + (fx(v) - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        return TOP + ph - (min(max(v, lo), hi) - lo) / (hi - lo) * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="11">',
        f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>',
    ]
    for t in _ticks(lo, hi):
        y = py(t)
        label = f"{t:.0%}" if y_percent else _fmt(t)
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{label}</text>'
        )
    if log_x:
        steps = (1, 2, 5) if x1 - x0 < 3 else (1,)
        decades = range(math.floor(x0), math.ceil(x1) + 1)
        xticks = [m * 10.0**e for e in decades for m in steps]
        xticks = [t for t in xticks if x0 - 1e-9 <= math.log10(t) <= x1 + 1e-9]
    else:
        xticks = _ticks(x0, x1)
    for t in xticks:
        x = px(t)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + ph}" stroke="#eee"/>'
            f'<text x="{x:.1f}" y="{TOP + ph + 14}" text-anchor="middle">{_fmt(t)}</text>'
        )
    out.append(
        f'<text x="{LEFT + pw / 2}" y="{HEIGHT - 8}" text-anchor="middle">{escape(x_label)}</text>'
        f'<text transform="translate(14,{TOP + ph / 2}) rotate(-90)" text-anchor="middle">'
        f"{escape(y_label)}</text>"
    )
    for i, line in enumerate(lines):
        color = PALETTE[i % len(PALETTE)]
        # A NaN value breaks the line: nothing was measured there.
        runs: list[list[tuple[float, float]]] = [[]]
        for x, y in zip(line.xs, line.ys, strict=False):
            if math.isnan(y) or (log_x and x <= 0):
                runs.append([])
            else:
                runs[-1].append((px(x), py(y)))
        dash = ' stroke-dasharray="5,3"' if line.dashed else ""
        for run in runs:
            if line.points_only:
                out.extend(
                    f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{color}"/>' for x, y in run
                )
            elif run:
                path = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
                out.append(
                    f'<polyline points="{path}" fill="none" stroke="{color}" '
                    f'stroke-width="1.6"{dash}/>'
                )
        ly = TOP + 12 + 16 * i
        out.append(
            f'<line x1="{WIDTH - RIGHT + 10}" x2="{WIDTH - RIGHT + 28}" y1="{ly - 4}" '
            f'y2="{ly - 4}" stroke="{color}" stroke-width="3"/>'
            f'<text x="{WIDTH - RIGHT + 32}" y="{ly}">{escape(line.label)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def heatmap(rows: Sequence[Sequence[float]], row_labels: Sequence[str], *, x_label: str) -> str:
    """Rows of values in [0, 1] (one per replica) as a white-to-blue grid."""
    if not rows or not rows[0]:
        return "<p><em>no data</em></p>"
    n_cols = len(rows[0])
    cell_h = max(4.0, min(14.0, 220.0 / len(rows)))
    pw = WIDTH - LEFT - RIGHT
    cell_w = pw / n_cols
    height = TOP + cell_h * len(rows) + BOTTOM
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height:.0f}" '
        f'width="{WIDTH}" height="{height:.0f}" font-family="sans-serif" font-size="10">'
    ]
    for r, row in enumerate(rows):
        y = TOP + r * cell_h
        if len(rows) <= 32 or r % 4 == 0:
            out.append(
                f'<text x="{LEFT - 4}" y="{y + cell_h * 0.8:.1f}" text-anchor="end">'
                f"{escape(row_labels[r])}</text>"
            )
        for c, v in enumerate(row):
            shade = int(255 - 200 * min(max(v, 0.0), 1.0))
            out.append(
                f'<rect x="{LEFT + c * cell_w:.1f}" y="{y:.1f}" width="{cell_w + 0.3:.1f}" '
                f'height="{cell_h:.1f}" fill="rgb({shade},{shade},255)"/>'
            )
    base = TOP + cell_h * len(rows)
    out.append(
        f'<text x="{LEFT + pw / 2}" y="{base + 28:.0f}" text-anchor="middle">'
        f"{escape(x_label)}</text>"
        f'<text x="{WIDTH - RIGHT + 10}" y="{TOP + 10}">busy fraction</text>'
        f'<rect x="{WIDTH - RIGHT + 10}" y="{TOP + 16}" width="12" height="12" '
        f'fill="rgb(255,255,255)" stroke="#999"/><text x="{WIDTH - RIGHT + 26}" '
        f'y="{TOP + 26}">idle</text>'
        f'<rect x="{WIDTH - RIGHT + 10}" y="{TOP + 32}" width="12" height="12" '
        f'fill="rgb(55,55,255)"/><text x="{WIDTH - RIGHT + 26}" y="{TOP + 42}">busy</text>'
        "</svg>"
    )
    return "".join(out)
