"""The HTML report: the same bytes for the same config and seed, parameters for people, a dash
for what does not apply, moving means weighted as the note says."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from kvtide.cli import main
from kvtide.sim.report import moving_mean

SMALL = ["simulate", "--requests", "60", "--quiet", "--replicas", "4"]


def report(tmp_path: Path, name: str, *extra: str) -> str:
    assert main([*SMALL, *extra, "--report", str(tmp_path / name)]) == 0
    return (tmp_path / name / "index.html").read_text(encoding="utf-8")


def test_the_same_config_and_seed_give_the_same_bytes(tmp_path: Path) -> None:
    argv = ["--router", "round_robin,cost", "--host-cache-tokens", "64000"]
    a = report(tmp_path, "a", *argv, "--jobs", "1")
    b = report(tmp_path, "b", *argv, "--jobs", "2")
    assert a == b
    assert report(tmp_path, "c", *argv, "--seed", "1") != a


def test_parameters_are_written_for_people(tmp_path: Path) -> None:
    html = report(
        tmp_path, "r", "--router", "cost", "--gpu-cache-tokens", "250000",
        "--host-cache-tokens", "1000000", "--event-delay", "0.5",
    )  # fmt: skip
    setup = html[html.index("<h2>Setup</h2>") : html.index("<h2>Summary</h2>")]
    assert "GPU 250k tokens + host 1M tokens" in setup
    assert "delay 500 ms" in setup
    assert "fleet's capacity of 1M tokens" in html  # 4 replicas x 250k
    for raw in ("_tokens", "_s<", "None", "False", "[]"):
        assert raw not in setup


def test_a_prefill_only_report_shows_a_dash_for_tpot(tmp_path: Path) -> None:
    html = report(tmp_path, "r", "--router", "cost", "--prefill-only")
    summary = html[html.index("<h2>Summary</h2>") : html.index("<h2>Time to first token</h2>")]
    assert "<td>—</td>" in summary and "nan" not in summary.lower()


def test_a_run_shorter_than_the_early_warnings_window_says_why_it_has_no_signal(
    tmp_path: Path,
) -> None:
    html = report(tmp_path, "r", "--router", "cost")
    section = html[html.index("Cache telemetry and early warning") :]
    says = re.findall(
        r"no data: the signal needs (\d+) s of simulated time .*? spans (\d+) s", section
    )
    assert len(says) == 2, section[:2000]  # regret and residence
    need, span = map(int, says[0])
    assert need == 150 and span < need
    assert "<p><em>no data</em></p>" not in section


def test_overlapping_series_are_smoothed_and_the_legend_says_so(tmp_path: Path) -> None:
    html = report(tmp_path, "r", "--router", "round_robin,least_load")
    assert html.count("lines: mean of") == 2  # hit ratio and eviction velocity
    assert re.search(r'stroke-opacity="0\.\d+"', html)  # the raw windows, faint, underneath


def test_the_moving_mean_weighs_and_skips_what_was_not_measured() -> None:
    assert moving_mean([1.0, 3.0, 5.0], 3) == [2.0, 3.0, 4.0]
    nan = math.nan
    # A window of one token counts for one token against a window of 99.
    assert moving_mean([0.0, 1.0], 3, [99, 1]) == [pytest.approx(0.01)] * 2
    smoothed = moving_mean([nan, 0.5, nan], 3, [0, 10, 0])
    assert smoothed == [0.5, 0.5, 0.5]
    assert math.isnan(moving_mean([nan, nan], 3)[0])
