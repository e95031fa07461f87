"""`kvtide simulate`: replay a workload through a simulated fleet, one run per router, and
compare them in one table (the main job: with no arguments it runs a built-in workload)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from kvtide.cli._checks import JOBS, check_writable, write_text
from kvtide.cli.tables import Column, make_console
from kvtide.cli.tables import print_table as print_table_fitted
from kvtide.clock import ManualClock
from kvtide.core.admission import ADMISSION_FILTERS
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.costs.specs import GPU_PRESETS, MODEL_PRESETS
from kvtide.display import DASH, applies, number, plural, seconds
from kvtide.engine.scheduler import SCHEDULING_POLICIES, EngineConfig
from kvtide.errors import ConfigError
from kvtide.quantities import flag, items, text
from kvtide.routing import GlobalPrefixIndex, RoutingContext
from kvtide.routing.specs import build_policy, needs_index, policy_names
from kvtide.sim.metrics import RunSummary
from kvtide.sim.parallel import run_many
from kvtide.sim.report import write_report
from kvtide.sim.scenario import (
    DEFAULT_EVICTION,
    RunResult,
    Scenario,
    check_scenario,
    describe_setup,
    describe_tiers,
    prepare,
)
from kvtide.sim.settings import flag_name, flag_type, outage

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
        type=flag(items, parse=text),
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
        type=JOBS,
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
    parser.add_argument(
        "--requests", type=flag_type("requests"), metavar="N", help="use only the first N requests"
    )
    parser.add_argument(
        "--block-tokens",
        type=flag_type("block_tokens"),
        metavar="N",
        help="cache block size in tokens (default: the workload's own, 512 for Mooncake)",
    )
    parser.add_argument(
        "--replicas", type=flag_type("replicas"), default=4, metavar="N", help="(default 4)"
    )
    parser.add_argument(
        "--decode-replicas",
        type=flag_type("decode_replicas"),
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
        "--scheduling-policy",
        default="fcfs",
        choices=SCHEDULING_POLICIES,
        help="the engines' waiting queue, as vLLM's flag: fcfs, or priority by the priority "
        "the router sets (cost:deadline_k=K) (default fcfs)",
    )
    parser.add_argument(
        "--eviction",
        default=DEFAULT_EVICTION,
        metavar="P",
        help=f"eviction policy (default {DEFAULT_EVICTION})",
    )
    parser.add_argument(
        "--gpu-cache-tokens",
        type=flag_type("gpu_cache_tokens"),
        action=_Given,
        default=262_144,
        metavar="N",
        help="KV capacity per replica in tokens; k, M, G are 10^3, 10^6, 10^9 and Ki, Mi, Gi "
        "2^10, 2^20, 2^30, e.g. 256Ki or 1M (default 262,144 = 256Ki)",
    )
    parser.add_argument(
        "--host-cache-tokens",
        type=flag_type("host_cache_tokens"),
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
        type=flag_type("disk_cache_tokens"),
        default=0,
        metavar="N",
        help="disk KV tier per replica in tokens, under the host tier (default 0: none)",
    )
    parser.add_argument(
        "--model",
        default="llama-3-8b",
        metavar="M",
        help=f"model preset ({', '.join(sorted(MODEL_PRESETS))}) or a path to a Hugging Face "
        "config.json (default llama-3-8b)",
    )
    parser.add_argument(
        "--gpu",
        default="h100",
        metavar="G",
        help=f"GPU preset: {', '.join(sorted(GPU_PRESETS))} (default h100)",
    )
    parser.add_argument(
        "--tp", type=flag_type("tp"), default=1, metavar="N", help="tensor parallel (1)"
    )
    parser.add_argument(
        "--max-batched-tokens",
        type=flag_type("max_batched_tokens"),
        default=EngineConfig().max_batched_tokens,
        metavar="N",
        help="engine token budget per iteration (chunked prefill)",
    )
    parser.add_argument(
        "--time-scale",
        type=flag_type("time_scale"),
        action=_Given,
        default=1.0,
        metavar="X",
        help="multiply inter-arrival gaps by X (2 = half the rate)",
    )
    parser.add_argument(
        "--load",
        type=flag_type("load"),
        action=_Given,
        metavar="X",
        help="rescale arrivals so the offered prefill work (no cache hits) is X of the "
        f"fleet's prefill capacity (replaces --time-scale; default {DEFAULT_BUILTIN_LOAD} for "
        "built-in workloads, traces keep their own pace)",
    )
    parser.add_argument(
        "--event-delay",
        type=flag_type("event_delay_s"),
        default=0.0,
        metavar="S",
        help="KV event lag, seconds (or 500ms, 2s)",
    )
    parser.add_argument(
        "--event-loss",
        type=flag_type("event_loss"),
        default=0.0,
        metavar="P",
        help="KV event loss, 0 to 1 (below 1)",
    )
    parser.add_argument(
        "--outage",
        type=flag(outage),
        action="append",
        default=[],
        metavar="R:START[:END]",
        help="replica R is down from START to END seconds after the first arrival (repeatable)",
    )
    parser.add_argument(
        "--seed", type=flag_type("seed"), default=0, metavar="N", help="(default 0)"
    )


class _Given(argparse.Action):
    """Stores the value and notes that the flag was given (``args.given``): a default that
    does not fit is an error, a value the user chose may be meant."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.given = getattr(namespace, "given", frozenset()) | {self.dest}


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    """The scenario the flags describe; refuses what can be refused before reading anything."""
    load = args.load
    given: frozenset[str] = getattr(args, "given", frozenset())
    is_builtin = args.workload.split(":", 1)[0] == "builtin"
    if "time_scale" in given and load is not None:
        if "load" in given:
            raise ConfigError(
                "--load and --time-scale: give either a load or a time scale, not both"
            )
        load = None  # a command's default load gives way to the time scale the user chose
    if load is None and "time_scale" not in given and is_builtin:
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
        outages=tuple(args.outage),
        decode_replicas=args.decode_replicas,
        kv_transfer=args.kv_transfer,
        engine=EngineConfig(
            max_batched_tokens=args.max_batched_tokens,
            prefill_only=args.prefill_only,
            scheduling_policy=args.scheduling_policy,
        ),
    )


