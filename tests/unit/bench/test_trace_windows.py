"""bench/trace_windows.py: windows cut from a Mooncake-format trace, each sized as the live
bench sizes its run, every router simulated on every window; bad flags exit 2 naming the flag."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest

import trace_windows  # bench/trace_windows.py: tests/conftest.py puts bench/ on sys.path


def _trace(path: Path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    rows, next_hash, t = [], 1, 0
    for _ in range(n):
        blocks = rng.randint(1, 6)
        hashes = [0, *range(next_hash, next_hash + blocks)]  # block 0 shared by all
        next_hash += blocks
        t += rng.randint(0, 400)
        rows.append(
            {
                "timestamp": t,
                "input_length": 512 * len(hashes) - rng.randint(0, 500),
                "output_length": rng.randint(1, 300),
                "hash_ids": hashes,
            }
        )
    rows[5]["input_length"] = 40_000  # longer than the engines' context: left out
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_each_window_is_sized_and_simulated_for_every_router(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", 90)
    out = tmp_path / "out.json"
    argv = ["--trace", str(trace), "--router", "cost", "--router", "round_robin"]
    argv += ["--windows", "3", "--window-requests", "30", "--jobs", "1", "--json", str(out)]
    assert trace_windows.main(argv) == 0
    got = json.loads(out.read_text())
    assert [w["start"] for w in got["windows"]] == [0, 30, 60]
    assert all(w["gpu_cache_tokens"] > 0 and w["time_scale"] > 0 for w in got["windows"])
    for router in ("cost", "round_robin"):
        runs = got["runs"][router]
        # the first window lost its 40k-token request; the outputs were capped at 16
        assert [r["requests"] for r in runs] == [29, 30, 30]
        assert all(r["ttft_s"]["p99"] >= r["ttft_s"]["p50"] > 0 for r in runs)
    summary = got["summary"]
    assert summary["round_robin"]["p99_ratio"] == pytest.approx(1.0)  # the reference
    assert summary["round_robin"]["wins_p99"] == 0
    assert 0 <= summary["cost"]["wins_p99"] <= 3


def test_windows_keep_the_live_bench_context_and_output_caps(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", 40)
    args = argparse.Namespace(
        trace=trace,
        windows=2,
        window_requests=20,
        first=0,
        max_output_tokens=16,
        max_model_len=32_768,
        trace_requests=20,
        trace_duration=150.0,
        trace_time_scale=1.0,
        engines=4,
        pd=0,
        kv_fraction=0.5,
        load=0.8,
        scheduling_policy="priority",
        sessions=240,
        duration=120.0,
        system_prompts=16,
        think_s=15.0,
        seed=0,
    )
    made = trace_windows.windows(args, tmp_path)
    assert len(made) == 2
    for w in made:
        rows = [json.loads(ln) for ln in Path(w["file"]).read_text().splitlines()]
        assert rows[0]["timestamp"] == 0
        assert all(r["output_length"] <= 16 for r in rows)
        assert all(r["input_length"] + 16 <= 32_768 for r in rows)
        # the engines hold the window's longest request whole (gateways.size_engines)
        assert w["gpu_cache_tokens"] >= max(r["input_length"] for r in rows)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace", "{dir}/none.jsonl", "--router", "cost"], "--trace: no such file"),
        (["--trace", "{trace}", "--router", "nope"], "--router: unknown router 'nope'"),
        (["--trace", "{trace}", "--router", "cost", "--windows", "0"], "--windows: expected"),
        (["--trace", "{trace}", "--router", "cost", "--reference", "x"], "--reference: 'x'"),
        (["--trace", "{trace}", "--router", "cost", "--load", "0"], "--load: expected a number"),
        (["--trace", "{trace}", "--router", "cost", "--kv-fraction", "nan"], "--kv-fraction:"),
        (["--trace", "{trace}", "--router", "cost", "--engines", "0"], "--engines: expected"),
        (["--trace", "{trace}", "--router", "cost", "--first", "-1"], "--first: expected"),
        (["--trace", "{trace}", "--router", "cost", "--first", "39"], "--first: "),
        (
            ["--trace", "{trace}", "--router", "cost:deadline_k=3", "--scheduling-policy", "fcfs"],
            "add --scheduling-policy priority",
        ),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path / "t.jsonl", 40)
    subst = [a.replace("{dir}", str(tmp_path)).replace("{trace}", str(trace)) for a in argv]
    with pytest.raises(SystemExit) as exit_:
        trace_windows.main(subst)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert ": error: " in err and message in err
