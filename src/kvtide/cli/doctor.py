"""`kvtide doctor`: a diagnosis of a cache or fleet from its metrics, events or a simulation.

With a workload (``--workload``, or the one a simulator JSON names) the ceilings are computed
on it: the infinite cache and Belady's optimum at the observed capacity (``core.oracle``), and
the capacity whose hit ratio with the eviction policy reaches ``--target`` of the infinite
cache, found by replaying the workload through the core cache (as ``kvtide replay`` does) and
checked in the fleet simulator at that size.
"""

from __future__ import annotations

import argparse
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from kvtide.cli import _doctor_sources as sources
from kvtide.cli.replay import Prepared, prepare, replay_one
from kvtide.core.oracle import Oracle
from kvtide.errors import ConfigError
from kvtide.quantities import flag, integer, real
from kvtide.sim.scenario import Scenario
from kvtide.sim.scenario import run as simulate
from kvtide.telemetry.diagnosis import Bounds, Observed, diagnose
from kvtide.workloads.workload import MAX_REQUESTS

QUERY = '{__name__=~"kvtide_.*"}'
TIMEOUT_S = 10.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="diagnose a cache or fleet: what the hit ratio could be, what limits it, "
        "what to change",
        description=(
            "Reads a Prometheus server (its HTTP API), a scrape file (text exposition), a KV "
            "event log (JSON lines of vLLM KVEventBatch arrays), a simulator JSON (as kvtide "
            "simulate writes it) or a gateway's access log (kvtide serve --access-log) and "
            "prints what the hit ratio could be (infinite cache; Belady's optimum at this size "
            "when the workload is known), what limits it (capacity, routing spread, tenant "
            "quota, fragmentation, event loss, predicted hits not served) and what to change "
            "(the pool size that reaches --target of the infinite cache)."
        ),
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--prometheus", metavar="URL", help="a Prometheus server, e.g. http://127.0.0.1:9090"
    )
    src.add_argument("--scrape", type=Path, metavar="FILE", help="a /metrics text exposition")
    src.add_argument("--events", type=Path, metavar="FILE", help="a KV event log (JSON lines)")
    src.add_argument(
        "--simulation", type=Path, metavar="FILE", help="a JSON file kvtide simulate wrote"
    )
    src.add_argument(
        "--access-log",
        type=Path,
        metavar="FILE",
        help="a kvtide serve --access-log file (JSON lines): hits per replica, route and "
        "tenant, predicted hits the engines did not serve, retries, errors, TTFT",
    )
    parser.add_argument(
        "--workload",
        metavar="SPEC",
        help="the observed workload (trace path or builtin:NAME) to compute the ceilings on",
    )
    parser.add_argument(
        "--requests",
        type=flag(integer, minimum=1, maximum=MAX_REQUESTS),
        metavar="N",
        help="first N",
    )
    parser.add_argument("--policy", default="tide", metavar="P", help="eviction policy (tide)")
    parser.add_argument(
        "--capacity-tokens",
        type=flag(integer, minimum=1),
        metavar="N",
        help="the fleet's device KV in tokens, all replicas together, where the source does "
        "not say it (an access log); the replay's capacity",
    )
    parser.add_argument(
        "--target",
        type=flag(real, minimum=0.01, maximum=1.0),
        default=0.9,
        metavar="X",
        help="share of the infinite cache's hit ratio the proposed pool must reach (0.9)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    workload: str | None = args.workload
    limit = int(args.requests) if args.requests else None
    setup: dict[str, Any] | None = None
    if args.prometheus is not None:
        observed = sources.from_samples(args.prometheus, _query(args.prometheus))
    elif args.scrape is not None:
        try:
            text = args.scrape.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--scrape: {args.scrape}: cannot read: {exc}") from exc
        observed = sources.from_samples(
            str(args.scrape), sources.parse_exposition(text, f"--scrape: {args.scrape}")
        )
    elif args.events is not None:
        observed = sources.from_event_log(args.events)
    elif args.access_log is not None:
        observed = sources.from_access_log(args.access_log)
    else:
        observed, wl = sources.from_simulation(args.simulation)
        setup = wl["setup"]
        params = wl.get("params") or {}
        workload = workload or params.get("spec")
        limit = limit or wl.get("limit")
    bounds = None
    if workload is not None:
        bounds = _bounds(
            observed, workload, limit, args.policy, args.target, setup, args.capacity_tokens
        )
    for line in diagnose(observed, bounds).lines():
        print(line)
    return 0


def _query(url: str) -> list[sources.Sample]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"--prometheus: not an http(s) URL: {url!r}")
    q = urllib.parse.urlencode({"query": QUERY})
    full = f"{url.rstrip('/')}/api/v1/query?{q}"
    try:
        with urllib.request.urlopen(full, timeout=TIMEOUT_S) as resp:
            doc = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ConfigError(f"--prometheus: {url}: {exc}") from exc
    return sources.parse_query_result(doc, f"--prometheus: {url}")


