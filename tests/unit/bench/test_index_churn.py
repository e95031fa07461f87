"""bench/index_churn.py: the engines' events it replays evict, both indexes end holding the
same blocks, and a run writes its JSON; a missing trace is one line and exit code 2."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import index_churn  # bench/*.py: tests/conftest.py puts bench/ on sys.path
from kvtide.core.events import BlockRemoved
from kvtide.routing.index import GlobalPrefixIndex

BENCH = Path(__file__).resolve().parents[3] / "bench"


def _trace(path: Path, rows: int) -> Path:
    """Conversations that grow turn by turn over a few shared first blocks, Mooncake-shaped."""
    rng = random.Random(5)
    convs: list[list[int]] = []
    next_id = 100
    lines = []
    for i in range(rows):
        if not convs or rng.random() < 0.3:
            convs.append([rng.randrange(3)])
        conv = rng.choice(convs)
        conv.extend(range(next_id, next_id + rng.randint(1, 3)))
        next_id += 3
        row = {"timestamp": i, "input_length": 512 * len(conv) - 100, "output_length": 8}
        lines.append(json.dumps(row | {"hash_ids": conv}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_replayed_events_evict_and_both_indexes_agree(tmp_path: Path) -> None:
    batches = index_churn.engine_events(_trace(tmp_path / "t.jsonl", 80), 80, 3, 400)
    assert len(batches) == 80
    assert any(isinstance(e, BlockRemoved) for _, events in batches for e in events)
    _, ours = index_churn.timed(GlobalPrefixIndex, batches)
    _, naive = index_churn.timed(index_churn.NaiveIndex, batches)
    held = ours.replica_blocks()
    assert held == naive.replica_blocks()
    assert 0 < max(held.values()) <= 400


def test_a_run_writes_its_json_and_a_missing_trace_is_one_line(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", 40)
    out = tmp_path / "r.json"
    run = subprocess.run(
        [sys.executable, str(BENCH / "index_churn.py"), str(trace), "--requests", "40",
         "--capacity-blocks", "300", "--runs", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())["result"]
    assert result["requests"] == 40 and result["entries"] > 0
    assert result["kvtide_us_per_request"] > 0 and result["naive_bytes_per_entry"] > 0
    bad = subprocess.run(
        [sys.executable, str(BENCH / "index_churn.py"), str(tmp_path / "none.jsonl")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "trace: no such file" in bad.stderr and "Traceback" not in bad.stderr
    (tmp_path / "bad.jsonl").write_text('{"timestamp": 0}\n')
    cases = [
        ([str(tmp_path / "bad.jsonl")], "bad.jsonl:1: missing field 'input_length'"),
        ([str(trace), "--replicas", "0"], "--replicas must be >= 1, got 0"),
    ]
    for args, says in cases:
        bad = subprocess.run(
            [sys.executable, str(BENCH / "index_churn.py"), *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert bad.returncode == 2 and "Traceback" not in bad.stderr
        assert says in bad.stderr
