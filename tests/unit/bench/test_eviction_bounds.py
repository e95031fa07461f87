"""bench/eviction_bounds.py's session-hindsight bound: turn depths as the trace's chains say,
the infinite cache at large capacity, and exactly LRU when no request continues another."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import eviction_bounds as bounds  # bench/: tests/conftest.py puts it on sys.path
from kvtide.cli.replay import Prepared, prepare, replay_one
from kvtide.core.oracle import Oracle


def trace(tmp_path: Path, rows: list[tuple[int, list[int]]], block: int = 512) -> Prepared:
    """A Mooncake-format trace: (arrival ms, chained block ids), every block full."""
    path = tmp_path / "t.jsonl"
    with path.open("w") as f:
        for ms, ids in rows:
            row = {"timestamp": ms, "input_length": block * len(ids), "output_length": 1}
            row["hash_ids"] = ids
            f.write(json.dumps(row) + "\n")
    return prepare(str(path), block_tokens=None, limit=None, seed=0, tenant_salt=False)


def test_depths_follow_the_chains(tmp_path: Path) -> None:
    data = trace(
        tmp_path,
        [
            (0, [0, 1]),  # session a, turn 1
            (1, [0, 2]),  # session b, turn 1
            (2, [0, 1, 3]),  # a, turn 2: runs through request 0's last block
            (3, [0, 1, 3, 4, 5]),  # a, turn 3
            (4, [0, 1, 6]),  # a branch off turn 1 (an edited message): continues request 0
            (5, [0, 7]),  # shares only the system prompt: a new session
        ],
    )
    depth, parent = bounds.session_depths(data)
    assert parent == [None, None, 0, 2, 0, None]
    assert depth == [0, 0, 1, 2, 1, 0]


def test_unbounded_capacity_reaches_the_infinite_cache(tmp_path: Path) -> None:
    rng = random.Random(1)
    rows: list[tuple[int, list[int]]] = []
    sessions: list[list[int]] = []
    next_id = 1
    for ms in range(300):
        if sessions and rng.random() < 0.6:
            s = rng.choice(sessions)
        else:
            s = [0]
            sessions.append(s)
        s.extend(range(next_id, next_id + rng.randint(1, 3)))
        next_id += 3
        rows.append((ms * 100, list(s)))
    data = trace(tmp_path, rows)
    oracle = Oracle(data.all_hashes())
    infinite = oracle.infinite_hit_blocks * data.block_tokens / int(data.prompt_tokens.sum())
    assert bounds.session_hindsight(data, 10**9) == pytest.approx(infinite)
    small = bounds.session_hindsight(data, 40 * data.block_tokens)
    assert 0.0 < small < infinite


def test_without_sessions_it_is_lru(tmp_path: Path) -> None:
    # Prompts share a system prompt and documents but never run through another's last block.
    rng = random.Random(2)
    docs = [[0, 10 * d + 1, 10 * d + 2] for d in range(12)]
    rows = []
    for ms in range(400):
        rows.append((ms * 10, [*rng.choice(docs), 1000 + ms]))
    data = trace(tmp_path, rows)
    assert bounds.session_depths(data)[1] == [None] * data.num_requests
    for blocks in (8, 20, 30):
        cap = blocks * data.block_tokens
        assert bounds.session_hindsight(data, cap) == pytest.approx(
            replay_one(data, "lru", cap)["hit_ratio"]
        )
