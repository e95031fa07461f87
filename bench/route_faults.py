"""How much hit ratio event lag and event loss cost ``precise`` and ``cost`` (a mini fleet).

    nice python bench/route_faults.py --workload builtin:mixed --replicas 8 --json out.json
    nice python bench/route_faults.py --workload ../shared/traces/mooncake_conversation.jsonl

Replays a workload over ``--replicas`` kvtide caches behind one routing policy. Each cache's KV
events travel to the router's index through a ``LossyDelayedChannel`` (none; ``--lag-s`` of
lag; ``--loss`` of batches lost) and a ``KVEventIngest`` that detects gaps and resyncs from a
snapshot of the cache. A request holds its replica (bounded-load accounting) for its prefill
time from the cost model plus ``--decode-s-per-token`` per output token; caches serve it at
arrival. This is not the simulator (no batching, no queueing): it isolates the index's error.
Prints the token hit ratio per policy and condition, and the drop against perfect events.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import sys
import time
from pathlib import Path

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.hashing import Namespace, request_block_hashes
from kvtide.routing import (
    GlobalPrefixIndex,
    ReplicaState,
    RouteRequest,
    RoutingContext,
    make_policy,
)
from kvtide.routing.faults import LossyDelayedChannel
from kvtide.routing.ingest import KVEventIngest, snapshot_events
from kvtide.routing.router import Router
from kvtide.routing.ttft import default_ttft_model
from kvtide.types import Request
from kvtide.workloads.registry import open_workload
from revision import git_rev


def run(
    requests: list[tuple[Request, RouteRequest]],
    args: argparse.Namespace,
    policy_name: str,
    lag_s: float,
    loss: float,
) -> dict[str, float]:
    clock = ManualClock()
    index = GlobalPrefixIndex()
    ctx = RoutingContext(block_tokens=args.block_tokens, clock=clock, index=index)
    options: dict[str, object] = (
        {"capacity_blocks": args.capacity_blocks} if policy_name == "approx" else {}
    )
    reps = [
        ReplicaState(f"r{i}", capacity_blocks=args.capacity_blocks) for i in range(args.replicas)
    ]
    router = Router(make_policy(policy_name, ctx, options), reps)
    caches = {
        r.replica_id: KVCache(
            CacheConfig(
                capacity_blocks=args.capacity_blocks,
                block_tokens=args.block_tokens,
                record_events=True,
                ghost_blocks=0,
            ),
            clock,
        )
        for r in reps
    }
    ingest = KVEventIngest(index, clock, ctx.health)
    channel = LossyDelayedChannel(random.Random(args.seed), delay_s=lag_s, loss_prob=loss)
    model = ctx.ttft_model
    done: list[tuple[float, int, RouteRequest, object, int]] = []

    def pump(now: float) -> None:
        for b in channel.deliver(now):
            if ingest.receive(b.replica, b.seq, b.events, b.sent_s) is not None:
                ingest.resync(
                    b.replica, channel.next_seq(b.replica), snapshot_events(caches[b.replica])
                )

    for seq, (req, rreq) in enumerate(requests):
        now = req.arrival_s
        while done and done[0][0] <= now:
            t, _, q, d, out = heapq.heappop(done)
            clock.set(max(clock.now(), t))
            router.complete(q, d, out)  # type: ignore[arg-type]
        clock.set(max(clock.now(), now))
        pump(clock.now())
        d = router.route(rreq)
        cache = caches[d.replica]
        acc = cache.access(rreq.block_hashes, rreq.prompt_tokens)
        router.prefill_done(rreq, d, reported_cached_tokens=acc.hit_blocks * args.block_tokens)
        channel.send(d.replica, cache.take_events(), clock.now())
        new = rreq.prompt_tokens - acc.hit_blocks * args.block_tokens
        busy_s = model.prefill_time(new, acc.hit_blocks * args.block_tokens)
        busy_s += req.output_tokens * args.decode_s_per_token
        heapq.heappush(done, (now + busy_s, seq, rreq, d, req.output_tokens))
    hit = sum(c.stats().hit_tokens for c in caches.values())
    total = sum(c.stats().prompt_tokens for c in caches.values())
    h = ctx.health.summary()
    return {
        "hit_ratio": hit / total,
        "precision": h.precision,
        "recall": h.recall,
        "gaps": float(ingest.counters.gaps),
        "resyncs": float(ingest.counters.resyncs),
        "batches_lost": float(channel.counters.dropped),
        "max_lag_s": h.max_lag_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workload", default="builtin:mixed")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--capacity-blocks", type=int, default=20_000)
    ap.add_argument("--policies", default="precise,cost,chash,approx")
    ap.add_argument("--lag-s", type=float, default=1.0)
    ap.add_argument("--loss", type=float, default=0.01)
    ap.add_argument("--decode-s-per-token", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rev = git_rev()
    print(
        f"route_faults: workload={args.workload} requests={args.requests} replicas={args.replicas} "
        f"block_tokens={args.block_tokens} capacity_blocks={args.capacity_blocks} "
        f"lag_s={args.lag_s} "
        f"loss={args.loss} seed={args.seed} git={rev} python={sys.version.split()[0]} "
        f"load average={os.getloadavg()[0]:.1f}"
    )
    t0 = time.perf_counter()
    seed = Namespace().seed
    wl = open_workload(
        args.workload, block_tokens=args.block_tokens, limit=args.requests, seed=args.seed
    )
    requests = []
    for req in wl:
        hashes = request_block_hashes(req, args.block_tokens, seed)
        requests.append(
            (
                req,
                RouteRequest(
                    hashes,
                    req.prompt_tokens,
                    args.block_tokens,
                    request_id=req.request_id,
                    session_id=req.session_id,
                ),
            )
        )
    print(f"{len(requests)} requests hashed in {time.perf_counter() - t0:.1f} s")
    _ = default_ttft_model()
    conditions = [
        ("perfect", 0.0, 0.0),
        (f"lag {args.lag_s:g}s", args.lag_s, 0.0),
        (f"loss {args.loss:.0%}", 0.0, args.loss),
    ]
    results: dict[str, dict[str, dict[str, float]]] = {}
    print(
        f"\n{'policy':<10}{'condition':<12}{'hit ratio':>10}{'drop (pts)':>12}{'precision':>11}"
        f"{'recall':>8}{'gaps':>6}{'resyncs':>9}"
    )
    for name in args.policies.split(","):
        results[name] = {}
        for label, lag, loss in conditions:
            res = run(requests, args, name, lag, loss)
            results[name][label] = res
            drop = 100 * (results[name]["perfect"]["hit_ratio"] - res["hit_ratio"])
            print(
                f"{name:<10}{label:<12}{res['hit_ratio']:>10.4f}{drop:>12.2f}{res['precision']:>11.3f}"
                f"{res['recall']:>8.3f}{res['gaps']:>6.0f}{res['resyncs']:>9.0f}"
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"git_rev": rev, "args": vars(args) | {"json": str(args.json)}, "results": results},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
