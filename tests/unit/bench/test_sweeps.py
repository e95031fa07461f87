"""The sweep files under bench/sweeps stay valid grids of known routers and settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtide.cli.simulate import validate_names
from kvtide.sim.sweep import load_sweep

SWEEPS = sorted((Path(__file__).resolve().parents[3] / "bench" / "sweeps").glob("*.yaml"))


def test_there_are_sweep_files() -> None:
    assert len(SWEEPS) >= 2


@pytest.mark.parametrize("path", SWEEPS, ids=[p.name for p in SWEEPS])
def test_a_bench_sweep_expands_and_names_known_routers(path: Path) -> None:
    points = load_sweep(path)
    assert len(points) > 1 and "seed" in points[0].values  # means are taken over seeds
    for scenario in {p.scenario for p in points}:
        validate_names([scenario.router], scenario.eviction)
