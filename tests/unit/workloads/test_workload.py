from __future__ import annotations

import pickle

import pytest

from kvtide.errors import ConfigError
from kvtide.types import Request
from kvtide.workloads.workload import Workload

from .conftest import fields


def _requests() -> list[Request]:
    return [
        Request(str(i), 10.0 + 2.0 * i, 32, 1, 16, token_ids=tuple(range(32))) for i in range(4)
    ]


def test_time_scale_stretches_gaps_from_the_first_arrival() -> None:
    workload = Workload("w", "memory", 16, lambda: iter(_requests()), time_scale=2.5)

    assert [r.arrival_s for r in workload] == [10.0, 15.0, 20.0, 25.0]


def test_limit_cuts_and_iteration_repeats() -> None:
    workload = Workload("w", "memory", 16, lambda: iter(_requests()), limit=3)

    assert [r.request_id for r in workload] == ["0", "1", "2"]
    assert [r.request_id for r in workload] == ["0", "1", "2"]


def test_of_holds_requests_in_memory() -> None:
    workload = Workload.of("mem", _requests())

    assert workload.description == {
        "name": "mem",
        "format": "memory",
        "block_tokens": 16,
        "params": {},
        "limit": None,
        "time_scale": 1.0,
    }
    assert [fields(r) for r in workload] == [fields(r) for r in _requests()]
    assert [fields(r) for r in pickle.loads(pickle.dumps(workload))] == [
        fields(r) for r in workload
    ]


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"limit": 0}, "request limit must be at least 1"),
        ({"time_scale": 0.0}, "time scale must be a positive number"),
        ({"time_scale": float("nan")}, "time scale must be a positive number"),
        ({"block_tokens": 0}, "block size must be at least 1 token"),
    ],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, float], problem: str) -> None:
    settings: dict[str, object] = {"block_tokens": 16, **kwargs}

    with pytest.raises(ConfigError, match=problem):
        Workload("w", "memory", source=lambda: iter(()), **settings)  # type: ignore[arg-type]
