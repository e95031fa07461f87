"""Sweep grids: expansion, settings, and rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtide.errors import ConfigError
from kvtide.sim.sweep import METRICS, expand, load_sweep


def test_a_grid_expands_to_every_combination_in_order() -> None:
    points = expand(
        {"workload": "builtin:chat", "gpu-cache-tokens": "64k"},
        {"router": ["round_robin", "cost"], "replicas": [2, 4], "max_batched_tokens": [512]},
    )
    assert [(p.values["router"], p.values["replicas"]) for p in points] == [
        ("round_robin", 2),
        ("round_robin", 4),
        ("cost", 2),
        ("cost", 4),
    ]
    first = points[0].scenario
    # k is 10^3, as everywhere
    assert first.gpu_cache_tokens == 64_000 and first.workload == "builtin:chat"
    assert first.engine.max_batched_tokens == 512


def test_a_sweep_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "grid.yaml"
    path.write_text("base:\n  requests: 10\ngrid:\n  load: [0.5, 1.0]\n  event-delay: [0, 1]\n")
    points = load_sweep(path)
    assert len(points) == 4
    assert points[-1].scenario.event_delay_s == 1 and points[-1].scenario.load == 1.0


@pytest.mark.parametrize(
    ("base", "grid", "message"),
    [
        ({}, {"colour": [1]}, "unknown setting"),
        ({}, {"router": "cost"}, "non-empty list"),
        ({"gpu_cache_tokens": "lots"}, {}, "not a token count"),
        ({}, {"load": [0.5]}, ""),
    ],
)
def test_bad_settings_are_config_errors(base: dict, grid: dict, message: str) -> None:
    if not message:
        assert len(expand(base, grid)) == 1
        return
    with pytest.raises(ConfigError, match=message):
        expand(base, grid)


def test_metrics_are_the_row_columns() -> None:
    assert METRICS[0] == "requests" and "ttft_p99_s" in METRICS and "hit_ratio" in METRICS
