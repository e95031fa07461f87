from __future__ import annotations

import pytest

from kvtide.errors import TraceFormatError
from kvtide.types import Request
from kvtide.workloads.mooncake import read_mooncake

from .conftest import WriteLines, fields


def test_rows_become_requests_with_native_512_token_blocks(write_lines: WriteLines) -> None:
    path = write_lines(
        "mc.jsonl",
        [
            {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
            "",
            {"timestamp": 1500, "input_length": 512, "output_length": 3, "hash_ids": [0], "x": 1},
        ],
    )

    assert [fields(r) for r in read_mooncake(path)] == [
        fields(Request("0", 0.0, 1000, 10, 512, block_ids=(0, 1))),
        fields(Request("1", 1.5, 512, 3, 512, block_ids=(0,))),
    ]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"timestamp": 0, "input_length": 10', "malformed JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"timestamp": 0, "output_length": 1, "hash_ids": [0]}', "missing field 'input_length'"),
        (
            '{"timestamp": 0, "input_length": "10", "output_length": 1, "hash_ids": [0]}',
            "field 'input_length' must be an integer, got \"10\"",
        ),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": -1, "hash_ids": [0]}',
            "field 'output_length' must be >= 0, got -1",
        ),
        (
            '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0]}',
            "'hash_ids' has 1 ids but 600 prompt tokens need 2 blocks of 512 tokens",
        ),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}',
            "field 'hash_ids' must hold only integers, found \"a\"",
        ),
        (
            '{"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [0]}',
            "field 'timestamp' must be finite and >= 0",
        ),
    ],
)
def test_a_bad_line_is_named_with_its_problem(
    write_lines: WriteLines, line: str, problem: str
) -> None:
    good = {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}
    path = write_lines("bad.jsonl", [good, line])

    with pytest.raises(TraceFormatError) as caught:
        list(read_mooncake(path))

    assert (caught.value.path, caught.value.line) == (str(path), 2)
    assert problem in caught.value.problem
    assert str(caught.value).startswith(f"{path}:2: ")


def test_rows_must_be_in_arrival_order(write_lines: WriteLines) -> None:
    row = {"input_length": 10, "output_length": 1, "hash_ids": [0]}
    path = write_lines("mc.jsonl", [{**row, "timestamp": 2000}, {**row, "timestamp": 1}])

    with pytest.raises(
        TraceFormatError, match=r"mc.jsonl:2: timestamp goes backwards \(0.001 s after 2 s\)"
    ):
        list(read_mooncake(path))
