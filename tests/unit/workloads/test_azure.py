from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from kvtide.errors import TraceFormatError
from kvtide.workloads.azure import AzureRow, SyntheticPrefixes, add_prefixes, read_azure

from .conftest import WriteLines

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def test_arrivals_and_lengths_come_from_the_file(write_lines: WriteLines) -> None:
    path = write_lines(
        "az.csv",
        [
            HEADER,
            "2023-11-16 18:15:46.6805900,374,44",
            "",
            "2023-11-16 18:15:50.9951690,396,109",
            "2023-11-16 18:16:46.6805900,17,1",
        ],
    )

    requests = list(read_azure(path, block_tokens=16))

    assert [r.arrival_s for r in requests] == pytest.approx([0.0, 4.314579, 60.0])
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == [
        (374, 44),
        (396, 109),
        (17, 1),
    ]
    assert [len(r.block_ids or ()) for r in requests] == [24, 25, 2]
    assert {r.block_tokens for r in requests} == {16}


def test_a_session_extends_its_last_prompt_and_output_until_it_goes_stale() -> None:
    always = SyntheticPrefixes(system_prompts=1, continue_prob=1.0, session_timeout_s=600.0)
    rows = [AzureRow(0.0, 100, 20), AzureRow(1.0, 200, 10), AzureRow(1000.0, 500, 5)]

    first, second, third = add_prefixes(rows, block_tokens=16, prefixes=always)

    assert first.block_ids is not None and second.block_ids is not None
    # Turn 2 keeps turn 1's six full prompt blocks; block 7 (prompt tail + output) is new.
    assert second.block_ids[:6] == first.block_ids[:6]
    assert second.block_ids[6] not in first.block_ids
    assert (second.session_id, second.extra["turn"]) == (first.session_id, 2)
    # Ten minutes later the session is stale: a new one starts from the system prompt.
    assert third.session_id != first.session_id
    assert third.extra["turn"] == 1


def test_the_prefix_structure_is_seeded() -> None:
    rows = [AzureRow(float(i), 50 + 37 * i, 10) for i in range(40)]

    def ids(seed: int) -> list[tuple[int, ...] | None]:
        return [r.block_ids for r in add_prefixes(rows, block_tokens=8, seed=seed)]

    assert ids(1) == ids(1)
    assert ids(1) != ids(2)


@pytest.mark.parametrize(
    ("lines", "line", "problem"),
    [
        (["time,tokens", "1,2"], 1, "expected a header with columns TIMESTAMP"),
        ([HEADER, "2023-11-16 18:15:46,abc,4"], 2, "bad row"),
        ([HEADER, "yesterday,3,4"], 2, "bad row"),
        ([HEADER, "2023-11-16 18:15:46,0,4"], 2, "ContextTokens must be >= 1"),
        ([HEADER, "2023-11-16 18:15:46,3,4", "2023-11-16 18:15:45,3,4"], 3, "goes backwards"),
        (  # a TypeError's traceback before
            [HEADER, "2023-11-16 18:15:46,3,4", "2023-11-16 18:15:47+00:00,3,4"],
            3,
            "mixes times with and without a timezone",
        ),
    ],
)
def test_bad_csv_rows_name_the_line(
    write_lines: WriteLines, lines: list[str], line: int, problem: str
) -> None:
    path = write_lines("az.csv", lines)

    with pytest.raises(TraceFormatError) as caught:
        list(read_azure(path, block_tokens=16))

    assert caught.value.line == line
    assert problem in caught.value.problem


def test_a_byte_that_is_not_utf8_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "az.csv"
    path.write_bytes(
        (HEADER + "\n2023-11-16 18:15:46,3,4\n").encode() + b"2023-11-16 18:15:47,\xff3,4\n"
    )
    with pytest.raises(TraceFormatError) as caught:
        list(read_azure(path, block_tokens=16))
    assert caught.value.line == 3 and "UTF-8" in caught.value.problem


def test_a_gzip_file_is_named_as_one(tmp_path: Path) -> None:
    path = tmp_path / "az.csv"
    path.write_bytes(gzip.compress((HEADER + "\n2023-11-16 18:15:46,3,4\n").encode()))
    with pytest.raises(TraceFormatError) as caught:
        list(read_azure(path, block_tokens=16))
    assert caught.value.line == 1 and "gzip" in caught.value.problem
