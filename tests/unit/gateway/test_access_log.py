"""The access log's writer: lines in arrival order, memory bounded when the disk stalls, a
failed write (disk full) counted and survived, never raised into the serving loop."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.gateway.access_log import AccessLog, Exchange


def _exchange(i: int) -> Exchange:
    ex = Exchange("chat", 1_764_892_741.0 + i, 100.0 + i)
    ex.request_id = f"gw-{i}"
    ex.replica, ex.route, ex.attempts = "127.0.0.1:8001", "affinity", 1
    return ex


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from([200, 400, 429, 499, 502]), max_size=40), st.integers(1, 8))
def test_lines_come_out_whole_and_in_order(statuses: list[int], flushes: int) -> None:
    """However the records and flushes interleave, the file holds every line once, in the
    order recorded, each a JSON object with the status given."""
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"kvtide-access-{os.getpid()}.jsonl"
    path.unlink(missing_ok=True)

    async def go() -> None:
        log = AccessLog(str(path))
        every = max(len(statuses) // flushes, 1)
        for i, status in enumerate(statuses):
            log.record(_exchange(i), status, None, 100.5 + i)
            if i % every == 0:
                await log.flush()
        await log.close()

    try:
        asyncio.run(go())
        lines = [json.loads(line) for line in path.read_text().splitlines()]
    finally:
        path.unlink(missing_ok=True)
    assert [line["status"] for line in lines] == statuses
    assert [line["id"] for line in lines] == [f"gw-{i}" for i in range(len(statuses))]
    assert all(line["duration_ms"] == 500.0 for line in lines)


def test_a_duration_ends_when_the_client_had_its_answer(tmp_path: Path) -> None:
    """A stream's line is written after the engine's end of body (read for the connection's
    sake); its duration is the client's: arrival to the answer's end, when there was one."""
    path = tmp_path / "a.jsonl"
    log = AccessLog(str(path))
    whole, cut = _exchange(0), _exchange(1)
    whole.answered_s = 100.25  # arrived at 100.0
    log.record(whole, 200, None, 102.0)
    log.record(cut, 499, None, 103.0)  # arrived at 101.0, never answered
    asyncio.run(log.close())
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["duration_ms"] for line in lines] == [250.0, 2000.0]


def test_past_max_pending_lines_are_dropped_and_counted(tmp_path: Path) -> None:
    dropped: list[int] = []
    log = AccessLog(str(tmp_path / "a.jsonl"), max_pending=3, on_drop=dropped.append)
    for i in range(5):
        log.record(_exchange(i), 200, None, 101.0)
    assert log.pending == 3 and sum(dropped) == 2
    asyncio.run(log.close())
    assert len((tmp_path / "a.jsonl").read_text().splitlines()) == 3


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_loses_the_lines_and_not_the_server() -> None:
    dropped: list[int] = []
    log = AccessLog("/dev/full", on_drop=dropped.append)

    async def go() -> None:
        for i in range(4):
            log.record(_exchange(i), 200, None, 101.0)
        await log.flush()  # ENOSPC: counted, not raised
        log.record(_exchange(9), 200, None, 101.0)
        await log.close()

    asyncio.run(go())
    assert sum(dropped) == 5
