"""`kvtide replay`, run in-process through kvtide.cli.main: reports and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtide.cli import main

SMALL = "builtin:chat:sessions=12,turns=3,duration_s=60"
TRACES = Path(__file__).resolve().parents[3] / ".." / "shared" / "traces"


def mooncake_rows(n: int) -> list[dict[str, object]]:
    rows = []
    for i in range(n):  # every request shares block 0 and half share block 1
        ids = [0, 1 if i % 2 else 100 + i, 200 + i]
        rows.append(
            {"timestamp": 1000 * i, "input_length": 1200, "output_length": 10, "hash_ids": ids}
        )
    return rows


def write_rows(path: Path, rows: list[dict[str, object]], bad: str | None = None) -> Path:
    lines = [json.dumps(row) for row in rows]
    if bad is not None:
        lines[2] = bad
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_builtin_replay_writes_every_run_and_the_optimum(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    argv = ["replay", SMALL, "--capacity", "2000,8000", "--policy", "lru,tide", "--oracle"]
    assert main([*argv, "--jobs", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert [(r["policy"], r["capacity_tokens"]) for r in runs] == [
        ("lru", 2000),
        ("lru", 8000),
        ("tide", 2000),
        ("tide", 8000),
    ]
    assert [o["capacity_tokens"] for o in report["oracle"]] == [2000, 8000]
    best = {o["capacity_tokens"]: o["hit_ratio"] for o in report["oracle"]}
    for r in runs:
        assert 0.0 < r["hit_ratio"] <= best[r["capacity_tokens"]] <= report["infinite_hit_ratio"]
        assert r["pct_of_optimum"] == pytest.approx(
            100 * r["hit_ratio"] / best[r["capacity_tokens"]]
        )
        assert set(r["miss_tokens"]) == {"cold", "evicted", "other_namespace", "partial"}
        hits_and_misses = r["hit_tokens"] + sum(r["miss_tokens"].values())
        assert hits_and_misses == r["prompt_tokens"] == report["prompt_tokens"]
        assert r["capacity_blocks"] == r["capacity_tokens"] // 16
    assert report["block_tokens"] == 16


def test_the_table_lists_each_policy_and_the_optimum(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", SMALL, "--capacity", "4000", "--policy", "s3fifo", "--oracle", "--jobs", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "s3fifo" in out and "optimum" in out and "4,000" in out


def test_a_process_pool_gives_the_same_numbers(tmp_path: Path) -> None:
    seq, par = tmp_path / "seq.json", tmp_path / "par.json"
    argv = ["replay", SMALL, "--capacity", "2000,4000", "--policy", "lru,cost"]
    assert main([*argv, "--jobs", "1", "--json", str(seq)]) == 0
    assert main([*argv, "--jobs", "2", "--json", str(par)]) == 0
    strip = ("wall_s", "us_per_request")

    def rows(path: Path) -> list[dict[str, object]]:
        return [
            {k: v for k, v in r.items() if k not in strip}
            for r in json.loads(path.read_text())["runs"]
        ]

    assert rows(seq) == rows(par)


def test_a_mooncake_trace_with_requests_and_tenant_salt(tmp_path: Path) -> None:
    trace = write_rows(tmp_path / "t.jsonl", mooncake_rows(10))
    out = tmp_path / "r.json"
    argv = ["replay", str(trace), "--capacity", "5120", "--policy", "lru", "--requests", "6"]
    assert main([*argv, "--tenant-salt", "--jobs", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["block_tokens"] == 512 and report["requests"] == 6
    run = report["runs"][0]
    # 6 requests of 2 full blocks: block 0 hits 5 times, block 1 (odd requests) 2 times.
    assert run["hit_tokens"] == (5 + 2) * 512
    assert run["miss_tokens"]["partial"] == 6 * (1200 - 1024)


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--policy", "lru,nope"], "--policy: must be one of cost, lfu, lru"),
        (["--capacity", "0"], "--capacity: must be at least 1 token, got '0'"),
        (["--capacity", "1000,-5"], "--capacity: must be at least 1 token, got '-5'"),
        (["--capacity", "lots"], "--capacity: not a token count"),
        (["--capacity", "8"], "--capacity: 8 tokens hold no 16-token block"),
        (["--requests", "0"], "--requests: must be at least 1, got '0'"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", SMALL, "--jobs", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and problem in err and "Traceback" not in err


def test_a_malformed_trace_line_names_the_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_rows(tmp_path / "bad.jsonl", mooncake_rows(5), bad='{"timestamp": 2000, "inp')
    assert main(["replay", str(trace), "--capacity", "5120", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{trace}:3:" in err


def test_an_unreadable_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.jsonl"
    assert main(["replay", str(missing), "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.jsonl" in err and "cannot read" in err


@pytest.mark.traces
@pytest.mark.slow
def test_tide_beats_lru_on_the_start_of_the_mooncake_trace(tmp_path: Path) -> None:
    trace = TRACES / "mooncake_conversation.jsonl"
    if not trace.exists():
        pytest.skip("../shared/traces is absent")
    out = tmp_path / "r.json"
    argv = ["replay", str(trace), "--requests", "4000", "--capacity", "1000000,3000000"]
    assert main([*argv, "--policy", "lru,tide", "--jobs", "1", "--json", str(out)]) == 0
    runs = {
        (r["policy"], r["capacity_tokens"]): r["hit_ratio"]
        for r in json.loads(out.read_text())["runs"]
    }
    for cap in (1000000, 3000000):
        assert runs[("tide", cap)] >= runs[("lru", cap)] - 0.01