def run(args: argparse.Namespace) -> int:
    base = scenario_from_args(args)
    routers = args.router
    validate_names(routers, base.eviction)
    check_writable(args.json_path, "--json")
    check_writable(args.report, "--report", directory=True)
    console = make_console()
    warnings = check_from_args(base, args)
    prepared = prepare(base)  # validates the workload and model before any process starts
    scenarios = [base.with_(router=r) for r in routers]
    warn([*warnings, *prepared.skipped])
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


def check_from_args(scenario: Scenario, args: argparse.Namespace) -> list[str]:
    """``check_scenario`` with the flags' names; its warnings."""
    given = "gpu_cache_tokens" in getattr(args, "given", frozenset())
    return check_scenario(scenario, flag_name, kv_given=given)


def warn(lines: Sequence[str]) -> None:
    """One unwrapped line per warning on stderr (a path in it must stay whole)."""
    for line in lines:
        print(f"kvtide: warning: {line}", file=sys.stderr)


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


def describe(console: Console, scenario: Scenario, workload: dict[str, Any]) -> None:
    console.print(
        f"[bold]{workload['name']}[/bold]: {plural(int(workload['requests']), 'request')} over "
        f"{seconds(float(workload['span_s']))}, prompts {workload['prompt_tokens_mean']:,.0f} "
        f"tokens and outputs {workload['output_tokens_mean']:,.0f} on average, "
        f"{_load(float(workload['offered_load']))}"
    )
    disagg = f" + {scenario.decode_replicas} decode" if scenario.decode_replicas else ""
    console.print(
        f"{scenario.replicas}{disagg} × {scenario.model} on {scenario.tp} × {scenario.gpu}; "
        f"KV per replica: {describe_tiers(scenario)}; {workload['block_tokens']}-token blocks, "
        f"eviction {scenario.eviction}, seed {scenario.seed}"
    )


