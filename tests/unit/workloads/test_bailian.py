from __future__ import annotations

import pytest

from kvtide.errors import TraceFormatError
from kvtide.workloads.bailian import read_bailian

from .conftest import WriteLines


def _row(chat_id: int, parent: int, t: float, turn: int, ids: list[int]) -> dict[str, object]:
    return {
        "chat_id": chat_id,
        "parent_chat_id": parent,
        "timestamp": t,
        "input_length": 16 * len(ids) - 3,
        "output_length": 7,
        "type": "text",
        "turn": turn,
        "hash_ids": ids,
    }


def test_content_ids_are_kept_unchained_and_sessions_follow_parent_links(
    write_lines: WriteLines,
) -> None:
    path = write_lines(
        "bl.jsonl",
        [
            _row(1, -1, 0.25, 1, [50, 51]),
            _row(5, 1, 1.5, 2, [50, 51, 51, 52]),
            _row(9, 5, 2.0, 3, [50, 51, 51, 52, 53]),
            _row(7, 3, 2.5, 2, [60]),  # parent 3 is not in the file: it becomes the root
        ],
    )

    requests = list(read_bailian(path))

    assert [r.request_id for r in requests] == ["1", "5", "9", "7"]
    assert [r.session_id for r in requests] == ["1", "1", "1", "3"]
    assert [r.arrival_s for r in requests] == [0.25, 1.5, 2.0, 2.5]
    assert requests[1].block_ids == (50, 51, 51, 52)
    assert {r.block_tokens for r in requests} == {16}
    assert (requests[1].prompt_tokens, requests[1].output_tokens) == (61, 7)
    assert requests[2].extra == {"chat_id": 9, "parent_chat_id": 5, "type": "text", "turn": 3}


def test_optional_fields_may_be_absent(write_lines: WriteLines) -> None:
    row = {"chat_id": 4, "timestamp": 1.0, "input_length": 5, "output_length": 2, "hash_ids": [3]}
    path = write_lines("bl.jsonl", [row])

    (request,) = read_bailian(path)

    assert request.session_id == "4"
    assert request.extra == {"chat_id": 4, "parent_chat_id": -1, "type": None, "turn": None}


def test_inconsistent_hash_ids_name_the_line(write_lines: WriteLines) -> None:
    path = write_lines(
        "bl.jsonl", [_row(1, -1, 0.0, 1, [1]), {**_row(2, -1, 1.0, 1, [1]), "input_length": 40}]
    )

    with pytest.raises(TraceFormatError, match=r"bl.jsonl:2: 'hash_ids' has 1 ids but 40 prompt"):
        list(read_bailian(path))
