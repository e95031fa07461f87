"""Routers over many windows of a Mooncake-format trace, simulated, each window sized as
``bench/gateways.py`` sizes its live Mooncake run.

    python bench/trace_windows.py --trace ../shared/traces/mooncake_conversation.jsonl \
        --router cost:deadline_k=10 --router peer_sglang [--windows 24] [--json out.json]

One live run of 500 requests gives a TTFT p99 that is its five slowest requests: a single
burst decides it, and runs of the same gateway differ by 10-20%. This bench asks the question
on many windows instead (requests 0-499, 500-999, ...): each one's timestamps start at 0, its
prompts longer than ``--max-model-len`` are left out and its outputs capped at
``--max-output-tokens`` (as the live bench does), and its engines get the KV and the pace the
live bench would give them (``gateways.workload_plans``: half the KV the window reuses, its
offered prefill 0.8 of the fleet's). Every router runs on every window through ``kvtide
simulate``'s scenario (the same cache, engine and routing code as the gateway). Printed per
router: medians over the windows of TTFT p50 and p99, hit ratio and TPOT p50, and against
``--reference`` (default: the last router) the geometric mean of the per-window ratios and
in how many windows it does better.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import gateways
from kvtide.cli.simulate import validate_names
from kvtide.engine.scheduler import EngineConfig
from kvtide.errors import KvtideError
from kvtide.sim.parallel import run_many
from kvtide.sim.scenario import Scenario
from kvtide.workloads.registry import detect_format
from revision import git_rev

BLOCK_TOKENS = 16  # the emulated engines' block in the live bench


def windows(args: argparse.Namespace, out_dir: Path) -> list[dict[str, Any]]:
    """Writes each window's requests to ``out_dir``; returns (file, KV per engine, time scale)."""
    lines = [ln for ln in args.trace.read_text().splitlines() if ln.strip()]
    made = []
    for w in range(args.windows):
        start = args.first + w * args.window_requests
        rows = [json.loads(ln) for ln in lines[start : start + args.window_requests]]
        rows = [r for r in rows if r["input_length"] + args.max_output_tokens <= args.max_model_len]
        if len(rows) < 2:
            break
        t0 = rows[0]["timestamp"]
        path = out_dir / f"w{start}.jsonl"
        path.write_text(
            "".join(
                json.dumps(
                    r
                    | {
                        "timestamp": r["timestamp"] - t0,
                        "output_length": min(r["output_length"], args.max_output_tokens),
                    }
                )
                + "\n"
                for r in rows
            )
        )
        live = argparse.Namespace(**vars(args) | {"trace": path, "workloads": "mooncake"})
        sizing = gateways.workload_plans(live)["mooncake"].sizing
        made.append(
            {
                "start": start,
                "file": str(path),
                "gpu_cache_tokens": sizing["kv_tokens_per_engine"],
                # the arrivals' scale x the engines' slowdown: the live run's pace on the
                # simulator's clock (gateways.size_engines)
                "time_scale": sizing["time_scale"] * sizing["speedup"],
            }
        )
    return made


def summarize(results: dict[str, list[dict[str, Any]]], reference: str) -> dict[str, Any]:
    ref = results[reference]
    r50, r99, rhit = _col(ref, "ttft_s", "p50"), _col(ref, "ttft_s", "p99"), _col(ref, "hit_ratio")
    out = {}
    for router, runs in results.items():
        p50, p99, hit = (
            _col(runs, "ttft_s", "p50"),
            _col(runs, "ttft_s", "p99"),
            _col(runs, "hit_ratio"),
        )
        out[router] = {
            "ttft_p50_s": statistics.median(p50),
            "ttft_p99_s": statistics.median(p99),
            "hit_ratio": statistics.median(hit),
            "tpot_p50_s": statistics.median(_col(runs, "tpot_s", "p50")),
            "p50_ratio": _gmean([a / b for a, b in zip(p50, r50, strict=True)]),
            "p99_ratio": _gmean([a / b for a, b in zip(p99, r99, strict=True)]),
            "wins_p50": sum(a < b for a, b in zip(p50, r50, strict=True)),
            "wins_p99": sum(a < b for a, b in zip(p99, r99, strict=True)),
            "wins_hits": sum(a > b for a, b in zip(hit, rhit, strict=True)),
        }
    return out


def _col(runs: list[dict[str, Any]], key: str, q: str | None = None) -> list[float]:
    """One number of every window's run: ``run[key]``, or ``run[key][q]`` for a quantile."""
    return [r[key][q] if q else r[key] for r in runs]


