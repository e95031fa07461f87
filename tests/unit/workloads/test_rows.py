from __future__ import annotations

import json
import sys

import pytest

from kvtide.errors import TraceFormatError
from kvtide.workloads import rows
from kvtide.workloads.tokens import read_tokens

from .conftest import WriteLines


def test_the_standard_json_module_stands_in_when_orjson_is_absent(
    monkeypatch: pytest.MonkeyPatch, write_lines: WriteLines
) -> None:
    monkeypatch.setitem(sys.modules, "orjson", None)  # makes `import orjson` fail
    assert rows.fastest_loads() is json.loads

    monkeypatch.setattr(rows, "_loads", json.loads)
    path = write_lines("t.jsonl", [{"token_ids": [1, 2]}, "{oops"])
    requests = read_tokens(path, block_tokens=16)

    assert next(requests).prompt_tokens == 2
    with pytest.raises(TraceFormatError, match=r"t.jsonl:2: malformed JSON"):
        next(requests)


def test_a_line_that_is_not_utf8_is_malformed(write_lines: WriteLines) -> None:
    path = write_lines("t.jsonl", [{"token_ids": [1]}])
    path.write_bytes(path.read_bytes() + b'{"token_ids": [1], "tenant": "\xff"}\n')

    with pytest.raises(TraceFormatError, match=r"t.jsonl:2: malformed JSON"):
        list(read_tokens(path, block_tokens=16))
