"""Routing decision latency and index memory, against a naive per-block index in the same run.

    nice python bench/route_decision.py --replicas 16,64 --prompt-tokens 32768 --json out.json

Builds a global prefix index of ``--replicas`` replicas holding ``--blocks-per-replica`` blocks
each (chains that share system prompts, as a fleet behind prefix-aware routing), then times
``choose()`` over requests whose hashes are computed beforehand (hashing excluded). Requests:
half extend a chain some replica holds, a third share only a system prompt, the rest are cold.
The naive peer is a Dynamo-style index: a dict of block hash -> set of replicas walked block by
block (Dynamo's radix tree visits every block of the prompt the same way), scored with Dynamo's
cost. JSON fields: p50_us, p99_us, decisions_per_s, bytes_per_entry (headline policy at the
largest replica count), plus every run.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvtide.clock import ManualClock
from kvtide.core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvtide.core.hashing import BlockHashes
from kvtide.routing import (
    GlobalPrefixIndex,
    ReplicaState,
    RouteDecision,
    RouteRequest,
    RoutingContext,
    RoutingPolicy,
    make_policy,
)
from kvtide.types import ReplicaId, Tier
from revision import git_rev

BLOCK_TOKENS = 16


@dataclass
class Fleet:
    replicas: list[ReplicaState]
    chains: list[np.ndarray]  # per cached chain: uint64 hashes
    holders: list[tuple[int, int]]  # (replica index, chain index) holdings
    systems: list[np.ndarray]


def build_fleet(rng: np.random.Generator, n: int, blocks_per_replica: int, n_blocks: int) -> Fleet:
    systems = [rng.integers(1, 2**63, rng.integers(64, 513), dtype=np.uint64) for _ in range(16)]
    chains: list[np.ndarray] = []
    holders: list[tuple[int, int]] = []
    for r in range(n):
        held = 0
        while held < blocks_per_replica:
            sys_p = systems[int(rng.integers(len(systems)))]
            length = int(rng.integers(len(sys_p) + 1, n_blocks + 1))
            tail = rng.integers(1, 2**63, length - len(sys_p), dtype=np.uint64)
            chains.append(np.concatenate([sys_p, tail]))
            holders.append((r, len(chains) - 1))
            held += length
    replicas = [
        ReplicaState(f"replica-{i:03d}", capacity_blocks=blocks_per_replica) for i in range(n)
    ]
    for rep in replicas:  # some load, so that load terms matter
        rep.num_requests = int(rng.integers(0, 8))
        rep.queued_prefill_tokens = int(rng.integers(0, 20_000))
        rep.decode_tokens = int(rng.integers(0, 200_000))
    return Fleet(replicas, chains, holders, systems)


def make_requests(
    rng: np.random.Generator, fleet: Fleet, count: int, n_blocks: int
) -> list[RouteRequest]:
    out = []
    for i in range(count):
        u = rng.random()
        if u < 0.5:
            chain = fleet.chains[int(rng.integers(len(fleet.chains)))]
            keep = int(rng.integers(1, len(chain) + 1))
            head = chain[:keep]
        elif u < 0.83:
            head = fleet.systems[int(rng.integers(len(fleet.systems)))]
        else:
            head = np.empty(0, dtype=np.uint64)
        tail = rng.integers(1, 2**63, n_blocks - len(head), dtype=np.uint64)
        hashes = BlockHashes.from_array(np.concatenate([head, tail])[:n_blocks])
        out.append(RouteRequest(hashes, n_blocks * BLOCK_TOKENS, BLOCK_TOKENS, request_id=str(i)))
    return out


class NaiveIndex:
    """The peer: dict block hash -> set of replicas (device tier), walked block by block;
    ``apply_all`` takes an engine's KV events (``bench/index_churn.py``)."""

    def __init__(self) -> None:
        self.blocks: dict[int, set[ReplicaId]] = {}

    def add(self, replica: ReplicaId, hashes: Sequence[int]) -> None:
        for h in hashes:
            s = self.blocks.get(h)
            if s is None:
                self.blocks[h] = {replica}
            else:
                s.add(replica)

    def remove(self, replica: ReplicaId, hashes: Iterable[int]) -> None:
        blocks = self.blocks
        for h in hashes:
            s = blocks.get(h)
            if s is not None:
                s.discard(replica)
                if not s:
                    del blocks[h]

    def apply_all(self, replica: ReplicaId, events: Sequence[KVEvent]) -> None:
        for ev in events:
            if isinstance(ev, BlockStored) and ev.tier is Tier.DEVICE:
                self.add(replica, ev.block_hashes)
            elif isinstance(ev, BlockRemoved) and ev.tier is Tier.DEVICE:
                self.remove(replica, ev.block_hashes)
            elif isinstance(ev, AllBlocksCleared):
                self.remove(replica, [h for h, s in self.blocks.items() if replica in s])

    def replica_blocks(self) -> dict[ReplicaId, int]:
        out: dict[ReplicaId, int] = {}
        for s in self.blocks.values():
            for r in s:
                out[r] = out.get(r, 0) + 1
        return out

    def overlaps(self, hashes: BlockHashes) -> dict[ReplicaId, int]:
        out: dict[ReplicaId, int] = {}
        alive: set[ReplicaId] | None = None
        for i, h in enumerate(hashes.tolist()):
            here = self.blocks.get(h)
            if not here:
                break
            alive = set(here) if alive is None else alive & here
            if not alive:
                break
            for r in alive:
                out[r] = i + 1
        return out


