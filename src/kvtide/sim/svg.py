"""Small inline-SVG charts (line charts and heatmaps) for a self-contained HTML report.

Every chart scales to the width of the page (a ``viewBox`` and ``width="100%"``), draws ticks and
labels on both axes, and is a pure function of its data, so the same run gives the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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
WIDTH, HEIGHT = 960, 380
LEFT, RIGHT, TOP, BOTTOM = 72, 200, 14, 52
Y_LABEL_BAND = 24  # the rotated y-axis label, centred at x = 16, 13 px high, and a gap
DIGIT_PX = 7.3  # a tick label's width per character at 13 px sans-serif (digits, commas)
FONT = 'font-family="sans-serif" font-size="13"'

# A sequential white-to-dark-blue scale ("Blues", ColorBrewer, Harrower & Brewer 2003): even
# steps in value read as even steps in lightness, which a two-colour threshold does not give.
_BLUES = ((247, 251, 255), (198, 219, 239), (107, 174, 214), (33, 113, 181), (8, 48, 107))


@dataclass(frozen=True, slots=True)
class Line:
    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    dashed: bool = False
    points_only: bool = False
    """Markers only (a measurement at one x), no line."""
    markers: bool = False
    """A marker at every point, on the line (a curve measured at a few x)."""
    faint: bool = False
    """Thin and pale, behind the others and not in the legend: the raw series a smoothed line
    of the same colour summarises."""
    offset_px: float = 0.0
    """Horizontal shift of a ``points_only`` line's markers, so measurements at one x (several
    routers at the fleet's capacity) sit side by side instead of hiding each other."""
    color: str | None = None
    """An SVG colour; by default the palette's, by the line's position among the lines that
    are neither faint nor coloured."""


