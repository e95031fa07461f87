"""The report's charts: as wide as the page, ticks on both axes, a fitted y range, a continuous
colour scale with its legend."""

from __future__ import annotations

import math
import re

from hypothesis import given
from hypothesis import strategies as st

from kvtide.sim.svg import Line, heatmap, line_chart, nice_ticks, shade


def luminance(color: str) -> float:
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_a_chart_scales_to_the_page_width() -> None:
    svg = line_chart([Line("a", [0, 1, 2], [0.1, 0.2, 0.3])], x_label="t (s)", y_label="y")
    assert 'width="100%"' in svg and 'viewBox="0 0 ' in svg
    assert not re.search(r'<svg[^>]* height="\d', svg)  # the height follows the width


def test_a_time_axis_starts_at_zero_ends_at_the_last_event_and_has_round_ticks() -> None:
    svg = line_chart(
        [Line("a", [1.0, 2.0, 30.0], [0.5, 0.6, 0.7])],
        x_label="simulated time since the first arrival (s)",
        y_label="hit ratio",
        x_min=0.0,
        x_max=37.3,
        y_percent=True,
    )
    labels = re.findall(r'text-anchor="middle">([^<]+)</text>', svg)
    assert labels[:8] == ["0", "5", "10", "15", "20", "25", "30", "35"]
    assert "simulated time since the first arrival (s)" in labels


def test_a_fitted_y_range_shows_small_differences() -> None:
    lines = [Line("a", [1, 2, 3], [0.62, 0.70, 0.78]), Line("b", [1, 2, 3], [0.64, 0.72, 0.79])]
    fitted = line_chart(lines, x_label="x", y_label="y", y_min=None, y_percent=True)
    ticks = [float(t) for t in re.findall(r'text-anchor="end">([\d.]+)%</text>', fitted)]
    assert 50 <= min(ticks) <= 62 and 79 <= max(ticks) <= 90
    zero_based = line_chart(lines, x_label="x", y_label="y", y_percent=True)
    assert ">0%</text>" in zero_based and ">0%</text>" not in fitted


def test_faint_lines_stay_out_of_the_legend_and_the_y_range() -> None:
    lines = [
        Line("raw", [0, 1, 2], [0.0, 10.0, 0.0], faint=True, color="#123456"),
        Line("mean", [0, 1, 2], [3.0, 3.3, 3.6], color="#123456"),
    ]
    svg = line_chart(lines, x_label="x", y_label="y", legend_note=["lines: mean of 3 windows"])
    assert svg.count(">raw<") == 0 and svg.count(">mean<") == 1
    assert "lines: mean of 3 windows" in svg
    assert ">10</text>" not in svg  # the raw spike is clipped, not scaled to


@given(st.floats(0, 1), st.floats(0, 1))
def test_the_colour_scale_darkens_with_the_value(a: float, b: float) -> None:
    if a < b - 1e-6:
        assert luminance(shade(a)) >= luminance(shade(b))


def test_a_heatmap_has_a_continuous_scale_with_ticks_and_a_time_axis() -> None:
    rows = [[i / 10 for i in range(11)], [1 - i / 10 for i in range(11)]]
    svg = heatmap(
        rows,
        ["replica 0", "replica 1"],
        ends_s=[float(i + 1) for i in range(11)],
        x_max=11.0,
        x_label="simulated time since the first arrival (s)",
        scale_label="busy fraction",
    )
    fills = set(re.findall(r'fill="(#[0-9a-f]{6})"', svg))
    assert len(fills) >= 20  # a gradient, not two swatches
    for tick in ("0%", "50%", "100%"):
        assert f">{tick}</text>" in svg
    assert "busy fraction" in svg and ">10</text>" in svg


def test_nice_ticks_are_round_and_cover_the_range() -> None:
    assert nice_ticks(0, 37.3, 8) == [0, 5, 10, 15, 20, 25, 30, 35]
    ticks = nice_ticks(0.55, 0.8, 5)
    assert all(math.isclose(t * 20, round(t * 20)) for t in ticks)