def naive_dynamo_choose(
    index: NaiveIndex, req: RouteRequest, replicas: list[ReplicaState]
) -> ReplicaId:
    overlap = index.overlaps(req.block_hashes)
    bt = req.block_tokens
    best, best_cost = replicas[0], math.inf
    for r in replicas:
        o = overlap.get(r.replica_id, 0)
        cost = (r.queued_prefill_tokens + req.prompt_tokens - o * bt) / bt + r.decode_blocks
        if cost < best_cost:
            best, best_cost = r, cost
    return best.replica_id


def time_calls(fn, requests: list[RouteRequest], repeats: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Wall-clock and CPU-time percentiles per call (medians over repeats). On a shared machine
    the wall-clock tail is mostly the scheduler; the thread's CPU time is what the code costs."""
    runs = []
    for _ in range(repeats):
        wall = np.empty(len(requests))
        cpu = np.empty(len(requests))
        gc.disable()
        t_all = time.perf_counter()
        for i, req in enumerate(requests):
            c0 = time.thread_time_ns()
            t0 = time.perf_counter_ns()
            fn(req)
            wall[i] = time.perf_counter_ns() - t0
            cpu[i] = time.thread_time_ns() - c0
        elapsed = time.perf_counter() - t_all
        gc.enable()
        runs.append(
            (
                float(np.percentile(wall, 50)) / 1e3,
                float(np.percentile(wall, 99)) / 1e3,
                len(requests) / elapsed,
                float(np.percentile(cpu, 50)) / 1e3,
                float(np.percentile(cpu, 99)) / 1e3,
            )
        )
    keys = ("p50_us", "p99_us", "decisions_per_s", "cpu_p50_us", "cpu_p99_us")
    return {k: statistics.median(r[i] for r in runs) for i, k in enumerate(keys)}


def run(n: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    n_blocks = args.prompt_tokens // BLOCK_TOKENS
    fleet = build_fleet(rng, n, args.blocks_per_replica, n_blocks)
    requests = make_requests(rng, fleet, args.requests, n_blocks)

    index = GlobalPrefixIndex(capacity_blocks=n * args.blocks_per_replica)
    t0 = time.perf_counter()
    for r, c in fleet.holders:
        index.add(fleet.replicas[r].replica_id, BlockHashes.from_array(fleet.chains[c]))
    build_s = time.perf_counter() - t0
    entries = index.num_entries()
    bytes_per_entry = index.bytes_per_entry()

    naive = NaiveIndex()
    tracemalloc.start()
    for r, c in fleet.holders:
        naive.add(fleet.replicas[r].replica_id, fleet.chains[c].tolist())
    naive_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()

    ctx = RoutingContext(
        clock=ManualClock(), block_tokens=BLOCK_TOKENS, index=index, rng=random.Random(args.seed)
    )
    out: dict[str, Any] = {
        "replicas": n,
        "index_entries": entries,
        "index_blocks": index.num_blocks,
        "bytes_per_entry": bytes_per_entry,
        "naive_bytes_per_entry": naive_bytes / entries,
        "index_build_s": build_s,
    }
    reps = fleet.replicas
    policies: dict[str, dict[str, float]] = {}
    for name in args.policies:
        policy = make_policy(name, ctx)

        def choose(req: RouteRequest, p: RoutingPolicy = policy) -> RouteDecision:
            return p.choose(req, reps)

        policies[name] = time_calls(choose, requests, args.repeats)
    policies["naive_dynamo"] = time_calls(
        lambda req: naive_dynamo_choose(naive, req, reps), requests, args.repeats
    )
    # the index query alone, and agreement with the naive walk (a correctness check)
    policies["index_match"] = time_calls(
        lambda req: index.match(req.block_hashes), requests, args.repeats
    )
    disagree = sum(
        dict(index.match(q.block_hashes).device) != naive.overlaps(q.block_hashes)
        for q in requests[:200]
    )
    out["policies"] = policies
    out["match_disagreements"] = disagree
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--replicas", default="64", help="comma-separated replica counts (16,64)")
    ap.add_argument("--prompt-tokens", type=int, default=32768)
    ap.add_argument("--blocks-per-replica", type=int, default=20_000)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--policy", default="cost", help="headline policy for the JSON fields")
    ap.add_argument("--policies", default="cost,precise,chash,peer_dynamo,peer_llmd")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    args.policies = [p for p in args.policies.split(",") if p]
    if args.policy not in args.policies:
        args.policies.insert(0, args.policy)
    counts = sorted(int(x) for x in args.replicas.split(","))
    print(
        f"route_decision: replicas={counts} prompt_tokens={args.prompt_tokens} "
        f"blocks/replica={args.blocks_per_replica} requests={args.requests} repeats={args.repeats} "
        f"seed={args.seed} git={git_rev()} python={sys.version.split()[0]} "
        f"load average={os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    runs = [run(n, args) for n in counts]
    for res in runs:
        pol = res["policies"]
        assert isinstance(pol, dict)
        naive = pol["naive_dynamo"]
        print(
            f"\n{res['replicas']} replicas: {res['index_entries']:,} (block, replica) entries, "
            f"{res['bytes_per_entry']:.1f} B/entry (naive dict of sets: "
            f"{res['naive_bytes_per_entry']:.1f} B/entry, "
            f"x{res['naive_bytes_per_entry'] / res['bytes_per_entry']:.1f}); "
            f"match disagreements with the naive walk: {res['match_disagreements']}/200"
        )
        print(
            f"  {'policy':<14}{'p50 us':>9}{'p99 us':>9}{'cpu p50':>9}{'cpu p99':>9}"
            f"{'decisions/s':>13}{'naive p50 / p50':>17}"
        )
        for name, t in pol.items():
            print(
                f"  {name:<14}{t['p50_us']:>9.1f}{t['p99_us']:>9.1f}{t['cpu_p50_us']:>9.1f}"
                f"{t['cpu_p99_us']:>9.1f}{t['decisions_per_s']:>13,.0f}"
                f"{naive['p50_us'] / t['p50_us']:>17.2f}"
            )
    head = runs[-1]
    pol = head["policies"]
    assert isinstance(pol, dict)
    result = {
        "p50_us": pol[args.policy]["p50_us"],
        "p99_us": pol[args.policy]["p99_us"],
        "decisions_per_s": pol[args.policy]["decisions_per_s"],
        "cpu_p50_us": pol[args.policy]["cpu_p50_us"],
        "cpu_p99_us": pol[args.policy]["cpu_p99_us"],
        "load_average": os.getloadavg()[0],
        "bytes_per_entry": head["bytes_per_entry"],
        "policy": args.policy,
        "replicas": head["replicas"],
        "prompt_tokens": args.prompt_tokens,
        "seed": args.seed,
        "git_rev": git_rev(),
        "runs": runs,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
