"""`kvtide demo`: N emulated engines and the gateway on loopback, one built-in multi-turn
workload through kvtide's policy and through round_robin, a live dashboard, the comparison.

Each router gets fresh engines (cold caches) and its own gateway, so both runs start alike.
Every process started is stopped by PID when the demo ends, fails or is interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from kvtide.cli._checks import check_writable, write_text
from kvtide.cli.processes import (
    Engine,
    ProcessGroup,
    start_engine,
    start_gateway,
    wait_all_ready,
)
from kvtide.loadgen import LoadConfig, run_load, schedule
from kvtide.quantities import duration, flag, integer, real
from kvtide.text import smollm2
from kvtide.workloads import open_workload

MODEL = "kvtide-demo"
ROUTERS = ("cost", "round_robin")
SCRAPE_S = 0.5


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "demo",
        help="emulated engines + the gateway on loopback: kvtide's routing against round_robin",
        description=(
            "Starts N emulated engines (kvtide engine) and the gateway (kvtide serve) on "
            "loopback, replays a built-in multi-turn chat workload through kvtide's cost policy "
            "and through round_robin (fresh engines for each), shows a live dashboard (hit "
            "ratio, TTFT, per-replica load, eviction velocity from the engines' /metrics) and "
            "prints the comparison. Stops every process it started, also on Ctrl-C."
        ),
    )
    p.add_argument(
        "--replicas", type=flag(integer, minimum=1, maximum=16), default=4, metavar="N",
        help="engines (default 4)",
    )  # fmt: skip
    p.add_argument(
        "--duration", type=flag(duration, minimum=1.0), default=30.0, metavar="S",
        help="seconds of load per router (default 30)",
    )  # fmt: skip
    p.add_argument(
        "--speedup", type=flag(real, above=0.0), default=1.0, metavar="X",
        help="engine timing model X times faster than an H100 (default 1)",
    )  # fmt: skip
    p.add_argument(
        "--kv-cache-tokens", type=flag(integer, minimum=1024), default=16_384, metavar="N",
        help="KV capacity per engine, small so that eviction shows (default 16384)",
    )  # fmt: skip
    p.add_argument("--seed", type=flag(integer, minimum=0), default=0, metavar="N")
    p.add_argument("--json", type=Path, metavar="FILE", dest="json_path", help="write the runs")
    p.add_argument("--quiet", action="store_true", help="no live dashboard")
    p.set_defaults(func=run)


def workload_spec(replicas: int, duration_s: float) -> str:
    """Chat sessions over four shared system prompts, sized to the fleet and the duration:
    about 8 sessions of 4 turns per replica, turns a tenth of the run apart."""
    sessions = 8 * replicas
    think = max(0.5, duration_s / 10)
    return (
        f"builtin:chat:sessions={sessions},turns=4,duration_s={duration_s * 0.9:g},"
        f"system_prompts=4,system_tokens=600,user_tokens=120,output_tokens=16,"
        f"think_s={think:g},max_prompt_tokens=4096"
    )


@dataclass
class EngineSample:
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    evicted_blocks: float = 0.0
    evictions_per_s: float = 0.0
    at: float = 0.0
    up: bool = False


ENGINE_SERIES: Mapping[str, str] = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "kvtide_engine_evicted_blocks_total": "evicted_blocks",
}
"""What the dashboard reads of an engine's /metrics: sample name -> key."""


