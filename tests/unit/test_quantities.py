"""The input layer: one meaning per suffix, finite numbers only, strict YAML types, and
messages that name the flag or key and the value."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtide.errors import ConfigError
from kvtide.quantities import (
    InvalidValue,
    argparse_message,
    boolean,
    duration,
    flag,
    integer,
    items,
    real,
    text,
    tokens,
)


@pytest.mark.parametrize(
    ("given_", "expected"),
    [
        ("4096", 4096),
        ("512k", 512_000),
        ("512K", 512_000),
        ("1M", 1_000_000),
        ("1m", 1_000_000),
        ("1.5M", 1_500_000),
        ("1.1k", 1_100),
        ("0.3M", 300_000),
        ("2G", 2_000_000_000),
        ("256Ki", 262_144),
        ("1Mi", 1 << 20),
        ("1gi", 1 << 30),
        (" 64k ", 64_000),
        (4096, 4096),
        (0, 0),
        (1e6, 1_000_000),
    ],
)
def test_token_suffixes_are_decimal_and_binary_ones_explicit(given_: object, expected: int) -> None:
    assert tokens(given_, name="--x") == expected


@pytest.mark.parametrize(
    "bad", ["", "k", "1.5k7", "abc", "1T", "nan", "inf", "-5", "1.0001k", "1e400", True, None, [1]]
)
def test_bad_token_counts_name_the_flag_and_value(bad: object) -> None:
    with pytest.raises(InvalidValue) as info:
        tokens(bad, name="--gpu-cache-tokens")
    message = str(info.value)
    assert message.startswith("--gpu-cache-tokens: ")
    assert repr(bad)[:20] in message
    assert "\n" not in message


def test_token_bounds() -> None:
    assert tokens("1k", name="n", minimum=1, maximum=1000) == 1000
    with pytest.raises(InvalidValue, match="at most 1,000 tokens"):
        tokens("1001", name="n", maximum=1000)
    with pytest.raises(InvalidValue, match="at least 1 token, got 0"):
        tokens(0, name="n", minimum=1)


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(["", "k", "M", "G"]))
def test_token_text_round_trips(number: int, suffix: str) -> None:
    scale = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9}[suffix]
    assert tokens(f"{number}{suffix}", name="n", maximum=None) == number * scale


def test_reals_are_finite_and_bounded() -> None:
    assert real("0.5", name="--load", above=0) == 0.5
    assert real(2, name="--load") == 2.0
    for bad in ("nan", "inf", "-inf", float("nan"), float("inf"), "x", "", True, None):
        with pytest.raises(InvalidValue, match=r"^--load: "):
            real(bad, name="--load")
    with pytest.raises(InvalidValue, match="more than 0"):
        real("0", name="--load", above=0)
    with pytest.raises(InvalidValue, match="less than 1"):
        real("1", name="--loss", minimum=0, below=1)
    with pytest.raises(InvalidValue, match="at most 1"):
        real(1.5, name="--loss", maximum=1)


def test_integers_refuse_bools_fractions_and_out_of_range() -> None:
    assert integer("4", name="--replicas", minimum=1) == 4
    assert integer(4.0, name="replicas") == 4
    for bad in ("two", "4.5", 4.5, True, None, "", "1e3", [4]):
        with pytest.raises(InvalidValue, match=r"^replicas: not a whole number"):
            integer(bad, name="replicas")
    with pytest.raises(InvalidValue, match="--jobs: must be at least 1, got '0'"):
        integer("0", name="--jobs", minimum=1)


def test_durations() -> None:
    assert duration("2.5", name="d") == 2.5
    assert duration("500ms", name="d") == 0.5
    assert duration("5m", name="d") == 300.0
    assert duration("1h", name="d") == 3600.0
    assert duration(3, name="d") == 3.0
    for bad in ("-1", "nan", "inf", "5x", "", "1e400", True):
        with pytest.raises(InvalidValue, match=r"^--event-delay: "):
            duration(bad, name="--event-delay")


def test_booleans_must_be_real_bools() -> None:
    assert boolean(True, name="prefill_only") is True
    assert boolean(False, name="prefill_only") is False
    for bad in ("no", "yes", "false", 0, 1, None):
        with pytest.raises(InvalidValue, match="prefill_only: must be true or false"):
            boolean(bad, name="prefill_only")


def test_text_and_choices() -> None:
    assert text("lru", name="eviction", choices={"lru", "tide"}) == "lru"
    for bad in (5, "", "  ", None, ["lru"]):
        with pytest.raises(InvalidValue, match="eviction: must be a non-empty string"):
            text(bad, name="eviction")
    with pytest.raises(InvalidValue, match="must be one of lru, tide"):
        text("fifo", name="eviction", choices={"lru", "tide"})


def test_lists_refuse_empty_items_and_check_each_item() -> None:
    assert items("cost, chash", text, name="--router") == ["cost", "chash"]
    assert items("1k,2k", tokens, name="--capacity") == [1000, 2000]
    assert items([1, "2k"], tokens, name="capacity") == [1, 2000]
    for bad in ("cost,,chash", "cost,", ",cost", ""):
        with pytest.raises(InvalidValue, match=r"^--router: item \d of the list is empty"):
            items(bad, text, name="--router")
    with pytest.raises(InvalidValue, match=r"^router\[0\]: must be a non-empty string, got 5"):
        items([5], text, name="router")
    with pytest.raises(InvalidValue, match=r"replicas\[0\]: not a whole number, got 'two'"):
        items(["two", 4], integer, name="replicas", minimum=1)
    with pytest.raises(InvalidValue, match="needs at least 1 item"):
        items([], text, name="router")
    with pytest.raises(InvalidValue, match="not a list"):
        items(5, text, name="router")


def test_invalid_value_is_a_config_error() -> None:
    assert issubclass(InvalidValue, ConfigError)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t", exit_on_error=False)
    parser.add_argument("--gpu-cache-tokens", type=flag(tokens, minimum=1))
    parser.add_argument("--router", type=flag(items, parse=text))
    return parser


def test_flag_adapter_gives_argparse_a_type_error_that_names_the_flag() -> None:
    parser = _parser()
    assert parser.parse_args(["--gpu-cache-tokens", "64k"]).gpu_cache_tokens == 64_000
    with pytest.raises(argparse.ArgumentError) as info:
        parser.parse_args(["--gpu-cache-tokens", "10x"])
    message = argparse_message(str(info.value))
    assert message.startswith("--gpu-cache-tokens: not a token count")
    assert "'10x'" in message
    with pytest.raises(argparse.ArgumentError) as info:
        parser.parse_args(["--router", "cost,,chash"])
    assert argparse_message(str(info.value)).startswith("--router: item 2 of the list is empty")


def test_argparse_message_is_one_line() -> None:
    assert argparse_message("argument --x: bad\n  value") == "--x: bad value"
    assert argparse_message("unrecognized arguments: --y") == "unrecognized arguments: --y"
