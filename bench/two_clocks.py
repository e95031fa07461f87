"""One model, two clocks: the same built-in workload through `kvtide simulate` (one replica, a
ManualClock) and through `kvtide engine` (the same engine code on a scaled wall clock) driven by
`kvtide load` at the same arrival times, compared on TTFT p50 / p99 and the cached-token ratio.

`kvtide load --prompt-format tokens` sends each request's token ids as its /v1/completions
prompt and its output length as max_tokens (ignore_eos), `--time-scale` = the simulator's time
scale / --speedup; TTFT is the load generator's (send to first token) in wall seconds times
--speedup. The engine's own records (`kvtide engine --records`, its clock) are shown beside it.

    python bench/two_clocks.py --requests 300 --speedup 10,1 --runs 2
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from revision import git_rev

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))


@dataclass(frozen=True)
class Setup:
    workload: str = "builtin:chat:output_tokens=60"
    requests: int = 300
    model: str = "llama-3-70b"
    gpu: str = "a100"
    tp: int = 2
    kv_cache_tokens: int = 16_384
    """Small enough that the run evicts (and preempts) as well as it reuses."""
    block_tokens: int = 16
    load: float = 0.8
    seed: int = 0

    def simulate_args(self, json_path: Path) -> list[str]:
        return [
            "simulate", "--workload", self.workload, "--requests", str(self.requests),
            "--replicas", "1", "--router", "round_robin", "--model", self.model,
            "--gpu", self.gpu, "--tp", str(self.tp), "--block-tokens", str(self.block_tokens),
            "--gpu-cache-tokens", str(self.kv_cache_tokens), "--load", str(self.load),
            "--eviction", "lru", "--seed", str(self.seed), "--quiet", "--json", str(json_path),
        ]  # fmt: skip

    def engine_args(self, speedup: float, records: Path) -> list[str]:
        return [
            "--model", self.model, "--gpu", self.gpu, "--tp", str(self.tp),
            "--block-tokens", str(self.block_tokens),
            "--kv-cache-tokens", str(self.kv_cache_tokens), "--eviction", "lru",
            "--speedup", str(speedup), "--max-waiting", "100000", "--max-model-len", "65536",
            "--records", str(records),
        ]  # fmt: skip

    def load_args(self, url: str, time_scale: float, json_path: Path) -> list[str]:
        return [
            "load", "--url", url, "--workload", self.workload, "--requests", str(self.requests),
            "--seed", str(self.seed), "--time-scale", repr(time_scale),
            "--prompt-format", "tokens", "--quiet", "--json", str(json_path),
        ]  # fmt: skip


def simulate(setup: Setup) -> dict[str, Any]:
    """`kvtide simulate` in this process: its first run, and the time scale its --load chose."""
    from kvtide.cli import main

    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        path = Path(tmp) / "sim.json"
        code = main(setup.simulate_args(path))
        if code:
            raise RuntimeError(f"kvtide simulate exited {code}")
        report = json.loads(path.read_text())
    run, workload = report["runs"][0], report["workload"]
    if workload["skipped_requests"]:
        raise RuntimeError("the simulator skipped requests: the engine would get more")
    return {
        "ttft_p50_s": run["ttft_s"]["p50"],
        "ttft_p99_s": run["ttft_s"]["p99"],
        "cached_ratio": run["hit_ratio"],
        "time_scale": workload["time_scale"],
        "prompt_tokens": round(workload["prompt_tokens_mean"] * workload["requests"]),
    }


def kvtide(*args: str, timeout_s: float) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "kvtide", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
    )
    if done.returncode:
        raise RuntimeError(f"kvtide {args[0]} exited {done.returncode}: {done.stderr[-2000:]}")


def drive_engine(
    setup: Setup, speedup: float, time_scale: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`kvtide load` against `kvtide engine --speedup`: the load generator's request rows and
    the engine's own records."""
    from engine_process import running_engine

    with tempfile.TemporaryDirectory() as tmp:
        records_path, load_path = Path(tmp) / "records.jsonl", Path(tmp) / "load.json"
        with running_engine(*setup.engine_args(speedup, records_path)) as engine:
            span_s = setup.requests * time_scale / speedup  # about 1 s apart
            kvtide(
                *setup.load_args(engine.url, time_scale / speedup, load_path),
                timeout_s=120 + 3 * span_s,
            )
        rows = json.loads(load_path.read_text())["requests"]
        records = [json.loads(line) for line in records_path.read_text().splitlines()]
    return rows, records


