"""`kvtide profile`: the fragmentation profile of a workload in the simulated fleet, and the
block-size comparison (waste against hit ratio against index memory and per-block cost)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from kvtide.cli._checks import check_writable, write_text
from kvtide.cli.simulate import add_fleet_arguments, scenario_from_args
from kvtide.cli.tables import Column, make_console, print_table
from kvtide.quantities import flag, integer, items, text
from kvtide.routing.specs import policy_names
from kvtide.sim.fragmentation import FragmentationReport, profile
from kvtide.sim.scenario import RunResult, prepare

DEFAULT_SIZES = "8,16,32,64,128"
DEFAULT_ROUTER = "precise"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="fragmentation profile of a workload and a block-size comparison",
        description=(
            "Runs a workload through the simulated fleet (the same engine and cache code as "
            "kvtide simulate) with a probe on every replica's KV pool, and prints internal "
            "waste (partial last blocks, slots reserved ahead and not written), external "
            "fragmentation of the free list and what it costs host-tier copies in the cost "
            "model, duplicated blocks and replication across replicas; then the same run at "
            "each block size of --block-sizes."
        ),
    )
    add_fleet_arguments(parser)
    parser.add_argument(
        "--router",
        type=flag(text),
        default=DEFAULT_ROUTER,
        metavar="P",
        help=f"routing policy (default {DEFAULT_ROUTER}; valid: {', '.join(policy_names())})",
    )
    parser.add_argument(
        "--block-sizes",
        type=flag(items, parse=integer, minimum=1),
        default=DEFAULT_SIZES,
        metavar="N[,N...]",
        help=f"block sizes to compare, tokens (default {DEFAULT_SIZES}; empty: none)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", dest="json_path", help="write JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    base = scenario_from_args(args).with_(router=args.router)
    check_writable(args.json_path, "--json")
    sizes: list[int] = list(dict.fromkeys(args.block_sizes))
    console = make_console()
    prepared = prepare(base)  # validates workload, model and router names before any run
    main_bt = prepared.block_tokens
    result, report = profile(base, prepared)
    print_report(console, base.workload, result, report)
    rows: list[tuple[RunResult, FragmentationReport]] = []
    for bt in sizes:
        rows.append((result, report) if bt == main_bt else profile(base.with_(block_tokens=bt)))
    if rows:
        print_sizes(console, rows)
    if args.json_path is not None:
        doc: dict[str, Any] = {
            "workload": prepared.description,
            "router": base.router,
            "gpu_cache_tokens": base.gpu_cache_tokens,
            "replicas": base.replicas,
            "profile": {**report.to_dict(), **_run_numbers(result)},
            "block_sizes": [{**f.to_dict(), **_run_numbers(r)} for r, f in rows],
        }
        write_text(args.json_path, json.dumps(doc, indent=2) + "\n")
    return 0


def _run_numbers(r: RunResult) -> dict[str, float]:
    s = r.summary
    return {"hit_ratio": s.hit_ratio, "ttft_p99_s": s.ttft_s.p99, "requests": s.requests}


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def print_report(
    console: Console, workload: str, result: RunResult, f: FragmentationReport
) -> None:
    s = result.summary
    lines = [
        ("workload", workload),
        ("requests", f"{s.requests:,}"),
        ("block size", f"{f.block_tokens} tokens"),
        ("pool per replica", f"{f.capacity_blocks:,.0f} blocks, {_pct(f.used_share)} in use"),
        ("hit ratio", _pct(s.hit_ratio)),
        ("internal waste: partial last blocks", f"{_pct(f.partial_waste_share)} of used slots"),
        ("internal waste: reserved, not written", f"{_pct(f.reserved_waste_share)} of used slots"),
        (
            "duplicated blocks (same content twice)",
            f"{_pct(f.duplicated_share)} of used blocks (0 by construction: shared on insert)",
        ),
        (
            "prefix prefilled twice at once",
            f"{_pct(f.shared_prefill_share)} of prefilled prompt blocks",
        ),
        ("free list: runs per 100 free blocks", f"{f.free_runs_per_100_free:.2f}"),
        ("free list: largest run", f"{_pct(f.largest_free_run_share)} of free blocks"),
        (
            f"a {f.copy_blocks}-block allocation",
            f"{f.copy_runs:.2f} runs; host copy x{f.copy_cost_ratio:.2f} the contiguous time",
        ),
        ("one block alone to host", f"{1e6 * f.block_copy_s:.1f} us"),
        (
            "replication across replicas",
            f"x{f.replication_factor:.2f}; {_pct(f.replicated_share)} of distinct blocks on 2+",
        ),
        ("prefix index", f"{f.index_bytes_per_block:.0f} B per cached block"),
        ("snapshots", f"{f.snapshots:,} (every replica, evenly spaced in simulated time)"),
    ]
    print_table(
        console,
        "fragmentation profile",
        [Column("what", left=True)],
        [Column("value", left=True)],
        [list(x) for x in lines],
        caption="shares are means over the snapshots; replication and index at the end",
    )


def print_sizes(console: Console, rows: list[tuple[RunResult, FragmentationReport]]) -> None:
    cells = []
    for r, f in rows:
        cells.append(
            [
                str(f.block_tokens),
                _pct(r.summary.hit_ratio),
                _pct(f.partial_waste_share),
                _pct(f.reserved_waste_share),
                _pct(f.shared_prefill_share),
                f"{f.free_runs_per_100_free:.1f}",
                f"x{f.copy_cost_ratio:.2f}",
                f"{1e6 * f.block_copy_s:.1f}",
                f"{f.index_bytes_per_block:.0f}",
                f"{f.cached_blocks_end * f.index_bytes_per_block / 2**20:.2f}",
                f"{r.summary.ttft_s.p99:.3f}",
            ]
        )
    print_table(
        console,
        "block sizes",
        [Column("block\ntokens")],
        [
            Column("hit\nratio"),
            Column("partial\nwaste", "waste"),
            Column("reserved\nwaste", "waste"),
            Column("twice\nat once", "waste"),
            Column("free runs\n/100 free", "free"),
            Column("copy\ncost", "free"),
            Column("1 block\nhost us", "cost"),
            Column("index\nB/block", "index"),
            Column("index\nMiB", "index"),
            Column("TTFT\np99 s"),
        ],
        cells,
        caption="waste: of used slots (of prefilled blocks for twice at once); copy cost: "
        "host copy of a mean "
        "prompt's blocks from the free list over one contiguous copy; index: fleet, at the end",
    )
