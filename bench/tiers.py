"""Tiered cache on a trace: hit ratio (all tiers and by tier), host writes and their cut by the
admission filter, against an infinite cache (the peer) and the unfiltered run.

    python bench/tiers.py ../shared/traces/mooncake_conversation.jsonl \
        --device-capacity 1M --host-capacity 10M --admission none seen-twice
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kvtide.clock import ManualClock
from kvtide.core.hashing import BlockHashes, Namespace, request_block_hashes
from kvtide.core.tiers import OnboardCost, TieredCache, TieredCacheConfig, TierSpec, WriteMode
from kvtide.costs.cost_model import CostModel
from kvtide.costs.specs import gpu_preset, resolve_model
from kvtide.types import Tier
from kvtide.workloads import open_workload
from revision import git_rev


def tokens(text: str) -> int:
    """``512``, ``100k``, ``1M``, ``1.5G`` (decimal multiples)."""
    scale = {"k": 10**3, "m": 10**6, "g": 10**9}.get(text[-1:].lower(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    hit_ratio: float
    by_tier: dict[str, float]
    host_writes: int
    disk_writes: int
    reloaded_ratio: float
    prefill_s_saved: float
    wall_s: float


def load(path: str, block_tokens: int) -> list[tuple[float, BlockHashes, int]]:
    seed = Namespace().seed
    return [
        (r.arrival_s, request_block_hashes(r, block_tokens, seed), r.prompt_tokens)
        for r in open_workload(path)
    ]


def replay(
    requests: Sequence[tuple[float, BlockHashes, int]],
    config: TieredCacheConfig,
    runs: int,
    cost: OnboardCost | None = None,
) -> tuple[TieredCache, float]:
    times = []
    for _ in range(runs):
        clock = ManualClock()
        cache = TieredCache(config, clock, cost)
        start = time.perf_counter()
        for arrival_s, hashes, prompt_tokens in requests:
            clock.set(max(arrival_s, clock.now()))
            cache.access(hashes, prompt_tokens)
        times.append(time.perf_counter() - start)
    return cache, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--block-tokens", type=int, default=512)
    parser.add_argument("--device-capacity", type=tokens, default=tokens("1M"))
    parser.add_argument("--host-capacity", type=tokens, default=tokens("10M"))
    parser.add_argument("--disk-capacity", type=tokens, default=0)
    parser.add_argument("--policy", default="lru", help="eviction policy of every tier")
    parser.add_argument(
        "--host-policy", help="eviction policy of the host tier (default: --policy)"
    )
    parser.add_argument(
        "--admission", nargs="+", default=["none", "seen-twice"], help="host filters to compare"
    )
    parser.add_argument("--disk-admission", default="none")
    parser.add_argument("--write-mode", default="write-back", choices=[m.value for m in WriteMode])
    parser.add_argument("--model", default="llama-3-8b", help="cost model (prefill s saved)")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--runs", type=int, default=1, help="timing runs (median)")
    args = parser.parse_args()
    rev = git_rev()
    bt = args.block_tokens
    cost = CostModel(resolve_model(args.model), gpu_preset(args.gpu))
    requests = load(args.trace, bt)
    print(
        f"git {rev}  trace {args.trace}  requests {len(requests)}  block {bt} tokens  "
        f"device {args.device_capacity}  host {args.host_capacity}  disk {args.disk_capacity} "
        f"tokens  disk admission {args.disk_admission}  policy {args.policy}  "
        f"host policy {args.host_policy or args.policy}  "
        f"{args.write_mode}  cost {args.model} on {args.gpu}  runs {args.runs} (median)  seed 0"
    )
    total_blocks = sum(len(h) for _, h, _ in requests)
    unbounded = TieredCacheConfig(TierSpec(total_blocks), block_tokens=bt)
    infinite, inf_s = replay(requests, unbounded, 1)
    peer = infinite.stats().hit_ratio

    def spec(capacity: int, admission: str, policy: str) -> TierSpec | None:
        if capacity < bt:
            return None
        return TierSpec(capacity // bt, policy, admission=admission)

    rows = []
    for admission in args.admission:
        config = TieredCacheConfig(
            TierSpec(args.device_capacity // bt, args.policy),
            spec(args.host_capacity, admission, args.host_policy or args.policy),
            spec(args.disk_capacity, args.disk_admission, args.policy),
            block_tokens=bt,
            write_mode=WriteMode(args.write_mode),
        )
        cache, wall_s = replay(requests, config, args.runs, cost)
        s = cache.stats()
        rows.append(
            Row(
                admission,
                s.hit_ratio,
                s.hit_ratio_by_tier,
                s.written_blocks(Tier.HOST),
                s.written_blocks(Tier.DISK),
                s.reloaded_ratio,
                s.prefill_s_saved,
                wall_s,
            )
        )
    print(f"infinite cache (peer): hit ratio {peer:.4f}  ({inf_s:.1f} s)")
    base = rows[0]
    print(
        f"{'admission':12} {'hit':>7} {'device':>7} {'host':>7} {'disk':>7} {'x inf':>6} "
        f"{'host writes':>11} {'x ' + base.label:>9} {'loss pts':>8} {'disk writes':>11} "
        f"{'reloaded':>8} {'saved s':>8} {'wall s':>7}"
    )
    for r in rows:
        print(
            f"{r.label:12} {r.hit_ratio:7.4f} {r.by_tier['device']:7.4f} {r.by_tier['host']:7.4f} "
            f"{r.by_tier['disk']:7.4f} {r.hit_ratio / peer:6.3f} {r.host_writes:11d} "
            f"{r.host_writes / max(base.host_writes, 1):9.3f} "
            f"{100 * (base.hit_ratio - r.hit_ratio):8.2f} {r.disk_writes:11d} "
            f"{r.reloaded_ratio:8.4f} {r.prefill_s_saved:8.1f} {r.wall_s:7.1f}"
        )


if __name__ == "__main__":
    main()
