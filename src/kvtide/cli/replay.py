"""`kvtide replay`: a trace or a built-in workload through one cache per (policy, capacity).

Prints token and block hit ratios, evictions, misses by class and, with ``--oracle``, the share
of Belady's optimum each run reaches; ``--json FILE`` writes the same numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kvtide import __version__
from kvtide.cli import _tiers_args as tiers_cli
from kvtide.cli._checks import JOBS, check_writable, write_text
from kvtide.cli.simulate import warn
from kvtide.cli.tables import Column, make_console, print_table
from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.eviction import POLICIES
from kvtide.core.hashing import BlockHashes, Namespace, request_block_hashes
from kvtide.core.oracle import Oracle
from kvtide.core.tiers import TieredCache
from kvtide.display import DASH, plural, tokens
from kvtide.errors import ConfigError
from kvtide.quantities import flag, items, text
from kvtide.quantities import tokens as token_count
from kvtide.sim.settings import check_pools, flag_type
from kvtide.workloads import DEFAULT_BUILTIN, open_workload
from kvtide.workloads.oversized import OversizedRequests

DEFAULT_CAPACITY = "100000,300000,1000000"
DEFAULT_POLICIES = "lru,s3fifo,tide"
_PROGRESS_EVERY = 1000  # requests between progress updates inside one run


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="replay a trace or built-in workload through the cache: hit ratios per policy",
        description=(
            "Replays a trace or a built-in workload through one cache per (policy, capacity) "
            "and prints token and block hit ratios, evictions, misses by class and, with "
            "--oracle, the share of Belady's optimum each run reaches."
        ),
    )
    parser.add_argument(
        "workload",
        nargs="?",
        default=f"builtin:{DEFAULT_BUILTIN}",
        metavar="TRACE|builtin:NAME",
        help=f"a trace file or builtin:NAME[:key=val,...] (default builtin:{DEFAULT_BUILTIN})",
    )
    parser.add_argument(
        "--block-tokens",
        type=flag_type("block_tokens"),
        metavar="N",
        help="cache block size in tokens (default: the workload's own, 512 for Mooncake)",
    )
    parser.add_argument(
        "--capacity",
        type=flag(items, parse=token_count, minimum=1),
        default=DEFAULT_CAPACITY,
        metavar="N[,N...]",
        help=f"cache capacities in tokens; k, M, G are 10^3, 10^6, 10^9, Ki, Mi, Gi 2^10, "
        f"2^20, 2^30 (default {DEFAULT_CAPACITY})",
    )
    parser.add_argument(
        "--policy",
        type=flag(items, parse=text, choices=frozenset(POLICIES)),
        default=DEFAULT_POLICIES,
        metavar="P[,P...]",
        help=f"eviction policies: {', '.join(sorted(POLICIES))} (default {DEFAULT_POLICIES})",
    )
    parser.add_argument(
        "--oracle", action="store_true", help="also run Belady's optimum at each capacity"
    )
    parser.add_argument(
        "--requests", type=flag_type("requests"), metavar="N", help="replay only the first N"
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    parser.add_argument(
        "--tenant-salt",
        action="store_true",
        help="hash each tenant in its own namespace (tenants then never share a block)",
    )
    parser.add_argument(
        "--seed", type=flag_type("seed"), default=0, help="seed of built-in workloads"
    )
    parser.add_argument(
        "--jobs",
        type=JOBS,
        default=min(2, os.cpu_count() or 1),
        metavar="N",
        help="runs in parallel processes (default: up to 2)",
    )
    tiers_cli.add_tier_arguments(parser)
    parser.set_defaults(func=run)


# --- the workload, hashed once -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prepared:
    """Every request's full-block hashes, packed, with what the cache needs besides."""

    raw: bytes
    offsets: np.ndarray[Any, np.dtype[np.int64]]
    prompt_tokens: np.ndarray[Any, np.dtype[np.int64]]
    arrival_s: np.ndarray[Any, np.dtype[np.float64]]
    tenants: tuple[str, ...]
    shadow_raw: bytes | None
    block_tokens: int
    skipped: tuple[str, ...] = ()
    """One line per request left out for being longer than the smallest capacity."""

    @property
    def num_requests(self) -> int:
        return len(self.prompt_tokens)

    def hashes(self, i: int) -> BlockHashes:
        return BlockHashes(self.raw[self.offsets[i] << 3 : self.offsets[i + 1] << 3])

    def all_hashes(self) -> Iterator[BlockHashes]:
        return (self.hashes(i) for i in range(self.num_requests))

    def shadow(self, i: int) -> BlockHashes | None:
        if self.shadow_raw is None:
            return None
        return BlockHashes(self.shadow_raw[self.offsets[i] << 3 : self.offsets[i + 1] << 3])


