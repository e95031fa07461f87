"""Sweep grids: expansion, settings, and rows."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.errors import ConfigError
from kvtide.sim.sweep import METRICS, expand, load_sweep, mean_rows


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


def _rows(draw_values: list[tuple[str, int, float, float | None]]) -> list[dict[str, object]]:
    """Sweep rows over (router, seed) with every metric set from two numbers."""
    out: list[dict[str, object]] = []
    for router, seed, a, b in draw_values:
        metrics: dict[str, object] = {m: a for m in METRICS}
        metrics["tpot_p50_s"] = b
        out.append({"router": router, "seed": seed, **metrics})
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["cost", "chash", "peer_sglang"]),
            st.integers(0, 5),
            st.floats(0, 1e6, allow_nan=False),
            st.one_of(st.none(), st.floats(0, 10, allow_nan=False)),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_means_over_a_key_match_a_per_group_reference(
    values: list[tuple[str, int, float, float | None]],
) -> None:
    table = _rows(values)
    means = mean_rows(table, ["router", "seed"], ["seed"])
    # one row per router, in order of first appearance
    assert [m["router"] for m in means] == list(dict.fromkeys(v[0] for v in values))
    for m in means:
        group = [v for v in values if v[0] == m["router"]]
        assert m["points"] == len(group)
        assert m["hit_ratio"] == pytest.approx(statistics.fmean(v[2] for v in group))
        tpots = [v[3] for v in group]
        if None in tpots:  # empty in one point: empty in the mean, never a mean of the rest
            assert m["tpot_p50_s"] is None
        else:
            assert m["tpot_p50_s"] == pytest.approx(statistics.fmean(tpots))  # type: ignore[arg-type]
        assert "seed" not in m


def test_means_over_every_key_is_one_row_and_over_a_stranger_an_error() -> None:
    table = _rows([("cost", 0, 1.0, 2.0), ("chash", 1, 3.0, 4.0)])
    (only,) = mean_rows(table, ["router", "seed"], ["router", "seed"])
    assert only["points"] == 2 and only["requests"] == 2.0
    with pytest.raises(ConfigError, match="--mean-over: 'seeds' is not a key of the grid"):
        mean_rows(table, ["router", "seed"], ["seeds"])
