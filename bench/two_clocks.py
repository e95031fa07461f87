"""One model, two clocks: the same built-in workload through `kvtide simulate` (one replica, a
ManualClock) and through `kvtide engine` (the same engine code on a scaled wall clock) at the
same arrival times, compared on TTFT p50 / p99 and the cached-token ratio.

The engine is driven over HTTP by a small open-loop client (aiohttp, streaming completions with
the workload's token ids as the prompt and its output length as max_tokens); TTFT is measured
at the client, from the request's send to its first token, in wall seconds times --speedup.

    python bench/two_clocks.py --requests 300 --speedup 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 49_152  # SmolLM2's: the engine's default tokenizer refuses ids outside it


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

    def engine_args(self, speedup: float) -> list[str]:
        return [
            "--model", self.model, "--gpu", self.gpu, "--tp", str(self.tp),
            "--block-tokens", str(self.block_tokens),
            "--kv-cache-tokens", str(self.kv_cache_tokens), "--eviction", "lru",
            "--speedup", str(speedup), "--max-waiting", "100000", "--max-model-len", "65536",
        ]  # fmt: skip


def simulate(setup: Setup) -> dict[str, float]:
    """`kvtide simulate` in this process; its JSON's first run."""
    from kvtide.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sim.json"
        code = main(setup.simulate_args(path))
        if code:
            raise RuntimeError(f"kvtide simulate exited {code}")
        run = json.loads(path.read_text())["runs"][0]
    return {
        "ttft_p50_s": run["ttft_s"]["p50"],
        "ttft_p99_s": run["ttft_s"]["p99"],
        "cached_ratio": run["hit_ratio"],
    }


def workload_requests(setup: Setup) -> list[tuple[float, list[int], int]]:
    """(arrival offset s, prompt token ids, output tokens), exactly as the simulator replays
    them (the same preparation: load rescaling included)."""
    from kvtide.sim.scenario import Scenario, prepare

    scenario = Scenario(
        workload=setup.workload,
        requests=setup.requests,
        block_tokens=setup.block_tokens,
        load=setup.load,
        seed=setup.seed,
        model=setup.model,
        gpu=setup.gpu,
        tp=setup.tp,
        replicas=1,
        gpu_cache_tokens=setup.kv_cache_tokens,
    )
    reqs = prepare(scenario).requests
    first = reqs[0].arrival_s
    out = []
    for r in reqs:
        assert r.token_ids is not None, "the built-in workloads carry token ids"
        ids = (np.asarray(r.token_ids[: r.prompt_tokens], dtype=np.int64) % VOCAB).tolist()
        out.append((r.arrival_s - first, ids, max(1, r.output_tokens)))
    return out


async def drive(
    url: str, requests: list[tuple[float, list[int], int]], speedup: float
) -> list[dict[str, float]]:
    """Sends each request at its arrival time / speedup; per request: model-time TTFT, prompt
    and cached tokens from the final usage chunk."""
    import aiohttp

    results: list[dict[str, float]] = []
    timeout = aiohttp.ClientTimeout(total=None)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start = time.perf_counter()

        async def one(at_s: float, ids: list[int], n: int) -> None:
            delay = start + at_s / speedup - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = {
                "prompt": ids,
                "max_tokens": n,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            sent = time.perf_counter()
            first: float | None = None
            tail = b""
            async with session.post(url + "/v1/completions", json=body) as resp:
                resp.raise_for_status()
                async for chunk in resp.content.iter_any():
                    if first is None:
                        first = time.perf_counter()
                    tail = (tail + chunk)[-4096:]
            assert first is not None
            usage_line = [ln for ln in tail.split(b"\n\n") if b'"usage"' in ln][-1]
            usage = json.loads(usage_line[len(b"data: ") :])["usage"]
            results.append(
                {
                    "ttft_s": (first - sent) * speedup,
                    "prompt_tokens": usage["prompt_tokens"],
                    "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                }
            )

        await asyncio.gather(*(one(*r) for r in requests))
    return results


def run_engine(setup: Setup, speedup: float) -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from engine_process import running_engine

    requests = workload_requests(setup)
    with running_engine(*setup.engine_args(speedup)) as engine:
        rows = asyncio.run(drive(engine.url, requests, speedup))
    ttft = np.array([r["ttft_s"] for r in rows])
    return {
        "ttft_p50_s": float(np.quantile(ttft, 0.5)),
        "ttft_p99_s": float(np.quantile(ttft, 0.99)),
        "cached_ratio": sum(r["cached_tokens"] for r in rows)
        / sum(r["prompt_tokens"] for r in rows),
    }


def compare(setup: Setup, speedup: float) -> dict[str, Any]:
    sim = simulate(setup)
    eng = run_engine(setup, speedup)
    return {
        "speedup": speedup,
        "simulate": sim,
        "engine": eng,
        "ttft_p50_ratio": eng["ttft_p50_s"] / sim["ttft_p50_s"],
        "ttft_p99_ratio": eng["ttft_p99_s"] / sim["ttft_p99_s"],
        "cached_points": 100 * (eng["cached_ratio"] - sim["cached_ratio"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--speedup", default="1,10", help="comma list (default 1,10)")
    ap.add_argument("--workload", default=Setup.workload)
    args = ap.parse_args()
    setup = Setup(workload=args.workload, requests=args.requests)
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    print(f"# two_clocks: {setup}, {os.cpu_count()} cores, rev {rev}")
    print(f"{'speedup':>7} {'sim p50':>8} {'eng p50':>8} {'ratio':>6} {'sim p99':>8} "
          f"{'eng p99':>8} {'ratio':>6} {'sim hit':>8} {'eng hit':>8} {'points':>7}")  # fmt: skip
    for speedup in (float(s) for s in args.speedup.split(",")):
        r = compare(setup, speedup)
        s, e = r["simulate"], r["engine"]
        print(
            f"{speedup:7g} {s['ttft_p50_s']:8.3f} {e['ttft_p50_s']:8.3f} "
            f"{r['ttft_p50_ratio']:6.3f} {s['ttft_p99_s']:8.3f} {e['ttft_p99_s']:8.3f} "
            f"{r['ttft_p99_ratio']:6.3f} "
            f"{s['cached_ratio']:8.4f} {e['cached_ratio']:8.4f} {r['cached_points']:+7.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
