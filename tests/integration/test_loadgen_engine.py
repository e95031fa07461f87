"""`kvtide load --prompt-format tokens` against a real `kvtide engine`: the trace's token ids
arrive as they are (usage and the engine's own records count exactly the trace's tokens), a
shared prefix is a cache hit of its whole blocks, and every answer has the trace's length."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_process import SRC, running_engine


def test_token_prompts_reach_the_engine_as_the_trace_has_them(tmp_path: Path) -> None:
    head = list(range(1000, 1032))  # two 16-token blocks
    trace_rows = [
        {"token_ids": [*head, *range(2000, 2008)], "output_length": 5, "timestamp": 0.0},
        {"token_ids": [*head, *range(3000, 3011)], "output_length": 3, "timestamp": 0.2},
        {"token_ids": list(range(4000, 4017)), "output_length": 1, "timestamp": 0.3},
    ]
    trace = tmp_path / "tokens.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in trace_rows))
    records, out = tmp_path / "records.jsonl", tmp_path / "load.json"
    with running_engine("--speedup", "50", "--records", str(records)) as engine:
        done = subprocess.run(
            [sys.executable, "-m", "kvtide", "load", "--url", engine.url, "--workload",
             str(trace), "--prompt-format", "tokens", "--quiet", "--json", str(out)],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(SRC)},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["requests"]
    assert [r["error"] for r in rows] == [None, None, None]
    assert [r["prompt_tokens"] for r in rows] == [40, 43, 17]
    assert [r["cached_tokens"] for r in rows] == [0, 32, 0]
    assert [r["output_tokens"] for r in rows] == [5, 3, 1]
    engine_rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert sorted(r["prompt_tokens"] for r in engine_rows) == [17, 40, 43]


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_typed_event_apis_load_reads_the_stream_and_usage(tmp_path: Path, api: str) -> None:
    """`kvtide load --api messages` and `--api responses`: a multi-turn workload as Anthropic
    Messages or OpenAI Responses requests (the system prompt apart), their text deltas timed
    and their usage read: the prompt is the input and the cached input together (Messages
    counts them apart), as the engine counted it for the same chat turns."""
    out = tmp_path / "load.json"
    records = tmp_path / "records.jsonl"
    with running_engine("--speedup", "50", "--records", str(records)) as engine:
        done = subprocess.run(
            [sys.executable, "-m", "kvtide", "load", "--url", engine.url, "--workload",
             "builtin:chat:sessions=4,turns=3,duration_s=6,think_s=0.5,output_tokens=8",
             "--api", api, "--quiet",
             "--json", str(out)],
            capture_output=True, text=True, timeout=90, env={**os.environ, "PYTHONPATH": str(SRC)},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    rows = report["requests"]
    assert report["config"]["endpoint"].endswith(f"/v1/{api}")
    assert rows and all(r["error"] is None and r["ttft_s"] is not None for r in rows), rows
    engine_rows = [json.loads(line) for line in records.read_text().splitlines()]
    engine_prompts = sorted(r["prompt_tokens"] for r in engine_rows)
    assert sorted(r["prompt_tokens"] for r in rows) == engine_prompts
    assert any(r["cached_tokens"] for r in rows)  # later turns hit their conversation's blocks
    assert all(r["output_tokens"] >= 1 and r["finish_reason"] for r in rows)
