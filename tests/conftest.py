"""Shared fixtures: a manual clock, a seeded rng."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from kvtide.clock import ManualClock

# The benchmarks in bench/ are scripts, not a package: run as `python bench/NAME.py`, they find
# their shared helper (bench/revision.py) as `import revision` because bench/ is sys.path[0].
# Tests import them by name (`import gateways`) or as `bench.NAME`, so bench/ goes on sys.path
# here too (last, so that a script's name shadows no other module).
BENCH = str(Path(__file__).resolve().parents[1] / "bench")
if BENCH not in sys.path:
    sys.path.append(BENCH)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def rng() -> random.Random:
    return random.Random(1234)
