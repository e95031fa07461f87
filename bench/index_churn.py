"""The event-fed index under an engine's churn: stores and evictions applied, against a naive
index in the same run.

    nice python bench/index_churn.py ../shared/traces/mooncake_conversation.jsonl [--json out.json]

Replays the trace's first ``--requests`` prompts into ``--replicas`` kvtide caches (LRU,
``--capacity-blocks`` 16-token blocks each, hashed as the simulator hashes a trace's
requests; a prompt goes to the replica its first four trace blocks hash to, so conversations
keep their replica), and records the caches' KV events: what engines under steady eviction
publish. Then times applying them, request by request, to a ``GlobalPrefixIndex`` (what the
gateway's intake and the simulator's precise routers keep) and to the peer,
``bench/route_decision.py``'s dict of block hash -> set of replicas (a Dynamo-style index),
and checks that both end holding the same blocks per replica. Prints the medians of
``--runs`` runs in µs per request, their ratio, and bytes per (block, replica) entry (the
peer's measured with tracemalloc).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Any

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.events import KVEvent
from kvtide.core.hashing import request_block_hashes
from kvtide.errors import KvtideError
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.types import ReplicaId
from kvtide.workloads import read_mooncake
from revision import git_rev
from route_decision import NaiveIndex

BLOCK_TOKENS = 16  # the engines' block
Batch = tuple[ReplicaId, list[KVEvent]]


def engine_events(trace: Path, requests: int, replicas: int, capacity_blocks: int) -> list[Batch]:
    """Each request's KV events from the cache it was routed to, in arrival order."""
    caches = [
        KVCache(
            CacheConfig(capacity_blocks=capacity_blocks, record_events=True, ghost_blocks=0),
            ManualClock(),
        )
        for _ in range(replicas)
    ]
    names = [ReplicaId(f"r{i}") for i in range(replicas)]
    out: list[Batch] = []
    for i, req in enumerate(read_mooncake(trace)):
        if i >= requests:
            break
        hashes = request_block_hashes(req, BLOCK_TOKENS, 7)
        k = hash((req.block_ids or ())[:4]) % replicas
        caches[k].access(hashes, BLOCK_TOKENS * len(hashes))
        out.append((names[k], caches[k].take_events()))
    return out


def timed(make: Any, batches: list[Batch]) -> tuple[float, Any]:
    index = make()
    t0 = time.perf_counter()
    for replica, events in batches:
        index.apply_all(replica, events)
    return (time.perf_counter() - t0) / len(batches) * 1e6, index


def naive_bytes_per_entry(batches: list[Batch]) -> float:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    _, index = timed(NaiveIndex, batches)
    size = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    entries = sum(index.replica_blocks().values())
    return size / entries if entries else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("trace", type=Path, help="a Mooncake jsonl trace")
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--capacity-blocks", type=int, default=16_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if not args.trace.is_file():
        p.error(f"trace: no such file: {args.trace}")
    for flag in ("requests", "replicas", "capacity_blocks", "runs"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    try:
        batches = engine_events(args.trace, args.requests, args.replicas, args.capacity_blocks)
    except KvtideError as exc:  # a malformed row: its file, line and field
        p.error(str(exc))
    num_events = sum(len(events) for _, events in batches)
    print(
        f"index_churn: rev {git_rev()}\n  {len(batches):,} requests, {num_events:,} events, "
        f"{args.replicas} replicas of {args.capacity_blocks:,} blocks"
    )
    kvtide_us: list[float] = []
    naive_us: list[float] = []
    for _ in range(args.runs):  # alternating, so that both see the same machine
        us, index = timed(GlobalPrefixIndex, batches)
        kvtide_us.append(us)
        us, naive = timed(NaiveIndex, batches)
        naive_us.append(us)
    if index.replica_blocks() != naive.replica_blocks():
        raise SystemExit("the two indexes disagree on what each replica holds")
    result = {
        "requests": len(batches),
        "events": num_events,
        "kvtide_us_per_request": statistics.median(kvtide_us),
        "naive_us_per_request": statistics.median(naive_us),
        "kvtide_bytes_per_entry": index.bytes_per_entry(),
        "naive_bytes_per_entry": naive_bytes_per_entry(batches),
        "entries": index.num_entries(),
    }
    ratio = result["kvtide_us_per_request"] / result["naive_us_per_request"]
    print(
        f"  GlobalPrefixIndex  {result['kvtide_us_per_request']:8.0f} us/request  "
        f"{result['kvtide_bytes_per_entry']:6.1f} B/entry\n"
        f"  naive dict of sets {result['naive_us_per_request']:8.0f} us/request  "
        f"{result['naive_bytes_per_entry']:6.1f} B/entry\n"
        f"  kvtide/naive time {ratio:.2f}x (medians of {args.runs} runs)\n"
        f"  {result['entries']:,} (block, replica) entries at the end"
    )
    if args.json:
        config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"config": config, "result": result}, indent=2))


if __name__ == "__main__":
    main()