def nice_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """Round tick values (steps of 1, 2, 2.5 or 5 times a power of ten) covering [lo, hi]."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
    first = math.ceil(lo / step - 1e-9) * step
    count = int((hi - first) / step + 1e-9) + 1
    return [round(first + i * step, 12) for i in range(count)]


def fmt_number(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.0f}" if v == int(v) else f"{v:.1f}"
    if abs(v) >= 1:
        return f"{v:.2f}".rstrip("0").rstrip(".")
    return f"{v:.3g}"


def _percent(v: float) -> str:
    return f"{v:.1%}".replace(".0%", "%")


def _open(height: float) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height:.0f}" '
        f'width="100%" preserveAspectRatio="xMinYMin meet" {FONT}>'
    )


def line_chart(
    lines: Sequence[Line],
    *,
    x_label: str,
    y_label: str,
    log_x: bool = False,
    x_min: float | None = None,
    x_max: float | None = None,
    y_min: float | None = 0.0,
    y_max: float | None = None,
    y_percent: bool = False,
    x_format: Callable[[float], str] = fmt_number,
    legend_note: Sequence[str] = (),
    empty: str = "no data",
) -> str:
    """An SVG line chart with a legend on the right (``legend_note``: lines of grey text under
    its entries). ``y_min=None`` fits the y range to the data (with a margin) so that small
    differences between lines show. ``empty``: what to say instead when no point is finite."""
    xs = [x for line in lines for x in line.xs if not log_x or x > 0]
    # The y range follows the lines that are not faint: a faint raw series is clipped to it.
    ranged = [line for line in lines if not line.faint] or lines
    ys = [y for line in ranged for y in line.ys if not math.isnan(y)]
    if not xs or not ys:
        return f"<p><em>{escape(empty)}</em></p>"
    fx: Callable[[float], float] = math.log10 if log_x else (lambda v: v)
    x0 = fx(min(xs) if x_min is None else x_min)
    x1 = fx(max(xs) if x_max is None else x_max)
    if x1 <= x0:
        x1 = x0 + 1
    lo, hi = _y_range(ys, y_min, y_max)
    y_ticks = [(t, _percent(t) if y_percent else fmt_number(t)) for t in nice_ticks(lo, hi, 5)]
    # wide tick labels ("200,000") push the plot right, clear of the rotated y label
    widest = max((len(label) for _, label in y_ticks), default=0)
    left = max(LEFT, Y_LABEL_BAND + 6 + math.ceil(DIGIT_PX * widest))
    pw, ph = WIDTH - left - RIGHT, HEIGHT - TOP - BOTTOM

    def px(v: float) -> float:
        return left + (fx(v) - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        return TOP + ph - (min(max(v, lo), hi) - lo) / (hi - lo) * ph

    out = [
        _open(HEIGHT),
        f'<rect x="{left}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>',
    ]
    for t, label in y_ticks:
        y = py(t)
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>'
        )
    for t in _x_ticks(x0, x1, log_x):
        x = px(t)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + ph}" stroke="#e4e4e4"/>'
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + ph}" y2="{TOP + ph + 5}" stroke="#666"/>'
            f'<text x="{x:.1f}" y="{TOP + ph + 19}" text-anchor="middle">{x_format(t)}</text>'
        )
    out.append(
        f'<text x="{left + pw / 2}" y="{HEIGHT - 10}" text-anchor="middle">{escape(x_label)}</text>'
        f'<text transform="translate(16,{TOP + ph / 2}) rotate(-90)" text-anchor="middle">'
        f"{escape(y_label)}</text>"
    )
    # Faint lines first, so the lines that summarise them are drawn over them.
    order = sorted(range(len(lines)), key=lambda i: not lines[i].faint)
    colors = _colors(lines)
    for i in order:
        out.extend(_draw(lines[i], colors[i], px, py, log_x))
    legend = [(line, colors[i]) for i, line in enumerate(lines) if not line.faint]
    for k, (line, color) in enumerate(legend):
        ly = TOP + 14 + 20 * k
        lx = WIDTH - RIGHT + 14
        dash = ' stroke-dasharray="6,4"' if line.dashed else ""
        if line.points_only:
            out.append(f'<circle cx="{lx + 11}" cy="{ly - 4}" r="5" fill="{color}"/>')
        else:
            out.append(
                f'<line x1="{lx}" x2="{lx + 22}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" '
                f'stroke-width="3"{dash}/>'
            )
        out.append(f'<text x="{lx + 28}" y="{ly}">{escape(line.label)}</text>')
    for k, note in enumerate(legend_note):
        ny = TOP + 14 + 20 * len(legend) + 8 + 17 * k
        out.append(
            f'<text x="{WIDTH - RIGHT + 14}" y="{ny}" fill="#555" font-size="12">'
            f"{escape(note)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _y_range(ys: Sequence[float], y_min: float | None, y_max: float | None) -> tuple[float, float]:
    if y_min is None:  # fitted to the data, a tenth of its spread as a margin, on round ticks
        lo, hi = min(ys), max(ys) if y_max is None else y_max
        spread = max(hi - lo, abs(hi) * 0.02, 1e-9)
        ticks = nice_ticks(lo - spread * 0.1, hi + spread * 0.1, 5)
        step = ticks[1] - ticks[0] if len(ticks) > 1 else spread
        lo = math.floor((lo - spread * 0.1) / step) * step
        if min(ys) >= 0:
            lo = max(lo, 0.0)
        if y_max is None:
            hi = math.ceil((hi + spread * 0.1) / step) * step
        return lo, hi
    lo = y_min
    hi = max(ys) if y_max is None else y_max
    if y_max is None and hi > lo:  # up to a round tick, leaving the highest line some room
        ticks = nice_ticks(lo, hi, 5)
        step = ticks[1] - ticks[0] if len(ticks) > 1 else hi - lo
        hi = math.ceil((hi + 0.02 * (hi - lo)) / step - 1e-9) * step
    return (lo, hi) if hi > lo else (lo, lo + 1)


def _x_ticks(x0: float, x1: float, log_x: bool) -> list[float]:
    if not log_x:
        return nice_ticks(x0, x1, 8)
    steps = (1, 2, 5) if x1 - x0 < 3 else (1,)
    decades = range(math.floor(x0), math.ceil(x1) + 1)
    ticks = [m * 10.0**e for e in decades for m in steps]
    return [t for t in ticks if x0 - 1e-9 <= math.log10(t) <= x1 + 1e-9]


def _colors(lines: Sequence[Line]) -> list[str]:
    out = []
    k = 0
    for line in lines:
        out.append(line.color or PALETTE[k % len(PALETTE)])
        if not line.faint and line.color is None:
            k += 1
    return out


def _draw(
    line: Line,
    color: str,
    px: Callable[[float], float],
    py: Callable[[float], float],
    log_x: bool,
) -> list[str]:
    # A NaN value breaks the line: nothing was measured there.
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in zip(line.xs, line.ys, strict=False):
        if math.isnan(y) or (log_x and x <= 0):
            runs.append([])
        else:
            runs[-1].append((px(x) + (line.offset_px if line.points_only else 0.0), py(y)))
    out = []
    dash = ' stroke-dasharray="6,4"' if line.dashed else ""
    style = 'stroke-width="1" stroke-opacity="0.15"' if line.faint else 'stroke-width="2"'
    for run in runs:
        if not line.points_only and len(run) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" {style}{dash}/>')
        if line.points_only or line.markers or (len(run) == 1 and not line.faint):
            radius = 5 if line.points_only else 3.5
            out.extend(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{radius}" fill="{color}" '
                'stroke="white" stroke-width="1"/>'
                for x, y in run
            )
    return out


def shade(value: float) -> str:
    """The colour of ``value`` in [0, 1] on the sequential scale (clamped)."""
    v = min(max(value, 0.0), 1.0) * (len(_BLUES) - 1)
    i = min(int(v), len(_BLUES) - 2)
    f = v - i
    a, b = _BLUES[i], _BLUES[i + 1]
    r, g, bl = (round(a[k] + (b[k] - a[k]) * f) for k in range(3))
    return f"#{r:02x}{g:02x}{bl:02x}"


def heatmap(
    rows: Sequence[Sequence[float]],
    row_labels: Sequence[str],
    *,
    ends_s: Sequence[float],
    x_max: float,
    x_label: str,
    scale_label: str,
) -> str:
    """Rows of values in [0, 1] (one per replica) over time, cell c covering the window that
    ends at ``ends_s[c]`` (seconds from the start); a colour scale with ticks on the right."""
    if not rows or not rows[0] or not ends_s:
        return "<p><em>no data</em></p>"
    cell_h = max(5.0, min(28.0, 260.0 / len(rows)))
    pw = WIDTH - LEFT - RIGHT
    plot_h = cell_h * len(rows)
    legend_h = max(plot_h - 24, 80.0)
    height = TOP + max(plot_h, legend_h + 24) + BOTTOM
    span = max(x_max, ends_s[-1], 1e-9)

    def px(t: float) -> float:
        return LEFT + t / span * pw

    out = [_open(height)]
    for r, row in enumerate(rows):
        y = TOP + r * cell_h
        if len(rows) <= 24 or r % math.ceil(len(rows) / 24) == 0:
            out.append(
                f'<text x="{LEFT - 6}" y="{y + cell_h * 0.5 + 4:.1f}" text-anchor="end">'
                f"{escape(row_labels[r])}</text>"
            )
        start = 0.0
        for end, v in zip(ends_s, row, strict=False):
            x0, x1 = px(start), px(end)
            out.append(
                f'<rect x="{x0:.1f}" y="{y:.1f}" width="{x1 - x0 + 0.4:.1f}" '
                f'height="{cell_h:.1f}" fill="{shade(v)}"/>'
            )
            start = end
    base = TOP + plot_h
    out.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{plot_h:.1f}" fill="none" stroke="#999"/>'
    )
    for t in nice_ticks(0.0, span, 8):
        x = px(t)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{base:.1f}" y2="{base + 5:.1f}" stroke="#666"/>'
            f'<text x="{x:.1f}" y="{base + 19:.1f}" text-anchor="middle">{fmt_number(t)}</text>'
        )
    out.append(
        f'<text x="{LEFT + pw / 2}" y="{base + 40:.0f}" text-anchor="middle">'
        f"{escape(x_label)}</text>"
    )
    out.extend(_scale_legend(WIDTH - RIGHT + 20, TOP, legend_h, scale_label))
    out.append("</svg>")
    return "".join(out)


def _scale_legend(x: float, top: float, height: float, label: str) -> list[str]:
    """A vertical colour bar from 0% (bottom) to 100% (top) with ticks."""
    steps = 40
    h = height / steps
    out = [f'<text x="{x}" y="{top + 4}">{escape(label)}</text>']
    bar_top = top + 24  # below the label, with room for the 100% tick's text
    for i in range(steps):
        value = 1 - (i + 0.5) / steps
        out.append(
            f'<rect x="{x}" y="{bar_top + i * h:.1f}" width="16" height="{h + 0.4:.1f}" '
            f'fill="{shade(value)}"/>'
        )
    out.append(
        f'<rect x="{x}" y="{bar_top}" width="16" height="{height:.1f}" fill="none" stroke="#999"/>'
    )
    for value in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = bar_top + (1 - value) * height
        out.append(
            f'<line x1="{x + 16}" x2="{x + 21}" y1="{y:.1f}" y2="{y:.1f}" stroke="#666"/>'
            f'<text x="{x + 24}" y="{y + 4:.1f}">{value:.0%}</text>'
        )
    return out
