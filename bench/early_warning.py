"""Early warning, measured: does the detector fire before TTFT p99 degrades as the device pool
shrinks step by step, and stay quiet through a cold start and a steady hour?

    nice python bench/early_warning.py ../shared/traces/mooncake_conversation.jsonl --load 0.5 \
        --gpu-cache-tokens 4000000 --shrink-every-s 90 --shrink-steps 18

(docs/telemetry.md has the built-ins' command and the numbers.) Per workload, runs on the same
arrivals and the same fleet: a steady one (the pool as configured), a shrinking one (from
``--shrink-start-s``, every ``--shrink-every-s`` each replica's device pool loses
``--shrink-fraction`` of its capacity, ``--shrink-steps`` times) and a roomy one (below).
TTFT p99 is the rolling p99 over requests that arrived in the last 5 minutes, at every detector
tick. "Degraded" is the first tick after the shrink starts whose p99 exceeds 1.2 x the steady
run's p99 at the same tick (paired: the same requests arrive in both), held for two ticks;
the lead time is that time minus the first tick from the shrink on at which the shrinking run
has pool_undersized firing and the steady run does not (an alert both raise is a swing of the
workload, not the shrink's doing). An alarm is any
pool_undersized or fragmentation alert in the steady run, or any alert of the shrinking run
before its first shrink step; the cold start is the time until the pool first evicts.

Whether an alarm of the steady run is false is checked against a third run, "roomy": the same
arrivals with ``--roomy-factor`` times the pool. An alarm is confirmed when, within the fast
window after it, the steady run's TTFT p99 is above 1.2 x the roomy run's for two ticks (the
degradation criterion above, with the larger pool as the reference): the steady pool was then
itself short for the workload, and the alarm said so. Every other alarm is false.
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import sys
import time
from pathlib import Path
from typing import Any

from kvtide.engine.scheduler import EngineConfig
from kvtide.errors import KvtideError
from kvtide.sim.scenario import Scenario, prepare, run
from kvtide.sim.telemetry import PoolShrink, TelemetryResult
from kvtide.telemetry.detector import DetectorConfig, EarlyWarning
from revision import git_rev

DEGRADED = 1.2
HOLD_TICKS = 2


def degraded_at(steady: TelemetryResult, shrunk: TelemetryResult, after_s: float) -> float | None:
    base = dict(zip(steady.times_s, steady.ttft_p99_s, strict=True))
    run_len = 0
    for t, p99 in zip(shrunk.times_s, shrunk.ttft_p99_s, strict=True):
        ref = base.get(t, math.nan)
        bad = t >= after_s and p99 > DEGRADED * ref
        run_len = run_len + 1 if bad else 0
        if run_len == HOLD_TICKS:
            return t
    return None


def undersized_ticks(tel: TelemetryResult, config: DetectorConfig) -> dict[float, bool]:
    """Per tick, whether pool_undersized is firing (the run's samples replayed)."""
    detector = EarlyWarning(config, log=False)
    out = {}
    for sample in tel.samples:
        detector.update(sample)
        out[sample.time_s] = "pool_undersized" in detector.active
    return out


def shrink_warning_at(
    steady: TelemetryResult, shrunk: TelemetryResult, config: DetectorConfig, after_s: float
) -> float | None:
    """The first tick from ``after_s`` at which the shrinking run warns and the steady run
    (the same arrivals, the pool left alone) does not: the warning is then the shrink's doing,
    not a swing of the workload that both runs see."""
    calm = undersized_ticks(steady, config)
    for t, firing in undersized_ticks(shrunk, config).items():
        if t >= after_s and firing and not calm.get(t, False):
            return t
    return None


def confirmed(
    steady: TelemetryResult, roomy: TelemetryResult, alert_s: float, window_s: float
) -> bool:
    """The steady run's TTFT p99 rose above 1.2 x the roomy run's (same arrivals, a larger
    pool) within ``window_s`` after ``alert_s``: the pool was short then, as the alarm said."""
    bad = degraded_at(roomy, steady, alert_s)
    return bad is not None and bad <= alert_s + window_s


def measure(
    scenario: Scenario,
    shrink: PoolShrink,
    config: DetectorConfig,
    dump: Path | None = None,
    roomy_factor: float = 1.2,
) -> dict[str, Any]:
    prepared = prepare(scenario)
    t0 = time.perf_counter()
    steady = run(scenario, prepared, detector=config).telemetry
    shrunk = run(scenario, prepared, detector=config, shrink=shrink).telemetry
    roomy_scenario = scenario.with_(
        gpu_cache_tokens=round(scenario.gpu_cache_tokens * roomy_factor)
    )
    roomy = run(roomy_scenario, prepared, detector=config).telemetry
    wall_s = time.perf_counter() - t0
    assert steady is not None and shrunk is not None and roomy is not None
    if dump is not None:  # the runs' telemetry, to replay other detector settings offline
        with dump.open("wb") as out:
            pickle.dump((steady, shrunk, shrink, roomy), out)
    start = steady.times_s[0] - config.interval_s if steady.times_s else 0.0
    shrink_at = start + shrink.start_s
    first_evict = next(
        (
            t
            for t, e in zip(steady.times_s, steady.evictions_per_s.get("device", []), strict=False)
            if e > 0
        ),
        None,
    )
    false_steady = [a for a in steady.alerts if a.name != "cold_start"]
    early = [a for a in shrunk.alerts if a.name != "cold_start" and a.time_s < shrink_at]
    alert = next(
        (a for a in shrunk.alerts if a.name == "pool_undersized" and a.time_s >= shrink_at), None
    )
    warned = shrink_warning_at(steady, shrunk, config, shrink_at)
    bad = degraded_at(steady, shrunk, shrink_at)
    caps = dict(zip(shrunk.times_s, shrunk.capacity_blocks, strict=True))
    full = steady.capacity_blocks[-1] if steady.capacity_blocks else math.nan
    return {
        "workload": scenario.workload,
        "requests": len(prepared.requests),
        "span_s": prepared.description["span_s"],
        "offered_load": prepared.description["offered_load"],
        "wall_s": wall_s,
        "cold_start_s": None if first_evict is None else first_evict - start,
        "cold_start_alerts": [a.time_s - start for a in steady.alerts if a.name == "cold_start"],
        "alarms_steady": [(a.name, a.time_s - start, a.reason) for a in false_steady],
        "false_alarms_steady": [
            (a.name, a.time_s - start)
            for a in false_steady
            if not confirmed(steady, roomy, a.time_s, config.fast_s)
        ],
        "roomy_alarms": [
            (a.name, a.time_s - start) for a in roomy.alerts if a.name != "cold_start"
        ],
        "false_alarms_before_shrink": [(a.name, a.time_s - start, a.reason) for a in early],
        "alert_s": None if alert is None else alert.time_s - start,
        "alert_reason": None if alert is None else alert.reason,
        "alert_pool_fraction": None if alert is None else caps.get(alert.time_s, 0) / full,
        "degraded_s": None if bad is None else bad - start,
        "degraded_pool_fraction": None if bad is None else caps.get(bad, 0) / full,
        "warned_s": None if warned is None else warned - start,
        "warned_pool_fraction": None if warned is None else caps.get(warned, 0) / full,
        "lead_s": None if warned is None or bad is None else bad - warned,
        "shrunk_alerts": [(a.name, a.time_s - start) for a in shrunk.alerts],
        "steady_ttft_p99_s_median": _median(steady.ttft_p99_s),
        "roomy_ttft_p99_s_median": _median(roomy.ttft_p99_s),
    }


def _s(x: float | None) -> str:
    return "never" if x is None else f"{x:,.0f} s"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _median(xs: list[float]) -> float:
    vals = sorted(x for x in xs if not math.isnan(x))
    return vals[len(vals) // 2] if vals else math.nan


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("workloads", nargs="+", help="trace paths or builtin:NAME[:k=v,...]")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument(
        "--load", type=float, default=0.7, help="offered prefill load; 0: the workload's own times"
    )
    parser.add_argument("--gpu-cache-tokens", type=int, default=1_000_000)
    parser.add_argument("--router", default="cost")
    parser.add_argument("--prefill-only", action="store_true")
    parser.add_argument("--shrink-start-s", type=float, default=1500.0)
    parser.add_argument("--shrink-every-s", type=float, default=120.0)
    parser.add_argument("--shrink-fraction", type=float, default=0.05)
    parser.add_argument("--shrink-steps", type=int, default=16)
    parser.add_argument(
        "--roomy-factor",
        type=float,
        default=1.2,
        help="the reference run's pool, x the steady one (confirms or refutes steady alarms)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the built-in workloads' seed")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--dump", type=Path, help="pickle each workload's telemetry to DIR/N.pkl")
    args = parser.parse_args()
    config = DetectorConfig()
    try:
        shrink = PoolShrink(
            args.shrink_start_s, args.shrink_every_s, args.shrink_fraction, args.shrink_steps
        )
    except KvtideError as exc:
        print(f"early_warning: {exc}", file=sys.stderr)
        return 2
    print(f"early_warning  git {git_rev()}  detector {config}")
    print(f"  shrink {shrink}; degraded = rolling 5-min TTFT p99 > {DEGRADED} x steady run's")
    rows: list[dict[str, Any]] = []
    for workload in args.workloads:
        scenario = Scenario(
            workload=workload,
            replicas=args.replicas,
            model=args.model,
            gpu=args.gpu,
            tp=args.tp,
            load=args.load or None,
            gpu_cache_tokens=args.gpu_cache_tokens,
            router=args.router,
            seed=args.seed,
        )
        if args.prefill_only:
            scenario = scenario.with_(engine=EngineConfig(prefill_only=True))
        try:
            dump = args.dump / f"{len(rows)}.pkl" if args.dump else None
            row = measure(scenario, shrink, config, dump, args.roomy_factor)
        except KvtideError as exc:
            print(f"early_warning: {workload}: {exc}", file=sys.stderr)
            return 2
        rows.append(row)
        print(
            f"\n{workload}: {row['requests']} requests over {row['span_s']:.0f} s, offered "
            f"load {row['offered_load']:.2f} "
            f"({row['wall_s']:.0f} s wall for the three runs)"
        )
        print(
            f"  cold start: pool first evicts at {row['cold_start_s']} s; cold_start alerts "
            f"at {row['cold_start_alerts'][:5]}"
        )
        print(
            f"  alarms: steady run {len(row['alarms_steady'])}, of them false (not confirmed "
            f"by the x{args.roomy_factor:g} pool) {len(row['false_alarms_steady'])}; shrinking "
            f"run before the first shrink {len(row['false_alarms_before_shrink'])}; roomy run "
            f"{len(row['roomy_alarms'])}"
        )
        false_at = {t for _, t in row["false_alarms_steady"]}
        for name, t, reason in row["alarms_steady"][:3]:
            verdict = "false" if t in false_at else "confirmed"
            print(f"    steady {name} at {t:.0f} s ({verdict}): {reason}")
        print(
            f"  pool_undersized first fires at {_s(row['alert_s'])} (pool at "
            f"{_pct(row['alert_pool_fraction'])}); warns with the steady run quiet from "
            f"{_s(row['warned_s'])} (pool at {_pct(row['warned_pool_fraction'])}); TTFT p99 "
            f"degraded at {_s(row['degraded_s'])} (pool at "
            f"{_pct(row['degraded_pool_fraction'])}); lead {_s(row['lead_s'])}"
        )
        if row["alert_reason"]:
            print(f"    {row['alert_reason']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
