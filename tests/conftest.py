"""Shared fixtures: a manual clock, a seeded rng."""

from __future__ import annotations

import random

import pytest

from kvtide.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def rng() -> random.Random:
    return random.Random(1234)
