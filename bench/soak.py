"""Soak: a steady rate through `kvtide serve` for ``--duration`` with one engine killed
(SIGKILL) mid-run and restarted on the same ports.

    python bench/soak.py [--duration 600] [--rate 10] [--engines 3] [--json out.json]

Every request must get its answer, or a clean error only where its first byte had already gone
(the gateway retries elsewhere before the first byte, never after): ``lost`` counts requests
that failed before any text arrived, ``hung`` those that hit the client's timeout. The
gateway's RSS is sampled every second; the slope (least squares over the second half of the
run, after warm-up) says whether memory is flat. Exits 1 when a request was lost or hung, or
the gateway does not count the restarted engine as up again at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvtide.cli.processes import (
    ProcessGroup,
    proc_rss_bytes,
    requests_served,
    start_engine,
    start_gateway,
    wait_all_ready,
)
from kvtide.gateway.config import GatewayConfig
from kvtide.loadgen import LoadConfig, run_load, schedule
from kvtide.text import smollm2
from kvtide.workloads import open_workload
from revision import git_rev

MODEL = "emu"


def gauge(url: str, name: str) -> float | None:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return None


def rss_slope_mib_per_min(samples: Sequence[tuple[float, int]]) -> float | None:
    """Least-squares slope of RSS over time, over the second half of the samples."""
    half = list(samples[len(samples) // 2 :])
    if len(half) < 3:
        return None
    t = np.array([s[0] for s in half])
    y = np.array([s[1] for s in half]) / 2**20
    return float(np.polyfit(t, y, 1)[0] * 60.0)


def classify(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = sum(r["error"] is None for r in rows)
    hung = sum(r["error"] == "timeout" for r in rows)
    # failed with no text received: the gateway should have retried it elsewhere
    lost = sum(r["error"] not in (None, "timeout") and r["ttft_s"] is None for r in rows)
    after_first_byte = sum(
        r["error"] not in (None, "timeout") and r["ttft_s"] is not None for r in rows
    )
    kinds: dict[str, int] = {}
    for r in rows:
        if r["error"] is not None:
            kinds[r["error"]] = kinds.get(r["error"], 0) + 1
    return {
        "requests": len(rows),
        "ok": ok,
        "lost": lost,
        "hung": hung,
        "clean_errors_after_first_byte": after_first_byte,
        "error_kinds": kinds,
    }


def soak(args: argparse.Namespace) -> dict[str, Any]:
    engine_args = ["--speedup", str(args.speedup), "--kv-cache-tokens", str(args.kv_cache_tokens)]
    gateway_args = [] if args.text_mode else ["--tokenizer", "smollm2"]
    if args.prefix_cache_tokens is not None:
        gateway_args += ["--prefix-cache-tokens", str(args.prefix_cache_tokens)]
    sessions = max(4, int(args.rate * args.duration / 4))
    spec = (
        f"builtin:chat:sessions={sessions},turns=4,duration_s={args.duration:g},"
        f"system_prompts=4,system_tokens=600,user_tokens=100,output_tokens={args.output_tokens},"
        f"think_s={max(1.0, args.duration / 20):g},max_prompt_tokens=4096"
    )
    workload = open_workload(spec, seed=args.seed)
    with ProcessGroup() as group:
        engines = [
            start_engine(group, MODEL, engine_args, f"engine {i}") for i in range(args.engines)
        ]
        wait_all_ready(engines)
        gw = start_gateway(group, engines, args.policy, gateway_args)
        config = LoadConfig(
            url=gw.url,
            model=MODEL,
            rate=args.rate,
            duration_s=args.duration,
            seed=args.seed,
            timeout_s=args.timeout,
        )
        plan = schedule(workload, config)
        victim = engines[0]
        events: dict[str, float] = {}
        rss: list[tuple[float, int]] = []
        start = time.monotonic()

        async def fault() -> None:
            await asyncio.sleep(args.duration * args.kill_at)
            events["killed_s"] = time.monotonic() - start
            await asyncio.to_thread(victim.process.kill)
            await asyncio.sleep(args.down_s)
            await asyncio.to_thread(victim.restart)
            events["restarted_s"] = time.monotonic() - start
            events["served_at_restart"] = await asyncio.to_thread(requests_served, victim.url)

        async def sample() -> None:
            while True:
                rss.append((time.monotonic() - start, proc_rss_bytes(gw.process.pid)))
                await asyncio.sleep(1.0)

        async def main() -> dict[str, Any]:
            sampler = asyncio.create_task(sample())
            faulter = asyncio.create_task(fault())
            try:
                report = await run_load(config, workload, smollm2(), None, plan)
                await faulter
            finally:
                sampler.cancel()
                faulter.cancel()
            return report

        report = asyncio.run(main())
        wall = time.monotonic() - start
        with urllib.request.urlopen(f"{gw.url}/ready", timeout=5) as resp:
            ready = json.loads(resp.read())
        victim_state = next(r for r in ready["replicas"] if r["url"] == victim.url)
        after = requests_served(victim.url) - events.get("served_at_restart", 0.0)
        prefix_cache = gauge(gw.url, "kvtide_gateway_prefix_cache_tokens")
        gateway_alive = gw.process.is_alive
    result = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rev": git_rev(),
        "wall_s": wall,
        **classify(report["requests"]),
        "not_sent": report["summary"]["not_sent"],
        **events,
        "restarted_engine_served_after": after,
        "restarted_engine_up_at_end": victim_state["up"],
        "gateway_alive_at_end": gateway_alive,
        "rss_mib": {
            "first": rss[0][1] / 2**20 if rss else None,
            "max": max(r for _, r in rss) / 2**20 if rss else None,
            "last": rss[-1][1] / 2**20 if rss else None,
            "slope_second_half_mib_per_min": rss_slope_mib_per_min(rss),
            "samples": len(rss),
        },
        "ttft_s": report["summary"]["ttft_s"],
        # RSS grows while the gateway's tokenization cache fills toward its bound
        "prefix_cache_tokens_at_end": prefix_cache,
        "prefix_cache_bound_tokens": GatewayConfig().prefix_cache_tokens
        if args.prefix_cache_tokens is None
        else args.prefix_cache_tokens,
    }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--rate", type=float, default=10.0, help="requests/s (Poisson)")
    p.add_argument("--engines", type=int, default=3)
    p.add_argument("--policy", default="cost")
    p.add_argument("--text-mode", action="store_true", help="gateway without --tokenizer")
    p.add_argument("--prefix-cache-tokens", type=int, help="the gateway's --prefix-cache-tokens")
    p.add_argument("--speedup", type=float, default=2.0)
    p.add_argument("--kv-cache-tokens", type=int, default=65_536)
    p.add_argument("--output-tokens", type=int, default=24)
    p.add_argument("--kill-at", type=float, default=0.4, help="fraction of --duration")
    p.add_argument("--down-s", type=float, default=3.0, help="seconds the engine stays dead")
    p.add_argument("--timeout", type=float, default=60.0, help="per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, dest="json_path")
    args = p.parse_args(argv)
    result = soak(args)
    print(json.dumps(result, indent=1))
    if args.json_path is not None:
        args.json_path.write_text(json.dumps(result, indent=1) + "\n")
    bad = result["lost"] or result["hung"] or not result["restarted_engine_up_at_end"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
