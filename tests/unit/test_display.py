"""Numbers for people: counts, token sizes, seconds, plurals, signs that agree with words."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtide.display import DASH, count, number, plural, points, seconds, signed, tokens


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (999, "999"),
        (1000, "1k"),
        (1500, "1.5k"),
        (64_000, "64k"),
        (262_144, "262,144"),
        (1_000_000, "1M"),
        (1_500_000, "1.5M"),
        (1_048_576, "1.05M"),
        (6_853_690, "6.85M"),
        (2_000_000_000, "2G"),
    ],
)
def test_counts_are_short_and_exact_where_round(value: int, text: str) -> None:
    assert count(value) == text


def test_tokens_and_plurals() -> None:
    assert tokens(1_000_000) == "1M tokens"
    assert tokens(1) == "1 token"
    assert plural(1, "request") == "1 request"
    assert plural(2937, "request") == "2,937 requests"
    assert plural(0, "point") == "0 points"


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0 s"), (5e-5, "50 µs"), (0.0123, "12.3 ms"), (36.2, "36.2 s"), (300, "5 min")],
)
def test_seconds_carry_their_unit(value: float, text: str) -> None:
    assert seconds(value) == text


def test_a_metric_that_does_not_apply_is_a_dash() -> None:
    assert number(math.nan, ".4f") == DASH
    assert number(None, ".4f") == DASH
    assert number(0.0, ".4f") == "0.0000"
    assert seconds(math.nan) == DASH


def test_signs_and_words_agree() -> None:
    assert signed(-1.84, ".1f") == "-1.8"
    assert points(-1.84, against="a fresh index") == "1.8 points below a fresh index"
    assert signed(2.8, ".1f") == "+2.8"
    assert points(2.8, against="x") == "2.8 points above x"
    # Rounding to zero drops the sign: never "-0.0" beside "level with".
    assert signed(-0.04, ".1f") == "0.0"
    assert points(-0.04, against="x") == "level with x"
    assert signed(-0.001, ".0%") == "0%"


@given(st.floats(min_value=-1000, max_value=1000, allow_nan=False))
def test_the_word_always_matches_the_printed_sign(change: float) -> None:
    text, words = signed(change, ".1f"), points(change, against="x")
    if text.startswith("-"):
        assert words.endswith("below x") and words.startswith(text[1:])
    elif text.startswith("+"):
        assert words.endswith("above x") and words.startswith(text[1:])
    else:
        assert words == "level with x"