def _bounds(
    o: Observed,
    workload: str,
    limit: int | None,
    policy: str,
    target: float,
    setup: dict[str, Any] | None,
    capacity_tokens: int | None = None,
) -> Bounds:
    data = prepare(workload, block_tokens=None, limit=limit, seed=0, tenant_salt=False)
    bt = data.block_tokens
    total = int(data.prompt_tokens.sum())
    oracle = Oracle(data.all_hashes())
    infinite = oracle.infinite_hit_blocks * bt / total
    if capacity_tokens is not None:
        o.capacity_blocks = float(max(1, capacity_tokens // bt))
    elif not o.capacity_blocks:
        o.notes.append(
            "the source does not say the fleet's KV size: the replay guessed a tenth of the "
            "workload's footprint (give --capacity-tokens)"
        )
    capacity_blocks = int(o.capacity_blocks) or max(1, len(data.raw) // 8 // 10)
    capacity = capacity_blocks * bt
    optimum = oracle.run(capacity_blocks).hit_blocks * bt / total
    now = replay_one(data, policy, capacity)
    if not o.miss_tokens or not o.miss_causes:  # a source without miss causes: the replay's
        o.miss_tokens = {
            "cold": now["miss_tokens"]["cold"],
            "evicted": now["miss_tokens"]["evicted"],
            "other_namespace": now["miss_tokens"]["other_namespace"],
            "partial_block": now["miss_tokens"]["partial"],
        }
        o.evicted_blocks = o.evicted_blocks or now["evictions"]
        scale = o.prompt_tokens / total if o.prompt_tokens else 1.0
        o.miss_tokens = {k: v * scale for k, v in o.miss_tokens.items()}
        o.miss_causes = True
        o.notes.append(f"miss causes from replaying {workload} at {capacity:,} tokens")
    found = _smallest(data, policy, capacity, target * infinite)
    simulated = None
    if found is not None and setup is not None:
        simulated = _simulate_at(workload, limit, setup, found[0], o)
    return Bounds(
        infinite_hit_ratio=infinite,
        optimum_hit_ratio=optimum,
        capacity_tokens=capacity,
        target_share=target,
        target_capacity_tokens=found[0] if found else None,
        target_hit_ratio=found[1] if found else None,
        policy_hit_ratio=float(now["hit_ratio"]),
        simulated=simulated,
    )


def _smallest(data: Prepared, policy: str, start: int, wanted: float) -> tuple[int, float] | None:
    """The smallest capacity (to 5%) whose replayed hit ratio reaches ``wanted``: doubling
    from ``start`` up to the workload's footprint, then bisection on a log scale."""
    bt = data.block_tokens
    footprint = len(data.raw) // 8 * bt  # every full block once: more can never help
    hit = float(replay_one(data, policy, start)["hit_ratio"])
    if hit >= wanted:
        return start, hit
    lo, hi, hi_hit = start, start, hit
    while hi_hit < wanted:
        if hi >= footprint:
            return None
        lo, hi = hi, min(footprint, hi * 2)
        hi_hit = float(replay_one(data, policy, hi)["hit_ratio"])
    while hi > lo * 1.05 and hi - lo > bt:
        mid = int(math.sqrt(lo * hi))
        h = float(replay_one(data, policy, mid)["hit_ratio"])
        if h >= wanted:
            hi, hi_hit = mid, h
        else:
            lo = mid
    return hi, hi_hit


def _simulate_at(
    workload: str, limit: int | None, setup: dict[str, Any], total_tokens: int, o: Observed
) -> str:
    replicas = int(setup["replicas"])
    best = (
        max(o.routing_hit_ratios.items(), key=lambda kv: kv[1])[0]
        if o.routing_hit_ratios
        else "precise"
    )
    per = max(1, total_tokens // replicas)
    scenario = Scenario(
        workload=workload,
        requests=limit,
        model=str(setup["model"]),
        gpu=str(setup["gpu"]),
        tp=int(setup["tp"]),
        replicas=replicas,
        router=best,
        gpu_cache_tokens=per,
        seed=int(setup.get("seed", 0)),
        load=1.5 if workload.startswith("builtin") else None,
    )
    r = simulate(scenario).summary
    return (
        f"{replicas} replicas x {per:,} tokens, router {best}: hit ratio "
        f"{100 * r.hit_ratio:.1f}%, TTFT p99 {r.ttft_s.p99:.3f} s"
    )