def _load(offered: float) -> str:
    if math.isfinite(offered):
        return f"offered load {offered:.2f}"
    return "all at one instant (no offered load)"  # a trace whose rows share one timestamp


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
    names = labels if labels is not None else [s.router for s in scenarios]
    width = max((len(name) for name in names), default=0)  # whole names, in one column
    with Progress(
        TextColumn(f"{{task.description:<{width}}}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        tasks: list[TaskID] = [bar.add_task(name, total=1.0) for name in names]

        def update(position: int, fraction: float) -> None:
            bar.update(tasks[position], completed=fraction)

        return run_many(scenarios, jobs, update)


_TIERS = ("device", "host", "disk")


def print_table(console: Console, results: Sequence[RunResult]) -> None:
    """One row per run; with lower tiers, the hit ratio of every tier and their sum."""
    tiers = [t for t in _TIERS if any(t in r.summary.hit_ratio_by_tier for r in results)]
    hit = "hit ratio\nall tiers" if len(tiers) > 1 else "hit\nratio"
    metrics: list[tuple[Column, Callable[[RunSummary], float], str, bool]] = [
        (Column("TTFT\nmean", "ttft"), lambda s: s.ttft_s.mean, ".3f", False),
        (Column("TTFT\np50", "ttft"), lambda s: s.ttft_s.p50, ".3f", False),
        (Column("TTFT\np99", "ttft"), lambda s: s.ttft_s.p99, ".3f", False),
        (Column("TPOT\np50", "decode"), lambda s: s.tpot_s.p50, ".4f", False),
        (Column("E2E\np50", "decode"), lambda s: s.e2e_s.p50, ".2f", False),
        (Column(hit, "hits"), lambda s: s.hit_ratio, ".1%", True),
    ]
    if len(tiers) > 1:
        metrics += [
            (Column(f"{tier}\nhits", "hits"), _tier_hits(tier), ".1%", True) for tier in tiers
        ]
    metrics += [
        (Column("tok/s", "fleet"), lambda s: s.throughput_tok_s, ",.0f", True),
        (Column("imbal-\nance", "fleet"), lambda s: s.load_imbalance, ".2f", False),
        (Column("evict/s", "fleet"), lambda s: s.evictions_per_s, ",.0f", False),
        (
            Column("prefill\nMtok", "fleet"),
            lambda s: s.prefill_tokens_computed / 1e6,
            ",.2f",
            False,
        ),
    ]
    rows = []
    for result in results:
        cells = [result.summary.router]
        for _, get, spec, higher in metrics:
            value = get(result.summary)
            text = number(value, spec)
            others = [get(r.summary) for r in results if applies(get(r.summary))]
            best = (max if higher else min)(others) if others else None
            is_best = len(results) > 1 and applies(value) and value == best
            cells.append(f"[bold]{text}[/bold]" if is_best else text)
        rows.append(cells)
    notes = ["times in seconds; the best of each column in bold"]
    if len(tiers) > 1:
        notes.append(f"hits by tier add up to all tiers ({' + '.join(tiers)})")
    if any(not applies(r.summary.tpot_s.p50) for r in results):
        notes.append(f"{DASH}: does not apply (no request decoded past its first token)")
    print_table_fitted(
        console, "runs", [Column("router")], [m[0] for m in metrics], rows, caption="; ".join(notes)
    )
    unserved = sum(r.unserved for r in results)
    if unserved:
        console.print(f"[yellow]{plural(unserved, 'request')} found no healthy replica[/yellow]")


def _tier_hits(tier: str) -> Callable[[RunSummary], float]:
    return lambda s: s.hit_ratio_by_tier.get(tier, 0.0)