def parse_engine_metrics(text: str, wanted: Mapping[str, str] = ENGINE_SERIES) -> dict[str, float]:
    """The samples named in ``wanted`` (default: the vLLM gauges and kvtide's eviction
    counter) from an engine's /metrics text, each summed over its label sets."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is not None:
                out[key] = out.get(key, 0.0) + float(sample.value)
    return out


@dataclass
class Progress:
    """What the dashboard shows of one run, updated as requests finish and scrapes arrive."""

    router: str
    planned: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    engines: dict[str, EngineSample] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def summary(self) -> dict[str, Any]:
        return summarize_run(self.router, self.rows)


def summarize_run(router: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r["error"] is None]
    ttfts = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    with_usage = [r for r in ok if r["prompt_tokens"] and r["cached_tokens"] is not None]
    prompt = sum(r["prompt_tokens"] for r in with_usage)
    cached = sum(r["cached_tokens"] for r in with_usage)
    return {
        "router": router,
        "requests": len(rows),
        "errors": len(rows) - len(ok),
        "cached_token_ratio": cached / prompt if prompt else None,
        "ttft_s": {
            "p50": float(np.percentile(ttfts, 50)) if ttfts else None,
            "p99": float(np.percentile(ttfts, 99)) if ttfts else None,
        },
    }


async def scrape(session: aiohttp.ClientSession, engines: list[Engine], progress: Progress) -> None:
    """Every SCRAPE_S: each engine's load, KV usage and eviction rate from its /metrics."""
    while True:
        for e in engines:
            prev = progress.engines.get(e.url, EngineSample())
            now = time.monotonic()
            try:
                async with session.get(
                    f"{e.url}/metrics", timeout=aiohttp.ClientTimeout(total=2.0)
                ) as resp:
                    values = parse_engine_metrics(await resp.text())
            except (aiohttp.ClientError, TimeoutError, ValueError):
                progress.engines[e.url] = EngineSample(at=now, up=False)
                continue
            sample = EngineSample(**values, at=now, up=True)
            if prev.up and now > prev.at:
                sample.evictions_per_s = max(0.0, sample.evicted_blocks - prev.evicted_blocks) / (
                    now - prev.at
                )
            progress.engines[e.url] = sample
        await asyncio.sleep(SCRAPE_S)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.0f} ms"


def dashboard(progress: Progress, done: list[dict[str, Any]]) -> Group:
    s = progress.summary()
    head = Table(title=f"kvtide demo - router {progress.router}", expand=False)
    for col in ("router", "done / planned", "errors", "cached-token ratio", "TTFT p50", "p99"):
        head.add_column(col, justify="right")
    for past in done:
        ttft = past["ttft_s"]
        head.add_row(
            past["router"], str(past["requests"]), str(past["errors"]),
            _pct(past["cached_token_ratio"]), _ms(ttft["p50"]), _ms(ttft["p99"]),
        )  # fmt: skip
    head.add_row(
        f"[bold]{progress.router}[/]", f"{s['requests']} / {progress.planned}", str(s["errors"]),
        _pct(s["cached_token_ratio"]), _ms(s["ttft_s"]["p50"]), _ms(s["ttft_s"]["p99"]),
    )  # fmt: skip
    engines = Table(title="engines (their /metrics)")
    for col in ("replica", "running", "waiting", "KV usage", "evictions (blocks/s)", "load"):
        engines.add_column(col, justify="right")
    for url, e in progress.engines.items():
        bar = "#" * int(min(20, e.running + e.waiting))
        engines.add_row(
            url.rsplit(":", 1)[-1] if e.up else f"{url.rsplit(':', 1)[-1]} (down)",
            f"{e.running:.0f}", f"{e.waiting:.0f}", _pct(e.kv_usage),
            f"{e.evictions_per_s:.0f}", bar,
        )  # fmt: skip
    return Group(head, engines)


async def interruptible(work: Awaitable[None]) -> None:
    """Awaits ``work``; a Ctrl-C meanwhile raises KeyboardInterrupt out of it, always.

    asyncio.run's own SIGINT handler only cancels the task. A cancellation absorbed anywhere
    under the load would let asyncio.run return normally, and the demo would go on to the next
    router (seen as an intermittent test_sigint_stops_every_child failure). So the handler is
    this one, and the flag, not the cancellation, says it was an interrupt.
    """
    loop = asyncio.get_running_loop()
    this = asyncio.current_task()
    assert this is not None
    interrupted = False

    def on_sigint() -> None:
        nonlocal interrupted
        interrupted = True
        this.cancel()

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    try:
        await work
    except asyncio.CancelledError:
        if not interrupted:
            raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)  # back to the default: KeyboardInterrupt
    if interrupted:
        raise KeyboardInterrupt