def _gmean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", type=Path, required=True, help="a Mooncake-format JSONL trace")
    p.add_argument("--router", action="append", required=True, help="repeatable: NAME[:k=v...]")
    p.add_argument("--reference", help="the router the others are compared with (default: last)")
    p.add_argument("--windows", type=int, default=24)
    p.add_argument("--window-requests", type=int, default=500)
    p.add_argument("--first", type=int, default=0, help="the first window's first request")
    p.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="priority")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", type=Path, dest="json_path")
    # the live bench's sizing, at its defaults (bench/gateways.py's flags)
    live = gateways.parser().parse_args([])
    for dest in (
        "trace_duration",
        "max_output_tokens",
        "max_model_len",
        "engines",
        "kv_fraction",
        "load",
    ):
        default = getattr(live, dest)
        p.add_argument("--" + dest.replace("_", "-"), type=type(default), default=default)
    args = p.parse_args(argv)
    args.pd = 0  # sized as the live bench's whole-request fleet (its --pd is not simulated)
    if not args.trace.is_file():
        p.error(f"--trace: no such file: {args.trace}")
    try:
        kind = detect_format(args.trace)
    except KvtideError as exc:
        p.error(f"--trace: {exc}")
    if kind != "mooncake":
        p.error(f"--trace: {args.trace} is a {kind} trace; windows are cut from Mooncake's format")
    for dest in ("windows", "window_requests", "engines", "max_output_tokens", "max_model_len"):
        if getattr(args, dest) < 1:
            p.error(f"--{dest.replace('_', '-')}: expected at least 1, got {getattr(args, dest)}")
    for dest in ("trace_duration", "kv_fraction", "load"):
        if not 0 < getattr(args, dest) < math.inf:
            p.error(f"--{dest.replace('_', '-')}: expected a number > 0, got {getattr(args, dest)}")
    if args.first < 0:
        p.error(f"--first: expected a request number >= 0, got {args.first}")
    try:
        validate_names(args.router, "lru")
    except KvtideError as exc:
        p.error(f"--router: {exc}")
    reference = args.reference or args.router[-1]
    if reference not in args.router:
        p.error(f"--reference: {reference!r} is not one of the --router values")
    # the rest of what gateways.workload_plans reads (its chat sizing among it) as the live
    # bench's defaults; the window is the trace
    args = argparse.Namespace(
        **vars(live)
        | vars(args)
        | {"trace_requests": args.window_requests, "trace_time_scale": 1.0}
    )
    print(f"trace_windows: rev {git_rev()} {json.dumps(vars(args), default=str)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="kvtide-windows-") as tmp:
        made = windows(args, Path(tmp))
        if not made:
            p.error(f"--first: {args.trace} has no window of 2 requests from request {args.first}")
        try:
            scenarios = [
                Scenario(
                    workload=w["file"],
                    block_tokens=BLOCK_TOKENS,
                    eviction="lru",
                    gpu_cache_tokens=w["gpu_cache_tokens"],
                    time_scale=w["time_scale"],
                    replicas=args.engines,
                    router=router,
                    engine=EngineConfig(scheduling_policy=args.scheduling_policy),
                )
                for w in made
                for router in args.router
            ]
        except KvtideError as exc:  # a router the engines' policy cannot serve
            p.error(str(exc))
        runs = run_many(scenarios, jobs=args.jobs)
    results: dict[str, list[dict[str, Any]]] = {r: [] for r in args.router}
    for scenario, res in zip(scenarios, runs, strict=True):
        results[scenario.router].append(res.summary.to_json())
    table = summarize(results, reference)
    n = len(made)
    print(f"\n{n} windows of {args.window_requests} requests from request {args.first}")
    print(
        f"{'router':<44}{'TTFT p50':>9}{'p99':>8}{'hits':>8}{'TPOT p50':>10}"
        f"   vs {reference}: TTFT p50, p99 (geometric mean of ratios); windows better p50/p99/hits"
    )
    for router, row in table.items():
        print(
            f"{router:<44}{row['ttft_p50_s']:>9.3f}{row['ttft_p99_s']:>8.3f}"
            f"{row['hit_ratio']:>8.2%}{row['tpot_p50_s']:>10.4f}"
            f"   x{row['p50_ratio']:.3f}, x{row['p99_ratio']:.3f}; "
            f"{row['wins_p50']}/{row['wins_p99']}/{row['wins_hits']} of {n}"
        )
    if args.json_path is not None:
        args.json_path.write_text(
            json.dumps(
                {"config": vars(args), "windows": made, "runs": results, "summary": table},
                indent=1,
                default=str,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
