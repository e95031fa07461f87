"""`kvtide sweep CONFIG.yaml`: a grid of simulations (policies x cache sizes x replica counts x
load ...), run in parallel processes or on a Ray cluster, one JSON or CSV row per point."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
from pathlib import Path

from rich.console import Console

from kvtide.cli._checks import JOBS, check_writable, write_text
from kvtide.cli.simulate import (
    run_with_progress,
    validate_names,
    warn,
)
from kvtide.cli.tables import Column, make_console, print_table
from kvtide.display import count, number, plural
from kvtide.errors import ConfigError
from kvtide.sim.scenario import RunResult, Scenario
from kvtide.sim.sweep import load_sweep, mean_over_keys, mean_rows, rows


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="run a grid of simulations from a YAML file",
        description=(
            "Expands CONFIG.yaml (a 'base' of fixed settings and a 'grid' of lists: any "
            "kvtide simulate setting, e.g. router, gpu_cache_tokens, replicas, load) into "
            "every combination, runs each point, and writes one row per point. "
            "examples/sweep.yaml in the repository shows the format."
        ),
    )
    parser.add_argument("config", type=Path, metavar="CONFIG.yaml")
    parser.add_argument(
        "--out", type=Path, metavar="FILE", help="rows as CSV (.csv) or JSON lines (.jsonl)"
    )
    parser.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="local processes (default) or an existing Ray cluster (the kvtide[ray] extra)",
    )
    parser.add_argument(
        "--ray-address", metavar="ADDR", help="Ray cluster address (default: auto-detect)"
    )
    parser.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        dest="json_path",
        help="the grid and every row as one JSON document",
    )
    parser.add_argument(
        "--mean-over",
        action="append",
        default=[],
        metavar="KEY",
        help=(
            "print the mean of each metric over this grid key (repeatable), one row per "
            "combination of the other keys, e.g. --mean-over seed; --out and --json keep "
            "every point"
        ),
    )
    parser.add_argument("--jobs", type=JOBS, default=min(2, os.cpu_count() or 1), metavar="N")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_writable(args.json_path, "--json")  # before the grid runs (hours, maybe), not after
    if args.out is not None:
        check_writable(args.out, "--out")
        format_rows([], args.out.suffix.lower())  # an unknown format, before any run
    points = load_sweep(args.config)
    keys = list(points[0].values) if points else []
    over = mean_over_keys(keys, args.mean_over)  # a key not in the grid, before any run
    scenarios = [p.scenario for p in points]
    for scenario in dict.fromkeys(scenarios):
        validate_names([scenario.router], scenario.eviction)
    console = make_console()
    warn(list(dict.fromkeys(w for p in points for w in p.warnings)))
    console.print(f"sweep: {plural(len(points), 'point')} from {args.config}")
    results = execute(scenarios, args, console)
    skipped = sum(int(r.diagnostics.get("skipped_requests", 0)) for r in results)
    if skipped:
        longer = "longer than a replica's whole KV pool skipped"
        warn([f"{plural(skipped, 'request')} {longer}"])
    table_rows = rows(points, results)
    metrics = [
        (Column("TTFT\np50"), "ttft_p50_s", ".3f"),
        (Column("TTFT\np99"), "ttft_p99_s", ".3f"),
        (Column("TPOT\np50"), "tpot_p50_s", ".4f"),
        (Column("hit\nratio"), "hit_ratio", ".1%"),
        (Column("imbal-\nance"), "load_imbalance", ".2f"),
    ]
    shown, title, shown_keys = table_rows, "one row per point; times in seconds", keys
    if over:
        shown = mean_rows(table_rows, keys, over)
        shown_keys = [k for k in keys if k not in over] + ["points"]
        title = f"means over {', '.join(over)}; times in seconds"
    cells = [
        [
            *(_cell(r[k]) for k in shown_keys),
            *(number(_float(r[k]), spec) for _, k, spec in metrics),
        ]
        for r in shown
    ]
    header = [Column(k.replace("_", " ")) for k in shown_keys]
    print_table(console, title, header, [c for c, *_ in metrics], cells)
    if args.out is not None:
        write_text(args.out, format_rows(table_rows, args.out.suffix.lower()))
    if args.json_path is not None:
        doc: dict[str, object] = {"config": str(args.config), "grid": keys, "rows": table_rows}
        if over:
            doc["mean_over"] = over
            doc["means"] = shown
        write_text(args.json_path, json.dumps(doc, indent=2) + "\n")
    return 0


def _cell(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int) and abs(value) >= 1000:
        return count(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def execute(
    scenarios: list[Scenario], args: argparse.Namespace, console: Console
) -> list[RunResult]:
    if args.executor == "ray":
        try:
            from kvtide.sim.ray_executor import run_on_ray
        except ImportError as exc:
            raise ConfigError("--executor ray needs Ray: pip install 'kvtide[ray]'") from exc
        return run_on_ray(scenarios, args.ray_address or "auto")
    labels = [f"point {i + 1}" for i in range(len(scenarios))]
    return run_with_progress(scenarios, args.jobs, console, quiet=args.quiet, labels=labels)


def format_rows(table_rows: list[dict[str, object]], suffix: str) -> str:
    if suffix == ".csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(table_rows[0]) if table_rows else [])
        writer.writeheader()
        writer.writerows(table_rows)
        return out.getvalue()
    if suffix in (".jsonl", ".json"):
        return "".join(json.dumps(r) + "\n" for r in table_rows)
    raise ConfigError(f"--out: unknown format {suffix!r}; use .csv or .jsonl")
