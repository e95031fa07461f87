"""`kvtide study coordinator`: a global index (centralized, with event lag and a coordinator
outage) against local hashing and approximate state, under uniform and skewed traffic.
`kvtide study tiers`: how large a host (and disk) tier the fleet needs, and what filtering
host writes costs."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from kvtide.cli._checks import JOBS, check_writable, write_text
from kvtide.cli.simulate import (
    add_fleet_arguments,
    check_from_args,
    run_with_progress,
    scenario_from_args,
    warn,
)
from kvtide.cli.tables import Column, make_console, print_table
from kvtide.cli.tiers_study import register_tiers
from kvtide.display import DASH, points, seconds, signed
from kvtide.sim.scenario import describe_tiers
from kvtide.sim.settings import flag_type
from kvtide.sim.study import DEFAULT_TRAFFIC, study_points, study_rows


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("study", help="trade-off studies run on the simulator")
    studies = parser.add_subparsers(dest="study", metavar="STUDY", required=True)
    coordinator = studies.add_parser(
        "coordinator",
        help="global index vs local hashing vs approximate state",
        description=(
            "Runs a centralized global index (precise and cost routing fed by KV events: "
            "fresh, stale, and with the coordinator down for the middle third of the run), "
            "bounded-load consistent hashing (no shared state) and approximate per-router "
            "state, under uniform and skewed traffic, and reports hit ratio, TTFT p50/p99, "
            "load imbalance, and what each design loses against a fresh global index."
        ),
    )
    add_fleet_arguments(coordinator, with_workload=False)
    coordinator.set_defaults(replicas=8, load=0.7, gpu_cache_tokens=65_536)
    coordinator.add_argument(
        "--uniform",
        default=DEFAULT_TRAFFIC["uniform"],
        metavar="SPEC",
        help="the uniform-traffic workload (default: 8 equal tenants)",
    )
    coordinator.add_argument(
        "--skewed",
        default=DEFAULT_TRAFFIC["skewed"],
        metavar="SPEC",
        help="the skewed-traffic workload (default: 8 Zipf(1.5) tenants, one bursting)",
    )
    coordinator.add_argument(
        "--lag",
        type=flag_type("event_delay_s"),
        default=1.0,
        metavar="S",
        help="event lag of the stale index (1 s)",
    )
    coordinator.add_argument(
        "--loss",
        type=flag_type("event_loss"),
        default=0.01,
        metavar="P",
        help="event batch loss of the stale index (0.01)",
    )
    coordinator.add_argument("--json", type=Path, metavar="FILE", dest="json_path")
    coordinator.add_argument("--jobs", type=JOBS, default=min(2, os.cpu_count() or 1), metavar="N")
    coordinator.add_argument("--quiet", action="store_true", help="no progress bar")
    coordinator.set_defaults(func=run_coordinator, workload="builtin:tenants")
    register_tiers(studies)


def run_coordinator(args: argparse.Namespace) -> int:
    base = scenario_from_args(args)
    traffic = {"uniform": args.uniform, "skewed": args.skewed}
    check_writable(args.json_path, "--json")
    console = make_console()
    for spec in traffic.values():
        warn(check_from_args(base.with_(workload=spec), args))
    points = study_points(base, traffic, args.lag, args.loss)
    pace = f"load {base.load:g}" if base.load is not None else f"gaps × {base.time_scale:g}"
    console.print(
        f"coordinator study: {base.replicas} × {base.model} on {base.tp} × {base.gpu}; "
        f"KV per replica: {describe_tiers(base)}; {pace}, seed {base.seed}"
    )
    results = run_with_progress(
        [p.scenario for p in points],
        args.jobs,
        console,
        quiet=args.quiet,
        labels=[f"{p.traffic} {p.design.router} {p.design.state}" for p in points],
    )
    rows = study_rows(points, results)
    for label in traffic:
        print_rows(console, label, traffic[label], [r for r in rows if r["traffic"] == label])
    for line in findings(rows):
        console.print(f"• {line}")
    if args.json_path is not None:
        doc = {"traffic": traffic, "lag_s": args.lag, "loss": args.loss, "rows": rows}
        write_text(args.json_path, json.dumps(doc, indent=2) + "\n")
    return 0


def print_rows(console: Console, label: str, spec: str, rows: Sequence[dict[str, Any]]) -> None:
    columns = [
        Column("hit\nratio", "hits"),
        Column("hit change\n(points)", "hits"),
        Column("TTFT\np50", "ttft"),
        Column("TTFT\np99", "ttft"),
        Column("p99\nchange", "ttft"),
        Column("imbal-\nance", "fleet"),
        Column("index\nprecision", "index"),
        Column("batches\nlost", "index"),
    ]
    cells = []
    for r in rows:
        precision = r["index_precision"]
        loss = r["hit_ratio_loss_points"]
        cells.append(
            [
                r["design"],
                r["state"],
                f"{r['hit_ratio']:.1%}",
                DASH if loss is None else signed(-loss, ".1f"),
                f"{r['ttft_p50_s']:.3f}",
                f"{r['ttft_p99_s']:.3f}",
                DASH if r["ttft_p99_change"] is None else signed(r["ttft_p99_change"], ".0%"),
                f"{r['load_imbalance']:.2f}",
                f"{precision:.2f}" if precision is not None and r["router"] != "chash" else DASH,
                f"{int(r['event_batches_lost']):,}",
            ]
        )
    title = f"{label} traffic ({spec}); changes against a fresh precise index"
    print_table(console, title, [Column("design"), Column("state")], columns, cells)


def findings(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Plain sentences on what each design loses, computed from the rows."""
    out = []
    for traffic in dict.fromkeys(r["traffic"] for r in rows):
        group = {(r["router"], r["state"]): r for r in rows if r["traffic"] == traffic}
        fresh = group.get(("precise", "fresh"))
        if fresh is None:
            continue
        for (router, state), r in group.items():
            if (router, state) == ("precise", "fresh"):
                continue
            hits = points(-r["hit_ratio_loss_points"], against="a fresh global index")
            change = r["ttft_p99_change"]
            p99 = DASH if change is None else signed(change, ".0%")
            out.append(
                f"{traffic}: {router} ({state}) holds {r['hit_ratio']:.1%} hits ({hits}), "
                f"TTFT p99 {seconds(r['ttft_p99_s'])} ({p99}), "
                f"imbalance {r['load_imbalance']:.2f}"
            )
    return out
