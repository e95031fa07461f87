"""kvtide's `cost` router against round-robin, load-only routing and the peers' routers, at a
given offered load, on a trace.

    python bench/routing_at_load.py ../shared/traces/mooncake_conversation.jsonl --load 0.7

Prints TTFT p50/p99 and hit ratio per router, then the claims checked: `cost` gives >= 3x
lower p50 and >= 2x lower p99 TTFT than round-robin, >= 1.3x lower p50 than the best
load-only router (round_robin, least_load, random) with a p99 no worse, and a lower p50 and
p99 than each peer_* router. Defaults: the Mooncake setup (16 x Llama-3-70B on 8 x A800) as a
disaggregated prefill pool with 1M GPU and 4M host KV tokens per instance.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvtide.engine.scheduler import EngineConfig
from kvtide.sim.parallel import run_many
from kvtide.sim.scenario import Scenario
from revision import git_rev

LOAD_ONLY = ("round_robin", "least_load", "random")
PEERS = ("peer_sglang", "peer_dynamo", "peer_llmd", "peer_preble")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--load", type=float, default=0.7)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--model", default="llama-3-70b")
    parser.add_argument("--gpu", default="a800")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--gpu-cache-tokens", type=int, default=1 << 20)
    parser.add_argument("--host-cache-tokens", type=int, default=4 << 20)
    parser.add_argument(
        "--colocated", action="store_true", help="prefill and decode on the same replicas"
    )
    parser.add_argument("--cost", default="cost", help="the cost router, with options")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    base = Scenario(
        workload=str(args.trace),
        model=args.model,
        gpu=args.gpu,
        tp=args.tp,
        replicas=args.replicas,
        load=args.load,
        gpu_cache_tokens=args.gpu_cache_tokens,
        host_cache_tokens=args.host_cache_tokens,
        seed=args.seed,
        engine=EngineConfig(prefill_only=not args.colocated),
    )
    routers = [args.cost, *LOAD_ONLY, *PEERS]
    mode = "colocated" if args.colocated else "prefill pool"
    print(
        f"routing_at_load: {args.trace.name}, load {args.load}, {args.replicas} x {args.model} "
        f"on {args.tp} x {args.gpu} ({mode}), {args.gpu_cache_tokens:,} GPU + "
        f"{args.host_cache_tokens:,} host KV tokens each, seed {args.seed}, git {git_rev()}"
    )
    results = run_many([base.with_(router=r) for r in routers], args.jobs)
    by = {r: res.summary for r, res in zip(routers, results, strict=True)}
    print(f"{'router':<22} {'p50 (s)':>8} {'p99 (s)':>8} {'mean (s)':>9} {'hit':>6} {'imb':>5}")
    for name, s in by.items():
        print(
            f"{name:<22} {s.ttft_s.p50:>8.3f} {s.ttft_s.p99:>8.3f} {s.ttft_s.mean:>9.3f} "
            f"{s.hit_ratio:>6.1%} {s.load_imbalance:>5.2f}"
        )
    cost = by[args.cost]
    rr = by["round_robin"]
    best = min(LOAD_ONLY, key=lambda r: by[r].ttft_s.p50)
    checks = [
        ("p50 vs round_robin >= 3x", rr.ttft_s.p50 / cost.ttft_s.p50, 3.0),
        ("p99 vs round_robin >= 2x", rr.ttft_s.p99 / cost.ttft_s.p99, 2.0),
        (f"p50 vs best load-only ({best}) >= 1.3x", by[best].ttft_s.p50 / cost.ttft_s.p50, 1.3),
        (f"p99 vs best load-only ({best}) >= 1x", by[best].ttft_s.p99 / cost.ttft_s.p99, 1.0),
    ]
    for peer in PEERS:
        checks.append((f"p50 vs {peer} > 1x", by[peer].ttft_s.p50 / cost.ttft_s.p50, 1.0))
        checks.append((f"p99 vs {peer} > 1x", by[peer].ttft_s.p99 / cost.ttft_s.p99, 1.0))
    print("claims (ratio = other / cost):")
    for label, ratio, need in checks:
        ok = ratio >= need if need > 1.0 or "best" in label else ratio > need
        print(f"  {label:<40} {ratio:6.2f}  {'ok' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