def engine_stats(
    rows: list[dict[str, Any]], records: list[dict[str, Any]], speedup: float
) -> dict[str, Any]:
    """Client-side numbers in model seconds (wall x speedup) beside the engine's own."""
    failed = [r for r in rows if r["error"] is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, as {failed[0]}")
    ttft = np.array([r["ttft_s"] for r in rows]) * speedup
    engine_ttft = np.array([r["first_token_s"] - r["arrival_s"] for r in records])
    lag_ms = np.array([r["sent_s"] - r["scheduled_s"] for r in rows]) * 1e3
    return {
        "ttft_p50_s": float(np.quantile(ttft, 0.5)),
        "ttft_p99_s": float(np.quantile(ttft, 0.99)),
        "cached_ratio": sum(r["cached_tokens"] for r in rows)
        / sum(r["prompt_tokens"] for r in rows),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
        "prompt_tokens_as_trace": all(r["prompt_tokens"] == r["trace_prompt_tokens"] for r in rows),
        "requests": len(rows),
        "records": len(records),
        "engine_p50_s": float(np.quantile(engine_ttft, 0.5)),
        "engine_p99_s": float(np.quantile(engine_ttft, 0.99)),
        "send_lag_p50_ms": float(np.quantile(lag_ms, 0.5)),
        "send_lag_p99_ms": float(np.quantile(lag_ms, 0.99)),
    }


def compare(setup: Setup, speedup: float, sim: dict[str, Any] | None = None) -> dict[str, Any]:
    sim = sim or simulate(setup)
    eng = engine_stats(*drive_engine(setup, speedup, sim["time_scale"]), speedup)
    return {
        "speedup": speedup,
        "simulate": sim,
        "engine": eng,
        "ttft_p50_ratio": eng["ttft_p50_s"] / sim["ttft_p50_s"],
        "ttft_p99_ratio": eng["ttft_p99_s"] / sim["ttft_p99_s"],
        "cached_points": 100 * (eng["cached_ratio"] - sim["cached_ratio"]),
        "engine_p50_ratio": eng["engine_p50_s"] / sim["ttft_p50_s"],
        "engine_p99_ratio": eng["engine_p99_s"] / sim["ttft_p99_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--speedup", default="1,10", help="comma list (default 1,10)")
    ap.add_argument("--runs", type=int, default=1, help="engine runs per speedup (default 1)")
    ap.add_argument("--workload", default=Setup.workload)
    args = ap.parse_args()
    setup = Setup(workload=args.workload, requests=args.requests)
    rev = git_rev()
    print(f"# two_clocks: {setup}, {os.cpu_count()} cores, rev {rev}")
    sim = simulate(setup)
    print(
        f"# simulate: TTFT p50 {sim['ttft_p50_s']:.3f} s, p99 {sim['ttft_p99_s']:.3f} s, cached "
        f"{sim['cached_ratio']:.4f}, {sim['prompt_tokens']:,} prompt tokens, time scale "
        f"{sim['time_scale']:.4f}"
    )
    print(f"{'speedup':>7} {'load p50':>8} {'ratio':>6} {'load p99':>8} {'ratio':>6} "
          f"{'cached':>7} {'points':>7} {'eng p50':>8} {'ratio':>6} {'eng p99':>8} {'ratio':>6} "
          f"{'prompt tok':>10} {'lag p99':>7} {'loadavg':>7}")  # fmt: skip
    for speedup in (float(s) for s in args.speedup.split(",")):
        for _ in range(args.runs):
            r = compare(setup, speedup, sim)
            e = r["engine"]
            same = "" if e["prompt_tokens_as_trace"] else "!"
            print(
                f"{speedup:7g} {e['ttft_p50_s']:8.3f} {r['ttft_p50_ratio']:6.3f} "
                f"{e['ttft_p99_s']:8.3f} {r['ttft_p99_ratio']:6.3f} {e['cached_ratio']:7.4f} "
                f"{r['cached_points']:+7.2f} {e['engine_p50_s']:8.3f} "
                f"{r['engine_p50_ratio']:6.3f} {e['engine_p99_s']:8.3f} "
                f"{r['engine_p99_ratio']:6.3f} {e['prompt_tokens']:>9,}{same:1} "
                f"{e['send_lag_p99_ms']:5.1f}ms {os.getloadavg()[0]:7.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