def prepare(
    spec: str,
    *,
    block_tokens: int | None,
    limit: int | None,
    seed: int,
    tenant_salt: bool,
    progress: Callable[[int], None] = lambda n: None,
    oversized: OversizedRequests | None = None,
) -> Prepared:
    """Hashes every request once; ``oversized`` leaves out (and names) those that cannot fit."""
    workload = open_workload(spec, block_tokens=block_tokens, limit=limit, seed=seed)
    bt = block_tokens or workload.block_tokens
    plain_seed = Namespace().seed
    seeds: dict[str, int] = {}
    raws: list[bytes] = []
    shadows: list[bytes] = []
    lengths: list[int] = []
    prompts: list[int] = []
    arrivals: list[float] = []
    tenants: list[str] = []
    for position, request in enumerate(workload):
        if oversized is not None and not oversized.keep(position, request):
            continue
        plain = request_block_hashes(request, bt, plain_seed)
        if tenant_salt:
            seed_t = seeds.get(request.tenant)
            if seed_t is None:
                seed_t = seeds[request.tenant] = Namespace(tenant_salt=request.tenant.encode()).seed
            raws.append(request_block_hashes(request, bt, seed_t).raw)
            shadows.append(plain.raw)
        else:
            raws.append(plain.raw)
        lengths.append(len(plain))
        prompts.append(request.prompt_tokens)
        arrivals.append(request.arrival_s)
        tenants.append(request.tenant)
        if len(prompts) % _PROGRESS_EVERY == 0:
            progress(_PROGRESS_EVERY)
    progress(len(prompts) % _PROGRESS_EVERY)
    skipped = tuple(oversized.report(workload)) if oversized is not None else ()
    if not prompts:
        if skipped:
            example = skipped[0].removesuffix("; skipped")
            raise ConfigError(f"every request is too long, as the first: {example}")
        raise ConfigError(f"{spec}: the workload has no requests")
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Prepared(
        raw=b"".join(raws),
        offsets=offsets,
        prompt_tokens=np.asarray(prompts, dtype=np.int64),
        arrival_s=np.asarray(arrivals, dtype=np.float64),
        tenants=tuple(tenants),
        shadow_raw=b"".join(shadows) if tenant_salt else None,
        block_tokens=bt,
        skipped=skipped,
    )


# --- one run -----------------------------------------------------------------------------


