"""`kvtide load` as a real subprocess against a real streaming server on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvtide.cli.processes import free_port
from kvtide.loadgen import LoadConfig, Slo, schedule, summarize
from kvtide.text import Tokenizer
from kvtide.workloads import open_workload

from .sse_server import ITL_S, TTFT_S, Server, serving

pytestmark = pytest.mark.slow


def kvtide_load(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "kvtide", "load", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def bailian_sessions(path: Path) -> Path:
    """Two sessions of two turns sharing their first block, and a one-turn chat."""
    rows = [
        {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 40,
         "output_length": 20, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]},
        {"chat_id": 2, "parent_chat_id": -1, "timestamp": 0.05, "input_length": 40,
         "output_length": 6, "type": "text", "turn": 1, "hash_ids": [1, 7, 8]},
        {"chat_id": 3, "parent_chat_id": 1, "timestamp": 0.3, "input_length": 70,
         "output_length": 5, "type": "text", "turn": 2, "hash_ids": [1, 2, 3, 4, 5]},
        {"chat_id": 4, "parent_chat_id": 2, "timestamp": 0.35, "input_length": 56,
         "output_length": 2, "type": "text", "turn": 2, "hash_ids": [1, 7, 8, 9]},
    ]  # fmt: skip
    return write_jsonl(path, rows)


def run_json(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "load.json"
    done = kvtide_load(*args, "--json", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def test_sessions_share_prefixes_and_metrics_follow_their_definitions(
    tmp_path: Path, server: Server, tokenizer: Tokenizer
) -> None:
    trace = bailian_sessions(tmp_path / "bailian.jsonl")
    report = run_json(
        tmp_path, "--url", f"http://127.0.0.1:{server.port}", "--workload", str(trace)
    )
    rows = {r["request_id"]: r for r in report["requests"]}
    assert report["config"]["model"] == "tiny"  # from GET /v1/models
    assert len(server.bodies) == 4 and all(r["error"] is None for r in rows.values())

    bodies = {len(b["messages"]): [] for b in server.bodies}  # type: ignore[var-annotated]
    for body in server.bodies:
        bodies[len(body["messages"])].append(body)
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    firsts, seconds = bodies[1], bodies[3]
    assert len(firsts) == 2 and len(seconds) == 2
    by_tokens = {b["max_tokens"]: b for b in server.bodies}
    turn1, turn2 = by_tokens[20]["messages"], by_tokens[5]["messages"]
    assert turn2[0] == turn1[0] and [m["role"] for m in turn2] == ["user", "assistant", "user"]
    # block 1 is shared by both sessions: the same 16 words open both first turns
    one, other = (b["messages"][0]["content"] for b in firsts)
    assert one.split()[:16] == other.split()[:16] and one.split()[16] != other.split()[16]
    assert len(tokenizer.encode(turn1[0]["content"])) == 40
    assert len(tokenizer.encode(turn2[1]["content"])) == 20  # turn 1's output, from the trace

    # the second turn's prompt extends the first's rendered chat: the server saw cached blocks
    assert rows["3"]["cached_tokens"] > rows["1"]["cached_tokens"] >= 0
    assert rows["3"]["cached_tokens"] >= 16 * (len(server.prompts[0]) // 16) - 16
    for r in rows.values():
        n = r["output_tokens"]
        assert n == r["trace_output_tokens"] and r["prompt_tokens"] > r["trace_prompt_tokens"]
        assert r["ttft_s"] >= TTFT_S and len(r["itl_s"]) == n - 1
        # chunks may coalesce on the way (one gap per chunk), but none arrives before it is sent
        assert r["e2e_s"] >= TTFT_S + (n - 1) * ITL_S
        assert r["e2e_s"] == pytest.approx(r["ttft_s"] + sum(r["itl_s"]), abs=1e-9)
        if n > 1:
            assert r["tpot_s"] == pytest.approx((r["e2e_s"] - r["ttft_s"]) / (n - 1))
        assert r["sent_s"] >= r["scheduled_s"] - 1e-3
    # the summary is recomputed by hand from the rows
    s = report["summary"]
    done = list(rows.values())
    cached = sum(r["cached_tokens"] for r in done)
    assert s["cached_token_ratio"] == pytest.approx(cached / sum(r["prompt_tokens"] for r in done))
    ttfts = sorted(r["ttft_s"] for r in done)
    assert s["ttft_s"]["median"] == pytest.approx((ttfts[1] + ttfts[2]) / 2)
    itls = sorted(g for r in done for g in r["itl_s"])
    assert s["itl_s"]["count"] == 19 + 5 + 4 + 1
    assert s["itl_s"]["p99"] == pytest.approx(float(np.percentile(itls, 99)))
    assert s["output_tokens"] == 33 and s["errors"] == {}
    assert s == summarize(report["requests"], s["duration_s"], Slo()) | {"not_sent": 0}


def test_error_kinds_are_counted_and_the_run_goes_on(tmp_path: Path, server: Server) -> None:
    outputs = [3, 41, 42, 43, 44, 45, 4]
    trace = write_jsonl(
        tmp_path / "tokens.jsonl",
        [{"token_ids": [1000 + i, 2000, 3000], "output_length": n, "timestamp": i * 0.01}
         for i, n in enumerate(outputs)],
    )  # fmt: skip
    report = run_json(
        tmp_path,
        "--url", f"http://127.0.0.1:{server.port}/v1", "--workload", str(trace),
        "--api", "completions", "--timeout", "1500ms", "--model", "m",
    )  # fmt: skip
    s = report["summary"]
    assert s["errors"] == {
        "disconnected": 1, "http_400": 1, "http_503": 1, "stream_error": 1, "timeout": 1,
    }  # fmt: skip
    assert (s["completed"], s["failed"]) == (2, 5)
    by_out = {r["trace_output_tokens"]: r for r in report["requests"]}
    assert by_out[42]["detail"] == "bad field" and by_out[42]["status"] == 400
    assert by_out[45]["detail"] == "engine died"
    assert by_out[43]["ttft_s"] is None and by_out[3]["output_tokens"] == 3
    assert all("prompt" in b for b in server.bodies)


def test_token_prompts_send_the_trace_ids_as_they_are(tmp_path: Path, server: Server) -> None:
    rows = [
        {"token_ids": [1000 + i for i in range(40)], "output_length": 3, "timestamp": 0.0},
        {"token_ids": [1000 + i for i in range(33)] + [5, 6], "output_length": 2,
         "timestamp": 0.05},
    ]  # fmt: skip
    trace = write_jsonl(tmp_path / "tokens.jsonl", rows)
    report = run_json(
        tmp_path, "--url", f"http://127.0.0.1:{server.port}", "--workload", str(trace),
        "--prompt-format", "tokens", "--time-scale", "0.5",
    )  # fmt: skip
    assert report["config"]["api"] == "completions"  # the default with token ids
    assert [b["prompt"] for b in server.bodies] == [r["token_ids"] for r in rows]
    assert [b["max_tokens"] for b in server.bodies] == [3, 2]
    assert all(b["ignore_eos"] is True for b in server.bodies)
    done = report["requests"]
    assert [r["prompt_tokens"] for r in done] == [r["trace_prompt_tokens"] for r in done]
    assert [r["cached_tokens"] for r in done] == [0, 32]  # two shared 16-token blocks
    assert done[1]["scheduled_s"] == pytest.approx(0.025)


def test_connection_refused_is_an_error_kind_and_exit_1(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = kvtide_load(
        "--url", f"http://127.0.0.1:{free_port()}", "--model", "m", "--requests", "3",
        "--workload", "builtin:chat:sessions=3,duration_s=5", "--quiet", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert json.loads(out.read_text())["summary"]["errors"] == {"connect": 3}
    assert "connect 3" in done.stdout


def test_requests_and_duration_bound_the_run(tmp_path: Path, server: Server) -> None:
    spec = "builtin:burst:duration_s=30,on_rate=20,off_rate=20,user_tokens=20,system_tokens=40"
    report = run_json(
        tmp_path, "--url", f"http://127.0.0.1:{server.port}", "--workload", spec,
        "--requests", "5", "--concurrency", "2",
    )  # fmt: skip
    assert report["summary"]["requests"] == 5 and len(server.bodies) == 5
    assert all(r["scheduled_s"] == 0.0 for r in report["requests"])

    server.bodies.clear()
    start = time.monotonic()
    report = run_json(
        tmp_path, "--url", f"http://127.0.0.1:{server.port}", "--workload", spec,
        "--rate", "15", "--duration", "0.6", "--seed", "4", "--slo-ttft", "1s",
    )  # fmt: skip
    took = time.monotonic() - start
    config = LoadConfig(url="http://x", rate=15.0, duration_s=0.6, seed=4)
    expected = schedule(open_workload(spec, seed=4), config)
    assert len(server.bodies) == report["summary"]["requests"] == len(expected) >= 3
    assert [r["scheduled_s"] for r in report["requests"]] == [at for at, _ in expected]
    assert max(r["scheduled_s"] for r in report["requests"]) <= 0.6
    assert report["summary"]["good_requests"] == len(expected)
    assert took < 30  # start-up (tokenizer) plus 0.6 s of sending and the last answers


def test_api_key_is_sent_and_never_written(tmp_path: Path, server: Server) -> None:
    report = run_json(
        tmp_path, "--url", f"http://127.0.0.1:{server.port}", "--api-key", "sk-secret-1",
        "--workload", "builtin:chat:sessions=2,duration_s=5", "--requests", "2",
    )  # fmt: skip
    assert report["config"]["api_key"] == "(given)"
    assert "sk-secret-1" not in (tmp_path / "load.json").read_text()
    assert server.auth == ["Bearer sk-secret-1"] * 3  # /v1/models and both requests


def test_repeated_url_is_a_round_robin(tmp_path: Path, tokenizer: Tokenizer) -> None:
    spec = (
        "builtin:chat:sessions=4,turns=3,duration_s=2,think_s=0.2,user_tokens=20,system_tokens=40"
    )
    planned = len(schedule(open_workload(spec), LoadConfig(url="http://x")))
    assert planned >= 4
    with serving(tokenizer) as first, serving(tokenizer) as second:
        report = run_json(
            tmp_path, "--url", f"http://127.0.0.1:{first.port}",
            "--url", f"http://127.0.0.1:{second.port}/v1", "--workload", spec,
        )  # fmt: skip
    rows = report["requests"]
    assert len(rows) == planned and report["summary"]["failed"] == 0
    # request i of the plan went to URL i mod 2 (rows are sorted by schedule, as the plan)
    assert [r["target"] for r in rows] == [i % 2 for i in range(planned)]
    assert (len(first.bodies), len(second.bodies)) == ((planned + 1) // 2, planned // 2)
    assert report["config"]["endpoints"] == [
        f"http://127.0.0.1:{first.port}/v1/chat/completions",
        f"http://127.0.0.1:{second.port}/v1/chat/completions",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "0"], "--rate: must be more than 0"),
        (["--rate", "2", "--time-scale", "2"], "not allowed with argument"),
        (["--concurrency", "x"], "--concurrency: not a whole number"),
        (["--duration", "nan"], "--duration: not a duration"),
        (["--slo-tpot=-1ms"], "--slo-tpot: must be at least 0"),
        (["--workload", "/no/such/trace.jsonl"], "/no/such/trace.jsonl"),
        (["--url", "ftp://127.0.0.1:1"], "--url: not an http(s) URL"),
        (["--prompt-format", "tokens", "--api", "chat"], "--prompt-format tokens: needs --api"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    full = ["--url", "http://127.0.0.1:9", "--model", "m", *args]
    done = kvtide_load(*full, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in done.stderr