async def drive(
    url: str,
    engines: list[Engine],
    progress: Progress,
    config: LoadConfig,
    spec: str,
    live: Live | None,
    done: list[dict[str, Any]],
) -> None:
    workload = open_workload(spec, seed=config.seed)
    plan = schedule(workload, config)
    progress.planned = len(plan)
    tokenizer = smollm2()

    async def refresh() -> None:
        while True:
            if live is not None:
                live.update(dashboard(progress, done))
            await asyncio.sleep(0.25)

    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(scrape(session, engines, progress))]
        tasks.append(asyncio.create_task(refresh()))
        try:
            await run_load(config, workload, tokenizer, progress.rows.append, plan)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    if live is not None:
        live.update(dashboard(progress, done))


def run_router(
    router: str,
    args: argparse.Namespace,
    done: list[dict[str, Any]],
    console: Console,
) -> dict[str, Any]:
    engine_args = [
        "--speedup", f"{args.speedup:g}", "--kv-cache-tokens", str(args.kv_cache_tokens),
        "--seed", str(args.seed),
    ]  # fmt: skip
    spec = workload_spec(args.replicas, args.duration)
    with ProcessGroup() as group:
        console.print(f"[dim]starting {args.replicas} engines and the gateway ({router})...[/]")
        engines = [
            start_engine(group, MODEL, engine_args, f"engine {i}") for i in range(args.replicas)
        ]
        wait_all_ready(engines)
        gw = start_gateway(group, engines, router, ["--tokenizer", "smollm2"])
        config = LoadConfig(
            url=gw.url, model=MODEL, duration_s=args.duration, seed=args.seed, timeout_s=60.0
        )
        progress = Progress(router, 0)
        if args.quiet:
            asyncio.run(interruptible(drive(gw.url, engines, progress, config, spec, None, done)))
        else:
            with Live(dashboard(progress, done), console=console, refresh_per_second=4) as live:
                asyncio.run(
                    interruptible(drive(gw.url, engines, progress, config, spec, live, done))
                )
    return progress.summary()


def run(args: argparse.Namespace) -> int:
    check_writable(args.json_path, "--json")  # before the runs, not after them
    console = Console(stderr=True)
    done: list[dict[str, Any]] = []
    for router in ROUTERS:
        done.append(run_router(router, args, done, console))
    print_comparison(done)
    if args.json_path is not None:
        report = {
            "config": {
                "replicas": args.replicas,
                "duration_s": args.duration,
                "speedup": args.speedup,
                "kv_cache_tokens": args.kv_cache_tokens,
                "seed": args.seed,
                "workload": workload_spec(args.replicas, args.duration),
            },
            "runs": done,
        }
        write_text(args.json_path, json.dumps(report, indent=1) + "\n")
    return 0


def print_comparison(runs: list[dict[str, Any]]) -> None:
    print(f"{'router':<14}{'requests':>9}{'errors':>8}{'cached':>9}{'TTFT p50':>11}{'p99':>11}")
    for r in runs:
        print(
            f"{r['router']:<14}{r['requests']:>9}{r['errors']:>8}"
            f"{_pct(r['cached_token_ratio']):>9}{_ms(r['ttft_s']['p50']):>11}"
            f"{_ms(r['ttft_s']['p99']):>11}"
        )
    base, ours = runs[-1]["ttft_s"], runs[0]["ttft_s"]
    if base["p50"] and ours["p50"] and base["p99"] and ours["p99"]:
        print(
            f"{runs[0]['router']} / {runs[-1]['router']}: TTFT p50 x{ours['p50'] / base['p50']:.2f}"
            f", p99 x{ours['p99'] / base['p99']:.2f}"
        )
