"""How far can an online policy get? LRU, LRU told the future's admissions, tide, and MIN.

"Session hindsight" ranks blocks by the chance they are still to be reused given what a
multi-turn workload offers: the turn depth of the last request through a block (a request
continues an earlier one when its prompt runs through that one's last full block) and the
time since. ``P(alive | idle s, depth d) = p_d S(s) / (p_d S(s) + 1 - p_d)``, with ``p_d``
(chance of another turn at depth d) and ``S`` (survival of the gap to it) measured on the
whole trace in hindsight, and depths found over the whole history, evicted or not. An online
policy must learn both and loses depths with evicted blocks, so this bounds what ranking by
session depth and idle time can reach.

"LRU with perfect admission" stores only blocks that some later request will use (an oracle's
knowledge of which blocks are one-hit wonders) and evicts by LRU. Next uses do not decrease
along a prefix, so that is LRU on each request's prefix that will be used again. It bounds
what any admission filter in front of LRU can reach on a trace.

    python3 bench/eviction_bounds.py ../shared/traces/mooncake_conversation.jsonl \
        --block-tokens 512 --capacity 500000,1000000,3000000,10000000
"""

from __future__ import annotations

import argparse
import bisect
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from kvtide.cli.replay import Prepared, prepare, replay_one
from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.oracle import Oracle
from kvtide.quantities import flag, items, tokens
from revision import git_rev


def lru_with_perfect_admission(data: Prepared, oracle: Oracle, capacity_tokens: int) -> float:
    bt = data.block_tokens
    cache = KVCache(
        CacheConfig(capacity_tokens // bt, block_tokens=bt, policy="lru"), ManualClock()
    )
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


def session_depths(data: Prepared) -> tuple[list[int], list[int | None]]:
    """Each request's turn depth and the earlier request it continues (``None``: a new one)."""
    ended_at: dict[bytes, int] = {}  # last full block -> the latest request ending there
    depth = [0] * data.num_requests
    parent: list[int | None] = [None] * data.num_requests
    for i in range(data.num_requests):
        raw = data.hashes(i).raw
        for k in range(len(raw) - 8, 0, -8):  # the first block is often a shared system prompt
            j = ended_at.get(raw[k : k + 8])
            if j is not None:
                parent[i], depth[i] = j, depth[j] + 1
                break
        if raw:
            ended_at[raw[-8:]] = i
    return depth, parent


def session_hindsight(data: Prepared, capacity_tokens: int, max_depth: int = 8) -> float:
    depth, parent = session_depths(data)
    n = data.num_requests
    t = data.arrival_s
    gaps = sorted(float(t[i] - t[j]) for i, j in enumerate(parent) if j is not None)
    continued = [0] * (max_depth + 1)
    total = [0] * (max_depth + 1)
    for i in range(n):
        total[min(depth[i], max_depth)] += 1
    for j in parent:
        if j is not None:
            continued[min(depth[j], max_depth)] += 1
    p = [(c + 1) / (m + 2) for c, m in zip(continued, total, strict=True)]

    def p_alive(d: int, idle: float) -> float:
        survival = 1.0 - bisect.bisect_right(gaps, idle) / len(gaps) if gaps else 1.0
        alive = p[d] * survival
        return alive / (alive + 1.0 - p[d])

    cap = capacity_tokens // data.block_tokens
    lists: list[OrderedDict[bytes, float]] = [OrderedDict() for _ in range(max_depth + 1)]
    where: dict[bytes, int] = {}
    hit_blocks = 0
    for i in range(n):
        raw = data.hashes(i).raw
        keys = [raw[k : k + 8] for k in range(0, len(raw), 8)]
        hit = 0
        while hit < len(keys) and keys[hit] in where:
            hit += 1
        hit_blocks += hit
        d, now = min(depth[i], max_depth), float(t[i])
        for key in reversed(keys):  # the root most recent: a prefix leaves from its tail
            c = where.get(key)
            if c is not None:
                del lists[c][key]
            lists[d][key] = now
            where[key] = d
        while len(where) > cap:
            best: tuple[float, int] | None = None
            for c, blocks in enumerate(lists):
                if blocks:
                    key, used = next(iter(blocks.items()))
                    score = (p_alive(c, now - used), c)
                    if best is None or score < best:
                        best = score
            assert best is not None
            key, _ = lists[best[1]].popitem(last=False)
            del where[key]
    return hit_blocks * data.block_tokens / int(data.prompt_tokens.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--block-tokens", type=int, default=512)
    parser.add_argument(
        "--capacity",
        type=flag(items, parse=tokens, minimum=1),
        default="500000,1000000,3000000,10000000",
    )
    parser.add_argument("--requests", type=int)
    args = parser.parse_args()
    rev = git_rev()
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
    header = (
        "capacity_tokens  lru  lru+perfect_admission  tide  session_hindsight  optimum"
        "  (% of optimum)"
    )
    print(header)
    for cap in args.capacity:
        best = oracle.run(cap // data.block_tokens).hit_blocks * data.block_tokens / total
        lru = replay_one(data, "lru", cap)["hit_ratio"]
        tide = replay_one(data, "tide", cap)["hit_ratio"]
        admit = lru_with_perfect_admission(data, oracle, cap)
        session = session_hindsight(data, cap)
        print(
            f"{cap:>15,} {100 * lru:6.2f} {100 * admit:8.2f} {100 * tide:8.2f}"
            f" {100 * session:8.2f} {100 * best:8.2f}   ({100 * lru / best:.0f} /"
            f" {100 * admit / best:.0f} / {100 * tide / best:.0f} / {100 * session / best:.0f})"
        )
    print(f"elapsed {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
