"""`kvtide sweep` in-process: CSV and JSON lines, one row per point; Ray when installed."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kvtide.cli import main
from kvtide.sim.sweep import METRICS, expand

GRID = """
base:
  workload: builtin:chat:sessions=8
  requests: 20
  replicas: 2
grid:
  router: [round_robin, least_load]
  gpu_cache_tokens: [8Ki, 32Ki]
"""


def test_sweep_writes_one_csv_row_per_point(tmp_path: Path) -> None:
    config = tmp_path / "grid.yaml"
    config.write_text(GRID)
    out = tmp_path / "rows.csv"
    assert main(["sweep", str(config), "--out", str(out), "--quiet", "--jobs", "1"]) == 0
    rows = list(csv.DictReader(out.read_text().splitlines()))
    assert len(rows) == 4
    assert list(rows[0]) == ["router", "gpu_cache_tokens", *METRICS]
    assert {r["gpu_cache_tokens"] for r in rows} == {"8192", "32768"}


def test_sweep_writes_json_lines(tmp_path: Path) -> None:
    config = tmp_path / "grid.yaml"
    config.write_text(GRID)
    out = tmp_path / "rows.jsonl"
    assert main(["sweep", str(config), "--out", str(out), "--quiet", "--jobs", "2"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["router"] for r in rows] == ["round_robin", "round_robin", "least_load", "least_load"]
    assert all(r["requests"] == 20 for r in rows)


def test_a_bad_sweep_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "grid.yaml"
    config.write_text("grid:\n  router: [teleport]\n")
    assert main(["sweep", str(config), "--quiet"]) == 2
    assert "unknown router" in capsys.readouterr().err


def test_the_ray_executor_runs_the_same_points() -> None:
    pytest.importorskip("ray")
    from kvtide.sim.ray_executor import run_on_ray
    from kvtide.sim.scenario import run

    (point,) = expand({"workload": "builtin:chat:sessions=4", "requests": 10}, {"replicas": [1]})
    (remote,) = run_on_ray([point.scenario], None)
    assert remote.summary == run(point.scenario).summary


def test_means_over_a_key_print_one_row_per_group_and_keep_every_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "grid.yaml"
    config.write_text(GRID)
    doc = tmp_path / "sweep.json"
    # spelt as a flag and as the field, once each: one key
    over = ["--mean-over", "gpu-cache-tokens", "--mean-over", "gpu_cache_tokens"]
    argv = ["sweep", str(config), *over, "--json", str(doc)]
    assert main([*argv, "--quiet", "--jobs", "1"]) == 0
    table = capsys.readouterr().out
    assert "means over gpu_cache_tokens; times" in table
    assert table.count("round_robin") == 1 and table.count("least_load") == 1
    written = json.loads(doc.read_text())
    assert len(written["rows"]) == 4 and written["mean_over"] == ["gpu_cache_tokens"]
    for mean in written["means"]:
        points = [r for r in written["rows"] if r["router"] == mean["router"]]
        assert mean["points"] == 2
        assert mean["hit_ratio"] == pytest.approx(sum(r["hit_ratio"] for r in points) / 2)


def test_means_over_a_key_not_in_the_grid_fail_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "grid.yaml"
    config.write_text(GRID)
    assert main(["sweep", str(config), "--mean-over", "seed", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--mean-over: 'seed' is not a key of the grid" in err
