"""`kvtide simulate`: replay a workload through a simulated fleet, one run per router, and
compare them in one table (the main job: with no arguments it runs a built-in workload)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvtide.clock import ManualClock
from kvtide.core.admission import ADMISSION_FILTERS
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.engine.scheduler import EngineConfig
from kvtide.errors import ConfigError
from kvtide.routing import GlobalPrefixIndex, RoutingContext
from kvtide.routing.specs import build_policy, needs_index, policy_names
from kvtide.sim.fleet import Outage
from kvtide.sim.parallel import run_many
from kvtide.sim.report import write_report
from kvtide.sim.scenario import (
    DEFAULT_EVICTION,
    RunResult,
    Scenario,
    describe_setup,
    prepare,
)

DEFAULT_ROUTERS = "round_robin,least_load,chash,precise,cost"
DEFAULT_WORKLOAD = "builtin:mixed"
DEFAULT_BUILTIN_LOAD = 1.5
"""Built-ins replay at this offered load unless told otherwise: prefill work that would be 1.5x
the fleet's capacity with no cache, so what routing does to the hit ratio decides the tail."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="replay a workload through a simulated fleet and compare routers",
        description=(
            "Replays a workload (a built-in generator or a trace) through N simulated engine "
            "replicas that use kvtide's own cache, eviction and routing code, once per router, "
            "and prints TTFT, TPOT, end-to-end latency, hit ratio, throughput and load "
            "imbalance side by side. With no arguments: a built-in mix of chat, agent, RAG and "
            "bursty traffic on 4 replicas, at an offered load the fleet survives only by its "
            "prefix cache."
        ),
    )
    add_fleet_arguments(parser)
    parser.add_argument(
        "--router",
        default=DEFAULT_ROUTERS,
        metavar="P[,P...]",
        help=f"routing policies to compare, each NAME[:key=value...] (default "
        f"{DEFAULT_ROUTERS}; valid: {', '.join(policy_names())})",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", dest="json_path", help="write JSON")
    parser.add_argument(
        "--report", type=Path, metavar="DIR", help="write an HTML report with plots to DIR"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        metavar="N",
        help="runs in parallel processes (default: 2, or 1 on one core)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def add_fleet_arguments(parser: argparse.ArgumentParser, *, with_workload: bool = True) -> None:
    """Workload, model and fleet flags shared by `simulate` and `study`."""
    if with_workload:
        parser.add_argument(
            "--workload",
            default=DEFAULT_WORKLOAD,
            metavar="SPEC",
            help=f"builtin:NAME[:key=val,...] or a trace path (default {DEFAULT_WORKLOAD})",
        )
    parser.add_argument("--requests", type=int, metavar="N", help="use only the first N requests")
    parser.add_argument(
        "--block-tokens",
        type=int,
        metavar="N",
        help="cache block size in tokens (default: the workload's own, 512 for Mooncake)",
    )
    parser.add_argument("--replicas", type=int, default=4, metavar="N", help="(default 4)")
    parser.add_argument(
        "--decode-replicas",
        type=int,
        default=0,
        metavar="N",
        help="disaggregate: the routed replicas only prefill, N more decode (default 0)",
    )
    parser.add_argument(
        "--kv-transfer",
        action="store_true",
        help="global KV pool: fetch a longer cached prefix from another replica over the "
        "network instead of recomputing it (Mooncake's global cache)",
    )
    parser.add_argument(
        "--prefill-only",
        action="store_true",
        help="simulate a disaggregated prefill pool alone: requests end at their first token",
    )
    parser.add_argument(
        "--eviction",
        default=DEFAULT_EVICTION,
        metavar="P",
        help=f"eviction policy (default {DEFAULT_EVICTION})",
    )
    parser.add_argument(
        "--gpu-cache-tokens",
        type=_tokens,
        default=262_144,
        metavar="N",
        help="KV capacity per replica in tokens, e.g. 256k or 1M (default 256k)",
    )
    parser.add_argument(
        "--host-cache-tokens",
        type=_tokens,
        default=0,
        metavar="N",
        help="host-memory KV tier per replica in tokens (default 0: none)",
    )
    parser.add_argument(
        "--host-admission",
        default="none",
        choices=sorted(ADMISSION_FILTERS),
        help="filter on writes into the host tier; seen-twice skips blocks requested once "
        "(default none)",
    )
    parser.add_argument(
        "--disk-cache-tokens",
        type=_tokens,
        default=0,
        metavar="N",
        help="disk KV tier per replica in tokens, under the host tier (default 0: none)",
    )
    parser.add_argument("--model", default="llama-3-8b", metavar="M", help="(default llama-3-8b)")
    parser.add_argument("--gpu", default="h100", metavar="G", help="(default h100)")
    parser.add_argument("--tp", type=int, default=1, metavar="N", help="tensor parallel (1)")
    parser.add_argument(
        "--max-batched-tokens",
        type=int,
        default=EngineConfig().max_batched_tokens,
        metavar="N",
        help="engine token budget per iteration (chunked prefill)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="multiply inter-arrival gaps by X (2 = half the rate)",
    )
    parser.add_argument(
        "--load",
        type=float,
        metavar="X",
        help="rescale arrivals so the offered prefill work (no cache hits) is X of the "
        f"fleet's prefill capacity (replaces --time-scale; default {DEFAULT_BUILTIN_LOAD} for "
        "built-in workloads, traces keep their own pace)",
    )
    parser.add_argument(
        "--event-delay", type=float, default=0.0, metavar="S", help="KV event lag, seconds"
    )
    parser.add_argument(
        "--event-loss", type=float, default=0.0, metavar="P", help="KV event loss, 0 to 1"
    )
    parser.add_argument(
        "--outage",
        action="append",
        default=[],
        metavar="R:START[:END]",
        help="replica R is down from START to END seconds after the first arrival (repeatable)",
    )
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="(default 0)")


def _tokens(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    raw = text.strip().lower()
    scale = units.get(raw[-1:], 1)
    try:
        value = float(raw[:-1] if scale > 1 else raw) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a token count: {text!r}") from None
    return int(value)


def parse_outage(text: str) -> Outage:
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        end = float(parts[2]) if len(parts) == 3 else None
        return Outage(int(parts[0]), float(parts[1]), end)
    except ValueError:
        raise ConfigError(f"--outage {text!r}: expected REPLICA:START[:END]") from None


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    if args.replicas < 1:
        raise ConfigError("--replicas must be >= 1")
    if args.requests is not None and args.requests < 1:
        raise ConfigError("--requests must be >= 1")
    load = args.load
    is_builtin = args.workload.split(":", 1)[0] == "builtin"
    if load is None and args.time_scale == 1.0 and is_builtin:
        load = DEFAULT_BUILTIN_LOAD
    return Scenario(
        workload=args.workload,
        requests=args.requests,
        block_tokens=args.block_tokens,
        time_scale=args.time_scale,
        load=load,
        seed=args.seed,
        model=args.model,
        gpu=args.gpu,
        tp=args.tp,
        replicas=args.replicas,
        eviction=args.eviction,
        gpu_cache_tokens=args.gpu_cache_tokens,
        host_cache_tokens=args.host_cache_tokens,
        host_admission=args.host_admission,
        disk_cache_tokens=args.disk_cache_tokens,
        event_delay_s=args.event_delay,
        event_loss=args.event_loss,
        outages=tuple(parse_outage(o) for o in args.outage),
        decode_replicas=args.decode_replicas,
        kv_transfer=args.kv_transfer,
        engine=EngineConfig(
            max_batched_tokens=args.max_batched_tokens, prefill_only=args.prefill_only
        ),
    )


def run(args: argparse.Namespace) -> int:
    base = scenario_from_args(args)
    routers = [r.strip() for r in args.router.split(",") if r.strip()]
    if not routers:
        raise ConfigError("--router needs at least one policy")
    validate_names(routers, base.eviction)
    prepared = prepare(base)  # validates the workload and model before any process starts
    scenarios = [base.with_(router=r) for r in routers]
    console = make_console()
    describe(console, base, prepared.description)
    results = run_with_progress(scenarios, args.jobs, console, quiet=args.quiet)
    print_table(console, results)
    document = simulation_json(base, prepared.description, results)
    if args.json_path is not None:
        write_text(args.json_path, json.dumps(document, indent=2) + "\n")
    if args.report is not None:
        path = write_report(args.report, base, prepared.description, results)
        console.print(f"report: {path}")
    return 0


def validate_names(routers: Sequence[str], eviction: str) -> None:
    """Fails fast, in this process, on a router or eviction policy that does not exist."""
    for name in routers:
        index = GlobalPrefixIndex(16) if needs_index(name) else None
        build_policy(name, RoutingContext(clock=ManualClock(), index=index))
    KVCache(CacheConfig(1, policy=eviction), ManualClock())


def simulation_json(
    scenario: Scenario, workload: dict[str, object], results: Sequence[RunResult]
) -> dict[str, Any]:
    return {
        "workload": {**workload, "setup": describe_setup(scenario)},
        "runs": [r.summary.to_json() for r in results],
    }


def make_console() -> Console:
    """A console whose tables are not squeezed to 80 columns when stdout is a file."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else 150)


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write: {exc.strerror or exc}") from exc


def describe(console: Console, scenario: Scenario, workload: dict[str, Any]) -> None:
    console.print(
        f"[bold]{workload['name']}[/bold]: {workload['requests']:,} requests over "
        f"{workload['span_s']:,.0f} s, prompts {workload['prompt_tokens_mean']:,.0f} tokens "
        f"and outputs {workload['output_tokens_mean']:,.0f} on average, offered load "
        f"{workload['offered_load']:.2f}"
    )
    disagg = f" + {scenario.decode_replicas} decode" if scenario.decode_replicas else ""
    console.print(
        f"{scenario.replicas}{disagg} × {scenario.model} on {scenario.tp} × {scenario.gpu}, "
        f"{scenario.gpu_cache_tokens:,} KV tokens each, {workload['block_tokens']}-token "
        f"blocks, eviction {scenario.eviction}, seed {scenario.seed}"
    )


def run_with_progress(
    scenarios: Sequence[Scenario],
    jobs: int,
    console: Console,
    *,
    quiet: bool = False,
    labels: Sequence[str] | None = None,
) -> list[RunResult]:
    if quiet:
        return run_many(scenarios, jobs)
    with Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        names = labels if labels is not None else [s.router for s in scenarios]
        tasks: list[TaskID] = [bar.add_task(name, total=1.0) for name in names]

        def update(position: int, fraction: float) -> None:
            bar.update(tasks[position], completed=fraction)

        return run_many(scenarios, jobs, update)


def print_table(console: Console, results: Sequence[RunResult]) -> None:
    table = Table(title="times in seconds; best of each column in bold")
    columns: list[tuple[str, Callable[[RunResult], float], str, bool]] = [
        ("TTFT mean", lambda r: r.summary.ttft_s.mean, "{:.3f}", False),
        ("TTFT p50", lambda r: r.summary.ttft_s.p50, "{:.3f}", False),
        ("TTFT p99", lambda r: r.summary.ttft_s.p99, "{:.3f}", False),
        ("TPOT p50", lambda r: r.summary.tpot_s.p50, "{:.4f}", False),
        ("E2E p50", lambda r: r.summary.e2e_s.p50, "{:.2f}", False),
        ("hit ratio", lambda r: r.summary.hit_ratio, "{:.1%}", True),
        ("tok/s", lambda r: r.summary.throughput_tok_s, "{:,.0f}", True),
        ("imbalance", lambda r: r.summary.load_imbalance, "{:.2f}", False),
        ("evict/s", lambda r: r.summary.evictions_per_s, "{:,.0f}", False),
        ("prefill Mtok", lambda r: r.summary.prefill_tokens_computed / 1e6, "{:,.2f}", False),
    ]
    table.add_column("router", no_wrap=True)
    for name, *_ in columns:
        table.add_column(name, justify="right", no_wrap=True)
    best = {
        name: (max if higher else min)(get(r) for r in results) for name, get, _, higher in columns
    }
    for result in results:
        cells = []
        for name, get, fmt, _ in columns:
            text = fmt.format(get(result))
            cells.append(
                f"[bold]{text}[/bold]" if len(results) > 1 and get(result) == best[name] else text
            )
        table.add_row(result.summary.router, *cells)
    console.print(table)
    unserved = sum(r.unserved for r in results)
    if unserved:
        console.print(f"[yellow]{unserved} request(s) found no healthy replica[/yellow]")
