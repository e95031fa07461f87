"""Admission filters: a block is written down only once it has been requested often enough."""

from __future__ import annotations

import pytest

from kvtide.core.admission import AdmitAll, SeenCount, make_admission
from kvtide.core.hashing import BlockHashes, hash_block_ids
from kvtide.errors import ConfigError


def blocks(*ids: int) -> BlockHashes:
    return hash_block_ids(list(ids), seed=7)


def test_none_admits_everything() -> None:
    f = make_admission("none", 10)
    assert isinstance(f, AdmitAll)
    assert f.admitted_prefix(blocks(1, 2, 3)) == 3


def test_seen_twice_admits_from_the_second_request_on() -> None:
    f = make_admission("seen-twice", 100)
    a, b = blocks(1, 2, 3), blocks(1, 2, 9)
    f.record(a)
    assert f.admit(a).tolist() == [False, False, False]
    f.record(b)  # shares the first two blocks with a
    assert f.admit(a).tolist() == [True, True, False]
    assert f.admitted_prefix(a) == 2
    assert f.admit(b).tolist() == [True, True, False]
    f.record(a)
    assert f.admit(a).tolist() == [True, True, True]


def test_a_higher_threshold_waits_longer() -> None:
    f = SeenCount(100, threshold=3)
    a = blocks(4, 5)
    for expected in ([False, False], [False, False], [True, True]):
        f.record(a)
        assert f.admit(a).tolist() == expected
    assert f.name == "seen-3"


def test_counters_are_halved_every_sample() -> None:
    f = SeenCount(100, sample_blocks=4)
    a = blocks(1, 2)
    f.record(a)
    f.record(a)  # 4 records: counts 2 -> halved to 1
    assert f.num_resets == 1
    assert f.estimate(a).tolist() == [1, 1]
    assert f.admit(a).tolist() == [False, False]


def test_counts_saturate() -> None:
    f = SeenCount(100)
    a = blocks(1)
    for _ in range(40):
        f.record(a)
    assert f.estimate(a).tolist() == [15]


def test_empty_runs() -> None:
    f = SeenCount(10)
    f.record(BlockHashes())
    assert f.admit(BlockHashes()).tolist() == []
    assert f.admitted_prefix(BlockHashes()) == 0


def test_bad_names_and_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown admission filter"):
        make_admission("tinylfu-x", 10)
    with pytest.raises(ConfigError, match="bad options"):
        make_admission("seen-twice", 10, {"bogus": 1})
    with pytest.raises(ConfigError):
        SeenCount(10, threshold=0)
    with pytest.raises(ConfigError):
        SeenCount(0)
