"""Mooncake (FAST'25) Fig. 5 on kvtide's simulator: average TTFT of four prefill schedulers.

    python bench/mooncake_fig5.py ../shared/traces/mooncake_conversation.jsonl

Setup as in the paper: 16 prefill instances of 8 x A800 serving a 70B model (Llama-3-70B,
tensor parallel 8), the Mooncake conversation trace; a disaggregated prefill pool, so a
request ends at its first token. The four schedulers map onto kvtide as:

    random               `random` (uniform over instances)
    load-balancing       `least_load` (fewest queued prefill tokens)
    local cache-aware    `cost` (queue + uncached prefill, from each instance's own cache)
    global cache-aware   `cost` with --kv-transfer (a longer prefix held by another instance
                         is fetched over the network, Mooncake's global KV pool)

The paper does not state its arrival rate; ``--load`` is the one free parameter (the offered
prefill work, every prompt computed from scratch, as a fraction of the pool's capacity), and
``--loads`` sweeps it so the sensitivity is visible. The ratios are checked against the
paper's within +-25%.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvtide.engine.scheduler import EngineConfig
from kvtide.sim.parallel import run_many
from kvtide.sim.scenario import Scenario
from revision import git_rev

PAPER_S = {"random": 19.65, "load-balancing": 5.27, "local cache-aware": 3.58,
           "global cache-aware": 3.07}  # fmt: skip
RATIOS = (
    ("random / load-balancing", "random", "load-balancing"),
    ("load-balancing / local", "load-balancing", "local cache-aware"),
    ("local / global", "local cache-aware", "global cache-aware"),
)
TOLERANCE = 0.25


def scenarios(args: argparse.Namespace, load: float) -> dict[str, Scenario]:
    base = Scenario(
        workload=str(args.trace),
        model="llama-3-70b",
        gpu="a800",
        tp=8,
        replicas=16,
        load=load,
        gpu_cache_tokens=args.gpu_cache_tokens,
        host_cache_tokens=args.host_cache_tokens,
        seed=args.seed,
        engine=EngineConfig(prefill_only=True),
    )
    return {
        "random": base.with_(router="random"),
        "load-balancing": base.with_(router="least_load"),
        "local cache-aware": base.with_(router="cost"),
        "global cache-aware": base.with_(router="cost", kv_transfer=True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--loads", default="0.55", help="comma-separated offered loads")
    parser.add_argument("--gpu-cache-tokens", type=int, default=1 << 20)
    parser.add_argument("--host-cache-tokens", type=int, default=4 << 20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    print(
        f"mooncake_fig5: {args.trace.name}, 16 x llama-3-70b on 8 x a800, prefill pool, "
        f"{args.gpu_cache_tokens:,} GPU + {args.host_cache_tokens:,} host KV tokens per "
        f"instance, seed {args.seed}, git {git_rev()}"
    )
    for load in (float(x) for x in args.loads.split(",")):
        runs = scenarios(args, load)
        results = run_many(list(runs.values()), args.jobs)
        ours = {name: r.summary.ttft_s.mean for name, r in zip(runs, results, strict=True)}
        hits = {name: r.summary.hit_ratio for name, r in zip(runs, results, strict=True)}
        print(f"\noffered load {load:.2f}: average TTFT (s)")
        print(f"{'scheduler':<20} {'paper':>7} {'kvtide':>8} {'hit ratio':>10}")
        for name in runs:
            print(f"{name:<20} {PAPER_S[name]:>7.2f} {ours[name]:>8.2f} {hits[name]:>10.1%}")
        print(f"{'ratio':<26} {'paper':>6} {'kvtide':>7} {'off by':>7}  within 25%")
        for label, a, b in RATIOS:
            paper = PAPER_S[a] / PAPER_S[b]
            kv = ours[a] / ours[b]
            off = kv / paper - 1
            verdict = "yes" if abs(off) <= TOLERANCE else "NO"
            print(f"{label:<26} {paper:>6.2f} {kv:>7.2f} {off:>+7.0%}  {verdict}")


if __name__ == "__main__":
    main()
