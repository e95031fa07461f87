"""Where state lives, live: two `kvtide serve` replicas behind a client-side round robin, in
front of the same emulated engines, with each gateway's own event-fed index (``--state
local``) and with one index shared through Redis (``--state redis://``), beside one gateway
alone, bounded-load consistent hashing (no shared state at all) and round robin; then the
simulator's answer to the same question (`kvtide study coordinator` on the same workload).

    python bench/two_gateways.py [--sessions 120] [--engines 4] [--redis redis://127.0.0.1:6379/0]
                                 [--json out.json] [--no-study]

Request ``i`` goes to gateway ``i mod 2``, so consecutive turns of a conversation usually land
on different gateways: the second must know where the first put the prefix. Both gateways get
the same ``--tenant-secret`` (replicas of one deployment share it; otherwise their tenant
salts, and so the engines' hash namespaces, differ).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvtide.cli.processes import (
    Engine,
    ProcessGroup,
    requests_served,
    start_engine,
    start_gateway,
    wait_all_ready,
)
from kvtide.errors import KvtideError
from kvtide.loadgen import LoadConfig, run_load, schedule
from kvtide.text import smollm2
from kvtide.workloads import open_workload

MODEL = "emu"


def workload_spec(args: argparse.Namespace) -> str:
    return (
        f"builtin:chat:sessions={args.sessions},turns={args.turns},duration_s={args.duration:g},"
        f"system_prompts=8,system_tokens=800,user_tokens=120,output_tokens=24,"
        f"think_s={args.think_s:g},max_prompt_tokens=4096"
    )


def run_design(
    args: argparse.Namespace, name: str, policy: str, gateways: int, state: str | None
) -> dict[str, Any]:
    workload = open_workload(workload_spec(args), seed=args.seed)
    engine_args = ["--speedup", str(args.speedup), "--kv-cache-tokens", str(args.kv_cache_tokens)]
    secret = secrets.token_hex(16)
    with ProcessGroup() as group:
        engines: list[Engine] = [
            start_engine(group, MODEL, engine_args, f"engine {i}") for i in range(args.engines)
        ]
        wait_all_ready(engines)
        gw_args = ["--tokenizer", "smollm2", "--tenant-secret", secret]
        if state is not None:
            gw_args += ["--state", state, "--state-prefix", f"kvtide-bench-{secrets.token_hex(4)}"]
        gws = [start_gateway(group, engines, policy, gw_args) for _ in range(gateways)]
        config = LoadConfig(
            url=gws[0].url,
            more_urls=tuple(g.url for g in gws[1:]),
            model=MODEL,
            seed=args.seed,
            timeout_s=120.0,
        )
        plan = schedule(workload, config)
        report = asyncio.run(run_load(config, workload, smollm2(), None, plan))
        per_engine = [requests_served(e.url) for e in engines]
    summary = report["summary"]
    mean = sum(per_engine) / len(per_engine) if per_engine else 0.0
    return {
        "design": name,
        "policy": policy,
        "gateways": gateways,
        "state": state or "local",
        "requests": summary["requests"],
        "errors": summary["failed"],
        "cached_token_ratio": summary.get("cached_token_ratio"),
        "ttft_s": {"p50": summary["ttft_s"]["p50"], "p99": summary["ttft_s"]["p99"]},
        "per_engine_requests": per_engine,
        "imbalance_max_over_mean": max(per_engine) / mean if mean else None,
    }


def run_study(args: argparse.Namespace) -> dict[str, Any]:
    """`kvtide study coordinator` on the same workload, one replica per engine."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "study.json"
        cmd = [sys.executable, "-m", "kvtide", "study", "coordinator", "--quiet",
               "--replicas", str(args.engines), "--uniform", workload_spec(args),
               "--skewed", workload_spec(args), "--gpu-cache-tokens", str(args.kv_cache_tokens),
               "--block-tokens", "16", "--seed", str(args.seed), "--json", str(out),
               # the engines run the model --speedup times faster than the wall clock the
               # arrivals were sent on: in model time the gaps are that much longer
               "--time-scale", str(args.speedup)]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return dict(json.loads(out.read_text()))


DESIGNS = (
    ("one gateway (reference)", "cost", 1, None),
    ("two gateways, local index each", "cost", 2, None),
    ("two gateways, shared Redis index", "cost", 2, "redis"),
    ("two gateways, chash (no shared state)", "chash", 2, None),
    ("two gateways, round robin", "round_robin", 2, None),
)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=120)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--duration", type=float, default=60.0, help="seconds over which sessions start")
    p.add_argument("--think-s", type=float, default=3.0)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--speedup", type=float, default=2.0)
    p.add_argument("--kv-cache-tokens", type=int, default=12_288)
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-study", action="store_true", help="skip the simulator's answer")
    p.add_argument("--json", type=Path, dest="json_path")
    args = p.parse_args(argv)
    runs = []
    for name, policy, gateways, state in DESIGNS:
        for attempt in range(3):  # a free port taken by another process before we bound it
            try:
                row = run_design(args, name, policy, gateways, args.redis if state else None)
                break
            except KvtideError as exc:
                if attempt == 2:
                    raise
                print(f"{name}: start-up failed ({exc}); again", file=sys.stderr)
        runs.append(row)
        ratio = row["cached_token_ratio"]
        print(
            f"{name:40s} cached {ratio if ratio is None else f'{ratio:.4f}'}  "
            f"TTFT p50 {row['ttft_s']['p50']:.3f} s p99 {row['ttft_s']['p99']:.3f} s  "
            f"max/mean {row['imbalance_max_over_mean']:.2f}  errors {row['errors']}",
            flush=True,
        )
    result: dict[str, Any] = {"config": vars(args) | {"json_path": None}, "runs": runs}
    if not args.no_study:
        result["study"] = run_study(args)
    text = json.dumps(result, indent=1, default=str)
    if args.json_path is not None:
        args.json_path.write_text(text + "\n")
    else:
        print(text)
    return 0 if all(r["errors"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
