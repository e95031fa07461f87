"""How far can an online policy get? LRU, LRU told the future's admissions, tide, and MIN.

"LRU with perfect admission" stores only blocks that some later request will use (an oracle's
knowledge of which blocks are one-hit wonders) and evicts by LRU. Next uses do not decrease
along a prefix, so that is LRU on each request's prefix that will be used again. It bounds
what any admission filter in front of LRU can reach on a trace.

    python3 bench/eviction_bounds.py ../shared/traces/mooncake_conversation.jsonl \
        --block-tokens 512 --capacity 500000,1000000,3000000,10000000
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import numpy as np

from kvtide.cli.replay import Prepared, parse_capacities, prepare, replay_one
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.oracle import Oracle


def lru_with_perfect_admission(data: Prepared, oracle: Oracle, capacity_tokens: int) -> float:
    bt = data.block_tokens
    cache = KVCache(CacheConfig(capacity_tokens // bt, block_tokens=bt, policy="lru"))
    never = oracle.num_requests
    hit_blocks = 0
    for i in range(data.num_requests):
        hashes = data.hashes(i)
        lo, hi = int(oracle.offsets[i]), int(oracle.offsets[i + 1])
        dead = np.flatnonzero(oracle.next_use[lo:hi] == never)
        keep = int(dead[0]) if len(dead) else hi - lo
        match = cache.match(hashes)
        hit_blocks += match.num_blocks
        if keep > match.num_blocks:
            cache.insert(hashes[:keep], match=match)
    return hit_blocks * bt / int(data.prompt_tokens.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--block-tokens", type=int, default=512)
    parser.add_argument("--capacity", default="500000,1000000,3000000,10000000")
    parser.add_argument("--requests", type=int)
    args = parser.parse_args()
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"trace={args.trace} block_tokens={args.block_tokens} requests={args.requests} rev={rev}")
    data = prepare(
        str(args.trace),
        block_tokens=args.block_tokens,
        limit=args.requests,
        seed=0,
        tenant_salt=False,
    )
    start = time.perf_counter()
    oracle = Oracle(data.all_hashes())
    total = int(data.prompt_tokens.sum())
    print(f"infinite cache: {100 * oracle.infinite_hit_blocks * data.block_tokens / total:.2f}%")
    header = "capacity_tokens  lru  lru+perfect_admission  tide  optimum  (% of optimum)"
    print(header)
    for cap in parse_capacities(args.capacity):
        best = oracle.run(cap // data.block_tokens).hit_blocks * data.block_tokens / total
        lru = replay_one(data, "lru", cap)["hit_ratio"]
        tide = replay_one(data, "tide", cap)["hit_ratio"]
        admit = lru_with_perfect_admission(data, oracle, cap)
        print(
            f"{cap:>15,} {100 * lru:6.2f} {100 * admit:8.2f} {100 * tide:8.2f} {100 * best:8.2f}"
            f"   ({100 * lru / best:.0f} / {100 * admit / best:.0f} / {100 * tide / best:.0f})"
        )
    print(f"elapsed {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