def replay_one(
    data: Prepared,
    policy: str,
    capacity_tokens: int,
    progress: Callable[[int], None] = lambda n: None,
    tiers: argparse.Namespace | None = None,
) -> dict[str, Any]:
    """Replays every request through a fresh cache; the result row of the JSON report."""
    bt = data.block_tokens
    clock = ManualClock()
    cache: KVCache | TieredCache = KVCache(
        CacheConfig(capacity_blocks=capacity_tokens // bt, block_tokens=bt, policy=policy), clock
    )
    if tiers is not None and tiers_cli.has_tiers(tiers):
        cache = tiers_cli.build_cache(
            tiers,
            capacity_blocks=capacity_tokens // bt,
            block_tokens=bt,
            policy=policy,
            clock=clock,
        )
    start = time.perf_counter()
    arrivals = data.arrival_s.tolist()
    prompts = data.prompt_tokens.tolist()
    for i in range(data.num_requests):
        if arrivals[i] > clock.now():
            clock.set(arrivals[i])
        cache.access(
            data.hashes(i), prompts[i], tenant=data.tenants[i], shadow_hashes=data.shadow(i)
        )
        if (i + 1) % _PROGRESS_EVERY == 0:
            progress(_PROGRESS_EVERY)
    progress(data.num_requests % _PROGRESS_EVERY)
    wall_s = time.perf_counter() - start
    s = cache.stats().device if isinstance(cache, TieredCache) else cache.stats()
    row = {
        "policy": policy,
        "capacity_tokens": capacity_tokens,
        "capacity_blocks": cache.capacity_blocks,
        "hit_ratio": s.hit_ratio,
        "block_hit_ratio": s.block_hit_ratio,
        "hit_tokens": s.hit_tokens,
        "prompt_tokens": s.prompt_tokens,
        "evictions": s.evicted_blocks,
        "inserted_blocks": s.inserted_blocks,
        "pct_of_optimum": None,
        "miss_tokens": {
            "cold": s.miss_tokens_cold,
            "evicted": s.miss_tokens_evicted,
            "other_namespace": s.miss_tokens_other_namespace,
            "partial": s.miss_tokens_partial,
        },
        "wall_s": wall_s,
        "us_per_request": 1e6 * wall_s / data.num_requests,
    }
    if isinstance(cache, TieredCache):
        # The misses above are the device's: device hits plus them make every prompt token.
        row["device_hit_tokens"] = s.hit_tokens
        row.update(tiers_cli.tier_report(cache))
    return row


_WORKER_DATA: Prepared | None = None
_WORKER_TIERS: argparse.Namespace | None = None


def _init_worker(data: Prepared, tiers: argparse.Namespace | None) -> None:
    global _WORKER_DATA, _WORKER_TIERS
    _WORKER_DATA, _WORKER_TIERS = data, tiers


def _replay_in_worker(policy: str, capacity_tokens: int) -> dict[str, Any]:
    assert _WORKER_DATA is not None
    return replay_one(_WORKER_DATA, policy, capacity_tokens, tiers=_WORKER_TIERS)


# --- the command -------------------------------------------------------------------------


def check_args(args: argparse.Namespace) -> int:
    """Everything the flags fix before the trace is read: output path, pools against the
    block size, the tiers' cost model and policies. Returns the block size."""
    check_writable(args.json, "--json")
    bt = args.block_tokens or open_workload(args.workload).block_tokens
    for capacity in (min(args.capacity), max(args.capacity)):
        sizes = {
            "gpu_cache_tokens": capacity,
            "host_cache_tokens": args.host_capacity,
            "disk_cache_tokens": args.disk_capacity,
        }
        check_pools(sizes, bt, _POOL_FLAGS.__getitem__)
    tiers_cli.check_tier_args(args)  # even unused without tiers: a wrong name is a mistake
    return bt


_POOL_FLAGS = {
    "gpu_cache_tokens": "--capacity",
    "host_cache_tokens": "--host-capacity",
    "disk_cache_tokens": "--disk-capacity",
}


def run(args: argparse.Namespace) -> int:
    capacities: list[int] = args.capacity
    policies: list[str] = args.policy
    bt = check_args(args)
    smallest = min(capacities) // bt * bt
    oversized = OversizedRequests(smallest, bt, False, f"smallest --capacity ({smallest:,} tokens)")
    err = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        reading = bar.add_task("hashing requests", total=args.requests)
        data = prepare(
            args.workload,
            block_tokens=args.block_tokens,
            limit=args.requests,
            seed=args.seed,
            tenant_salt=args.tenant_salt,
            progress=lambda n: bar.advance(reading, n),
            oversized=oversized,
        )
        bar.remove_task(reading)
        warn(data.skipped)
        grid = [(p, c) for p in policies for c in capacities]
        task = bar.add_task("replaying", total=len(grid) * data.num_requests)
        runs = _run_grid(data, grid, args.jobs, lambda n: bar.advance(task, n), args)
        oracle_rows: list[dict[str, Any]] = []
        infinite = None
        if args.oracle:
            bar.update(task, description="Belady's optimum")
            oracle = Oracle(data.all_hashes())
            total = int(data.prompt_tokens.sum())
            infinite = oracle.infinite_hit_blocks * bt / total
            for cap in capacities:
                result = oracle.run(cap // bt)
                oracle_rows.append(
                    {
                        "capacity_tokens": cap,
                        "hit_ratio": result.hit_blocks * bt / total,
                        "block_hit_ratio": result.block_hit_ratio,
                        "evictions": result.evicted_blocks,
                    }
                )
    best = {row["capacity_tokens"]: row["hit_ratio"] for row in oracle_rows}
    for row in runs:
        opt = best.get(row["capacity_tokens"])
        if opt:
            # Belady's optimum is one cache of the device's size: compare the device's hits.
            own = (
                row["device_hit_tokens"] / row["prompt_tokens"]
                if "device_hit_tokens" in row
                else row["hit_ratio"]
            )
            row["pct_of_optimum"] = 100.0 * own / opt
    _print_table(args.workload, data, runs, oracle_rows)
    if args.json is not None:
        report = {
            "kvtide": __version__,
            "workload": args.workload,
            "block_tokens": bt,
            "requests": data.num_requests,
            "skipped_requests": len(oversized.skipped),
            "prompt_tokens": int(data.prompt_tokens.sum()),
            "seed": args.seed,
            "tenant_salt": args.tenant_salt,
            "infinite_hit_ratio": infinite,
            "runs": runs,
            "oracle": oracle_rows,
        }
        write_text(args.json, json.dumps(report, indent=2) + "\n")
    return 0


def _run_grid(
    data: Prepared,
    grid: Sequence[tuple[str, int]],
    jobs: int,
    progress: Callable[[int], None],
    tiers: argparse.Namespace | None = None,
) -> list[dict[str, Any]]:
    if jobs == 1 or len(grid) == 1:
        return [replay_one(data, p, c, progress, tiers) for p, c in grid]
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    with ProcessPoolExecutor(
        max_workers=min(jobs, len(grid)),
        mp_context=get_context("spawn"),
        initializer=_init_worker,
        initargs=(data, tiers),
    ) as pool:
        futures = {pool.submit(_replay_in_worker, p, c): (p, c) for p, c in grid}
        for future in as_completed(futures):
            rows[futures[future]] = future.result()
            progress(data.num_requests)
    return [rows[key] for key in grid]


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _print_table(
    spec: str, data: Prepared, runs: list[dict[str, Any]], oracle: list[dict[str, Any]]
) -> None:
    """Hits and misses add up to 100%: every tier's hits, then the device's misses, with the
    lower tiers' hits shown as the part of those misses they served."""
    total = int(data.prompt_tokens.sum())
    tiered = any("device_hit_tokens" in r for r in runs)
    other_ns = any(r["miss_tokens"]["other_namespace"] for r in runs)
    miss = "dev. miss" if tiered else "miss"
    columns = [Column("token hit\nall tiers" if tiered else "token\nhit", "hits")]
    if tiered:
        columns += [Column(f"{tier}\nhit", "hits") for tier in ("device", "host", "disk")]
    columns += [Column(f"{miss}\n{kind}", "misses") for kind in ("cold", "evicted", "partial")]
    if other_ns:
        columns.append(Column(f"{miss}\nother ns", "misses"))
    columns += [
        Column("block hit\nall tiers" if tiered else "block\nhit", "blocks"),
        Column("evictions", "blocks"),
        Column("device %\nof optimum" if tiered else "% of\noptimum", "blocks"),
    ]
    if tiered:
        columns += [Column("host\nwrites", "tiers"), Column("prefill s\nsaved", "tiers")]
    ordered: list[tuple[str, dict[str, Any]]] = []
    for cap in dict.fromkeys(r["capacity_tokens"] for r in runs):
        ordered += [(r["policy"], r) for r in runs if r["capacity_tokens"] == cap]
        ordered += [("optimum", r) for r in oracle if r["capacity_tokens"] == cap]
    rows = []
    for name, r in ordered:
        rows.append([name, f"{r['capacity_tokens']:,}", *_cells(r, total, tiered, other_ns)])
    sections = [
        i + 1 < len(ordered) and ordered[i + 1][1]["capacity_tokens"] != r["capacity_tokens"]
        for i, (_, r) in enumerate(ordered)
    ]
    console = make_console()
    title = (
        f"{spec}: {plural(data.num_requests, 'request')}, "
        f"{plural(total, 'prompt token')}, {data.block_tokens}-token blocks"
    )
    tiered_row = next((r for r in runs if "device_hit_tokens" in r), None)
    if tiered_row is not None:
        sizes = tiered_row["capacity_tokens_by_tier"]
        lower = " + ".join(f"{t} {tokens(sizes[t])}" for t in ("host", "disk") if t in sizes)
        title += f"; tiers: device (the capacity column) + {lower}, {tiered_row['write_mode']}"
    print_table(
        console,
        title,
        [Column("policy"), Column("capacity")],
        columns,
        rows,
        sections=sections,
    )
    if tiered:
        console.print(
            "Hits of every tier add up to the token hit ratio; device hit + device (dev.) "
            "misses = 100%: the host and disk hits are device misses those tiers served. "
            f"The optimum is Belady's on the device alone. {DASH}: does not apply."
        )
    else:
        console.print(f"token hit + misses = 100% of prompt tokens. {DASH}: does not apply.")


def _cells(r: dict[str, Any], total: int, tiered: bool, other_ns: bool) -> list[str]:
    """One row's cells after policy and capacity (an optimum row has no misses or tiers)."""
    misses = r.get("miss_tokens")
    by_tier = r.get("hit_ratio_by_tier")
    is_optimum = misses is None
    if tiered:
        # The optimum is a device-only cache: its hits sit under "device".
        hits = [DASH if is_optimum else _pct(r["hit_ratio"])]
        hits += [
            _pct(r["hit_ratio"])
            if is_optimum and tier == "device"
            else DASH
            if by_tier is None
            else _pct(by_tier[tier])
            for tier in ("device", "host", "disk")
        ]
    else:
        hits = [_pct(r["hit_ratio"])]
    kinds = ["cold", "evicted", "partial", *(["other_namespace"] if other_ns else [])]
    miss_cells = [DASH if misses is None else _pct(misses[k] / total) for k in kinds]
    pct = r.get("pct_of_optimum")
    cells = [
        *hits,
        *miss_cells,
        _pct(r["block_hit_ratio"]),
        f"{r['evictions']:,}",
        DASH if pct is None else f"{pct:.1f}",
    ]
    if tiered:
        cells += [
            DASH if is_optimum else f"{r['host_writes_blocks']:,}",
            DASH if is_optimum else f"{r['prefill_s_saved']:,.1f}",
        ]
    return cells
