"""`kvtide study tiers`: the fleet at several host tier sizes, with and without a filter on host
writes, and over a disk tier; hit ratio by tier, TTFT, and the write bandwidth each costs."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from kvtide.cli._checks import JOBS, check_writable, write_text
from kvtide.cli.simulate import (
    add_fleet_arguments,
    check_from_args,
    run_with_progress,
    scenario_from_args,
    validate_names,
    warn,
)
from kvtide.cli.tables import Column, make_console, print_table
from kvtide.display import DASH, plural, signed, tokens
from kvtide.quantities import flag, items, real
from kvtide.sim.scenario import check_scenario, prepare
from kvtide.sim.settings import flag_name
from kvtide.sim.tier_study import (
    DEFAULT_DISK_MULTIPLE,
    DEFAULT_HOST_MULTIPLES,
    TierRow,
    tier_designs,
    tier_findings,
    tier_rows,
    tier_scenarios,
)

MAX_MULTIPLE = 1024.0
"""Tier sizes beyond a thousand GPU caches are no design anyone deploys."""


def register_tiers(studies: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = studies.add_parser(
        "tiers",
        help="host and disk tier sizes, and a filter on host writes",
        description=(
            "Runs the fleet with a host tier per replica at several multiples of its GPU "
            "cache, each unfiltered and with the seen-twice filter on host writes, then the "
            "largest host over a disk tier; reports the hit ratio by tier, TTFT, host and disk "
            "write bandwidth, and what the filter costs against the same tiers unfiltered. "
            "--host-cache-tokens, --host-admission and --disk-cache-tokens are set by the study."
        ),
    )
    add_fleet_arguments(parser)
    parser.set_defaults(replicas=4, load=0.7, gpu_cache_tokens=65_536)
    parser.add_argument(
        "--router", default="cost", metavar="P", help="routing policy of the fleet (cost)"
    )
    parser.add_argument(
        "--host-multiples",
        type=flag(items, parse=real, minimum=0.0, maximum=MAX_MULTIPLE),
        default=",".join(f"{m:g}" for m in DEFAULT_HOST_MULTIPLES),
        metavar="X[,X...]",
        help="host tier sizes as multiples of the GPU cache (default 0,1,2,4,8)",
    )
    parser.add_argument(
        "--disk-multiple",
        type=flag(real, minimum=0.0, maximum=MAX_MULTIPLE),
        default=DEFAULT_DISK_MULTIPLE,
        metavar="X",
        help=f"disk tier under the largest host, × GPU cache (default {DEFAULT_DISK_MULTIPLE:g}; "
        "0: none)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", dest="json_path")
    parser.add_argument("--jobs", type=JOBS, default=min(2, os.cpu_count() or 1), metavar="N")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run_tiers)


def run_tiers(args: argparse.Namespace) -> int:
    base = scenario_from_args(args).with_(router=args.router)
    validate_names([base.router], base.eviction)
    check_writable(args.json_path, "--json")
    designs = tier_designs(args.host_multiples, args.disk_multiple)
    scenarios = tier_scenarios(base, designs)
    console = make_console()
    warnings = check_from_args(base, args)
    for design, scenario in zip(designs, scenarios, strict=True):
        check_scenario(scenario, functools.partial(_tier_name, label=design.label))
    prepared = prepare(base)  # validates the workload and model before any process starts
    warn([*warnings, *prepared.skipped])
    console.print(
        f"tier study: {base.workload} ({plural(len(prepared.requests), 'request')}), "
        f"{base.replicas} × {base.model} on {base.tp} × {base.gpu}; KV per replica: "
        f"GPU {tokens(base.gpu_cache_tokens)} + the tiers of each row; router {base.router}, "
        f"load {base.load}, seed {base.seed}"
    )
    results = run_with_progress(
        scenarios, args.jobs, console, quiet=args.quiet, labels=[d.label for d in designs]
    )
    rows = tier_rows(designs, scenarios, results)
    print_rows(console, rows)
    for line in tier_findings(rows):
        console.print(f"• {line}")
    if args.json_path is not None:
        doc = {
            "workload": base.workload,
            "gpu_cache_tokens": base.gpu_cache_tokens,
            "rows": [dataclasses.asdict(r) for r in rows],
        }
        write_text(args.json_path, json.dumps(doc, indent=2) + "\n")
    return 0


def _tier_name(key: str, label: str) -> str:
    """A tier pool is sized by --host-multiples / --disk-multiple, not by its own flag."""
    flags = {"host_cache_tokens": "--host-multiples", "disk_cache_tokens": "--disk-multiple"}
    return f"{flags[key]} ({label})" if key in flags else flag_name(key)


def print_rows(console: Console, rows: Sequence[TierRow]) -> None:
    columns = [
        Column("hit ratio\nall tiers", "hits"),
        Column("device\nhits", "hits"),
        Column("host\nhits", "hits"),
        Column("disk\nhits", "hits"),
        Column("TTFT\np50", "ttft"),
        Column("TTFT\np99", "ttft"),
        Column("host\nGB/s", "writes"),
        Column("disk\nGB/s", "writes"),
        Column("writes\ncut", "filter"),
        Column("hit change\n(points)", "filter"),
    ]
    cells = []
    for r in rows:
        by_tier = r.hit_ratio_by_tier
        loss = r.filter_hit_loss_points
        cells.append(
            [
                r.design,
                f"{r.hit_ratio:.1%}",
                f"{by_tier.get('device', 0.0):.1%}",
                f"{by_tier['host']:.1%}" if "host" in by_tier else DASH,
                f"{by_tier['disk']:.1%}" if "disk" in by_tier else DASH,
                f"{r.ttft_p50_s:.3f}",
                f"{r.ttft_p99_s:.3f}",
                f"{r.host_write_gb_per_s:.2f}" if r.host_tokens else DASH,
                f"{r.disk_write_gb_per_s:.2f}" if r.disk_tokens else DASH,
                DASH if r.filter_write_cut is None else f"{r.filter_write_cut:.0%}",
                DASH if loss is None else signed(-loss, ".2f"),
            ]
        )
    print_table(
        console,
        "tiers per replica; the filter's changes against the same tiers unfiltered",
        [Column("tiers")],
        columns,
        cells,
    )
    console.print(
        f"times in seconds; hits by tier add up to all tiers; GB/s: KV written per simulated "
        f"second, all replicas; {DASH}: does not apply"
    )
