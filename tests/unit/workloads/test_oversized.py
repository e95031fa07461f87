"""Requests longer than a whole pool: found the same way for replay and simulate, and named by
the trace line the readers would report (blank lines and a CSV header counted)."""

from __future__ import annotations

import json
from pathlib import Path

from kvtide.types import Request
from kvtide.workloads import open_workload
from kvtide.workloads.oversized import MAX_NAMED, OversizedRequests


def _request(prompt: int, output: int) -> Request:
    return Request("r", 0.0, prompt, output, 16)


def test_a_prompt_that_fills_the_pool_fits_only_without_output() -> None:
    replay = OversizedRequests(64, 16, with_output=False, pool_name="pool")
    engine = OversizedRequests(64, 16, with_output=True, pool_name="pool")
    assert replay.keep(0, _request(64, 10))
    assert not engine.keep(0, _request(64, 10))  # one decoded token needs a fifth block
    assert engine.keep(1, _request(48, 16)) and not engine.keep(2, _request(48, 17))
    assert engine.skipped == [(0, 80), (2, 80)]


def test_report_names_jsonl_lines_counting_blank_ones(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [{"token_ids": list(range(n)), "timestamp": 0} for n in (10, 500, 20, 900)]
    text = json.dumps(rows[0]) + "\n\n" + "".join(json.dumps(r) + "\n" for r in rows[1:])
    path.write_text(text)
    workload = open_workload(str(path))
    oversized = OversizedRequests(256, 16, False, "pool of 256 tokens")
    kept = [r for i, r in enumerate(workload) if oversized.keep(i, r)]
    assert [r.prompt_tokens for r in kept] == [10, 20]
    lines = oversized.report(workload)
    assert lines == [
        f"{path}:3: needs 512 tokens of KV, more than the whole pool of 256 tokens; skipped",
        f"{path}:5: needs 912 tokens of KV, more than the whole pool of 256 tokens; skipped",
    ]


def test_csv_lines_count_the_header_and_long_lists_are_cut(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    rows = "".join(f"2023-11-16 18:15:{s:02d}.0,5000,10\n" for s in range(MAX_NAMED + 3))
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    workload = open_workload(str(path))
    oversized = OversizedRequests(1024, 16, True, "pool")
    assert not any(oversized.keep(i, r) for i, r in enumerate(workload))
    lines = oversized.report(workload)
    assert lines[0].startswith(f"{path}:2: needs 5,024 tokens")
    assert len(lines) == MAX_NAMED + 1 and "3 more requests skipped" in lines[-1]


def test_built_in_requests_are_named_by_position() -> None:
    workload = open_workload("builtin:chat:sessions=2")
    assert workload.where([0, 4]) == {0: "request 1", 4: "request 5"}
