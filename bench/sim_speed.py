"""Simulator speed: simulated seconds per wall second on a whole trace, in one process.

    python bench/sim_speed.py ../shared/traces/mooncake_conversation.jsonl

Replays the trace through 16 replicas (Llama-3-70B on 8 × A800, the Mooncake setup) with the
`cost` router, several times, and prints the median wall time, the simulated span (first
arrival to last finish) and their ratio, against the targets (<= 60 s, >= 60x real time).
The peer in the same run is kvtide's own engine with decode-run fusion turned off (one event
per iteration, as a step-by-step simulator would do), on a prefix of the trace.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

from kvtide.engine.scheduler import EngineConfig
from kvtide.sim.scenario import Scenario, prepare, run
from revision import git_rev

TARGET_WALL_S = 60.0
TARGET_SPEEDUP = 60.0


def timed(scenario: Scenario, runs: int) -> tuple[float, float, int]:
    """Median wall seconds, simulated span in seconds, events of one run."""
    prepared = prepare(scenario)
    walls = []
    span_s = 0.0
    events = 0
    for _ in range(runs):
        start = time.perf_counter()
        result = run(scenario, prepared)
        walls.append(time.perf_counter() - start)
        span_s = result.simulated_s
        events = result.num_events
    return statistics.median(walls), span_s, events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--router", default="cost")
    parser.add_argument("--model", default="llama-3-70b")
    parser.add_argument("--gpu", default="a800")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--gpu-cache-tokens", type=int, default=1 << 20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--peer-requests",
        type=int,
        default=1500,
        help="requests of the unfused peer run (0 skips it)",
    )
    args = parser.parse_args()
    scenario = Scenario(
        workload=str(args.trace),
        model=args.model,
        gpu=args.gpu,
        tp=args.tp,
        replicas=args.replicas,
        router=args.router,
        gpu_cache_tokens=args.gpu_cache_tokens,
        seed=args.seed,
    )
    print(
        f"sim_speed: {args.trace.name}, {args.replicas} x {args.model} on {args.tp} x "
        f"{args.gpu}, router {args.router}, {args.gpu_cache_tokens:,} KV tokens each, "
        f"seed {args.seed}, median of {args.runs}, git {git_rev()}"
    )
    wall_s, span_s, events = timed(scenario, args.runs)
    speedup = span_s / wall_s
    print(
        f"whole trace: {wall_s:.1f} s wall for {span_s:,.0f} s simulated -> {speedup:,.0f}x "
        f"real time, {events / wall_s:,.0f} events/s"
    )
    print(
        f"targets: wall {wall_s:.1f} / {TARGET_WALL_S:.0f} s = {wall_s / TARGET_WALL_S:.2f} "
        f"({'ok' if wall_s <= TARGET_WALL_S else 'MISSED'}), speedup {speedup:,.0f} / "
        f"{TARGET_SPEEDUP:.0f}x = {speedup / TARGET_SPEEDUP:.1f} "
        f"({'ok' if speedup >= TARGET_SPEEDUP else 'MISSED'})"
    )
    if args.peer_requests:
        head = scenario.with_(requests=args.peer_requests)
        unfused = head.with_(engine=dataclasses.replace(EngineConfig(), max_decode_steps=1))
        fused_s, _, fused_events = timed(head, args.runs)
        step_s, _, step_events = timed(unfused, args.runs)
        print(
            f"first {args.peer_requests} requests: fused decode runs {fused_s:.2f} s "
            f"({fused_events:,} events), one event per iteration {step_s:.2f} s "
            f"({step_events:,} events): {step_s / fused_s:.1f}x slower"
        )


if __name__ == "__main__":
    main()
