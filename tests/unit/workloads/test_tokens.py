from __future__ import annotations

import numpy as np
import pytest

from kvtide.errors import TraceFormatError
from kvtide.types import Request, TenantId
from kvtide.workloads.tokens import read_tokens

from .conftest import WriteLines, fields


def test_token_rows_with_and_without_optional_fields(write_lines: WriteLines) -> None:
    path = write_lines(
        "tok.jsonl",
        [
            {"token_ids": [1, 2, 3]},
            {"token_ids": [1, 2, 3, 4], "timestamp": 0.5, "output_length": 9, "tenant": "acme"},
            {"token_ids": [7], "session_id": 42, "priority": 2, "request_id": "q"},
        ],
    )

    requests = list(read_tokens(path, block_tokens=2))

    assert [fields(r) for r in requests] == [
        fields(Request("0", 0.0, 3, 1, 2, token_ids=(1, 2, 3))),
        fields(Request("1", 0.5, 4, 9, 2, token_ids=(1, 2, 3, 4), tenant=TenantId("acme"))),
        fields(Request("q", 0.5, 1, 1, 2, token_ids=(7,), session_id="42", priority=2)),
    ]
    token_ids = requests[0].token_ids
    assert isinstance(token_ids, np.ndarray) and token_ids.dtype == np.int32
    assert not token_ids.flags.writeable


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"token_ids": []}, "field 'token_ids' is empty"),
        ({"token_ids": [1, -2]}, "holds ids outside [0, 2**31): -2..1"),
        ({"token_ids": [2**31]}, "holds ids outside [0, 2**31)"),
        ({"token_ids": [1, True]}, "must hold only integers, found true"),
        ({"token_ids": [1], "tenant": [1]}, "field 'tenant' must be a string"),
        ({"token_ids": [1], "timestamp": "soon"}, "field 'timestamp' must be a number"),
        ({"tokens": [1]}, "missing field 'token_ids'"),
    ],
)
def test_bad_rows_are_rejected(
    write_lines: WriteLines, row: dict[str, object], problem: str
) -> None:
    path = write_lines("tok.jsonl", [{"token_ids": [0]}, row])

    with pytest.raises(TraceFormatError) as caught:
        list(read_tokens(path, block_tokens=16))

    assert caught.value.line == 2
    assert problem in caught.value.problem
