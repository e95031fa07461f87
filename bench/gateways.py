"""kvtide's gateway beside sglang-router, smg and vllm-router, in front of the same four
emulated engines, in one run.

    python bench/gateways.py --peers-venv /work/peers-venv \
        --trace ../shared/traces/mooncake_conversation.jsonl [--json out.json]

Phases, each through every gateway in turn (kvtide `cost` in token mode with the engines' KV
events; the peers as PEERS.md starts them, from a separate venv; a peer not installed there is
skipped):

1. workloads, each sized so that the fleet's KV is the scarce resource: a built-in multi-turn
   chat workload (``--sessions`` sessions of up to 6 turns over ``--system-prompts`` shared
   system prompts of ~1,200 tokens, ``--think-s`` s of think time, ``--duration`` s) and the
   Mooncake conversation trace (its first ``--trace-requests`` requests sent over
   ``--trace-duration`` s, outputs capped at ``--max-output-tokens``, prompts that do not fit
   ``--max-model-len`` left out), sent by kvtide's load generator: cached-token ratio (the
   engines' ``usage``), TTFT p50/p99, TPOT p50/p99 (what a lower TTFT tail may cost the
   requests decoding), and the gateway's CPU (/proc of its PID) per request, and while idle.
   The engines are sized from each workload (``size_engines``): the fleet's KV is
   ``--kv-fraction`` of the KV the workload needs (the larger of its peak reused tokens and
   the LRU cache that serves 90% of its reuse, ``kvtide.workloads.stats``), and their
   ``--speedup`` makes its prefill with no hit ``--load`` of the fleet's capacity; printed as
   "sizing". Each gateway gets freshly restarted engines (cold caches) and the same
   requests; ``--workloads`` picks chat, mooncake or both; ``--api messages`` sends them as
   Anthropic Messages requests (``/v1/messages``, the system prompt apart), ``--api
   responses`` as OpenAI Responses requests (``/v1/responses``, the system prompt as
   ``instructions``, the whole conversation each turn). ``--repeat N``
   runs every gateway N times, in rounds (all gateways, then all again), and prints medians;
   the JSON keeps each run. ``--only "kvtide cost:affinity_share=0.2"`` runs a `cost` with
   options beside, and ``--only "kvtide cost cap 4"`` one with
   ``limits.max_in_flight_per_replica: 4`` (requests beyond 4 per engine wait in the
   gateway's queue). ``--scheduling-policy priority`` starts every engine admitting by vLLM's
   ``priority``, which ``kvtide cost:deadline_k=10`` sets (the peers send none, so their
   requests are served in arrival order as under fcfs). ``--pd P`` runs it disaggregated:
   the first P engines only prefill and the rest only decode (every engine with
   ``--kv-transfer-config``, vLLM's NixlConnector protocol; their KV and speed sized on the
   P), kvtide given them by role and vllm-router with ``--vllm-pd-disaggregation``
   (sglang-router's and smg's P/D mode is SGLang's protocol, which vLLM engines do not speak:
   skipped).
2. overhead: ``--overhead-rate`` req/s (Poisson) of short-output chat requests for
   ``--overhead-duration`` s against engines that take no model time (``--speedup 1e5``),
   through each gateway and straight to the engines (the client picks them round robin):
   added TTFT p50/p99 over the direct run, and gateway CPU per request (kvtide also in text
   mode), beside the floor of a Python proxy on kvtide's stack (``bench/gateway_cpu.py``'s
   bare uvicorn + pool proxy, no parsing or routing, the engines in turn) and each
   gateway's CPU over it; for kvtide also its own time a request, the mean of its
   ``kvtide_gateway_overhead_seconds`` (arrival to the engine's connection) over the phase.
3. hot prefixes: every request carries one of two long system prompts, engines batch at most
   ``--hot-max-seqs`` sequences so they queue: per engine, the share of requests served, and
   the fraction of samples (every 0.2 s from the engines' /metrics) in which some engine is
   idle while requests queue, at another engine beyond its batch slots or in kvtide's own
   queue (its ``kvtide_gateway_queued``), in all and while the requests are being sent
   (after the last send, an engine that finished its share idles beside another's queue
   whatever the router did); and, apart, beside any request waiting, one that arrived
   during an engine's iteration included (``count_samples``). As the workloads: fresh
   engines for each run, ``--repeat`` rounds, one text per round for every gateway (which
   replicas the two prefixes hash to decides whether they share engines), the ``kvtide
   cost:`` variants of ``--only``.

Prints its configuration and git revision, each table, and ratios against kvtide.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from kvtide.cli.demo import ENGINE_SERIES, parse_engine_metrics
from kvtide.cli.processes import (
    LOOPBACK,
    ChildProcess,
    Engine,
    ProcessGroup,
    free_port,
    proc_cpu_s,
    proc_rss_bytes,
    start_engine,
    start_gateway,
    wait_all_ready,
)
from kvtide.loadgen import LoadConfig, run_load, schedule, stream
from kvtide.loadgen.prompts import PromptBuilder
from kvtide.routing.ttft import default_ttft_model
from kvtide.text import smollm2
from kvtide.workloads import open_workload
from kvtide.workloads.stats import lru_reuse_tokens, peak_reused_tokens, stats
from revision import git_rev

MODEL = "emu"
IDLE_S = 3.0
KVTIDE = "kvtide cost"
KVTIDE_TEXT = "kvtide cost (text mode)"
# the floor of a Python proxy on kvtide's stack in the overhead phase: bytes in, bytes out
# (bench/gateway_cpu.py's bare uvicorn+pool proxy), the engines taken in turn
BARE = "bare proxy (uvicorn+pool)"
# `cost` with options, token mode (``kvtide cost:evict_weight=1``, routing/cost.py): run only
# when named in --only
KVTIDE_VARIANT = "kvtide cost:"
# `cost` in token mode with limits.max_in_flight_per_replica N (``kvtide cost cap 4``): late
# binding, requests beyond N per engine wait in the gateway's queue; run only when named
KVTIDE_CAP = "kvtide cost cap "
# name -> (module, policy, log level): started by module (sglang-router and smg both install an
# `smg` script), --host 127.0.0.1, distinct --prometheus-ports (PEERS.md)
PEERS: dict[str, tuple[str, str, str]] = {
    "sglang-router cache_aware": ("sglang_router.launch_router", "cache_aware", "warn"),
    "smg cache_aware": ("smg.launch_router", "cache_aware", "warn"),
    "vllm-router cache_aware": ("vllm_router.launch_router", "cache_aware", "warning"),
    "vllm-router round_robin": ("vllm_router.launch_router", "round_robin", "warning"),
}
# the peers that drive vLLM's P/D (NixlConnector's kv_transfer_params) and their flags for it;
# sglang-router's and smg's --pd-disaggregation is SGLang's protocol (both legs sent at once,
# a bootstrap room for the transfer), which vLLM engines do not speak
PD_PEERS: dict[str, list[str]] = {
    name: ["--vllm-pd-disaggregation", "--kv-connector", "nixl"]
    for name in PEERS
    if name.startswith("vllm-router")
}
NIXL = ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
CHAT = (
    "builtin:chat:sessions={s},turns=6,duration_s={d},system_prompts={p},system_tokens=1200,"
    "user_tokens=200,output_tokens=32,think_s={t},max_prompt_tokens=8000"
)
# the overhead phase's bodies: the earlier, small chat workload (its question is load and
# overhead, not capacity), with sessions enough for the requests asked for
SMALL_CHAT = (
    "builtin:chat:sessions={s},turns=4,duration_s={d},system_prompts=4,system_tokens=800,"
    "user_tokens=150,output_tokens=16,think_s={t},max_prompt_tokens=6000"
)
BLOCK_TOKENS = 16  # the engines' KV block
WATCH_S = 0.25  # the workloads phase samples every engine's queue this often
# the engines' counters the workloads phase reads at the end of a run (vLLM's names)
ENGINE_COUNTERS = {
    "vllm:request_success_total": "served",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:prefix_cache_hits_total": "cached_tokens",
}


def peer_python(peers_venv: Path) -> Path:
    """The interpreter of the peers' venv."""
    return peers_venv / "bin" / "python"


def peer_installed(python: Path, module: str) -> bool:
    if not python.exists():
        return False
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec('{module}') is None)"
    return subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def gateways_to_run(ours: Sequence[str], peers_venv: Path, only: str | None) -> list[str]:
    """``ours`` and every peer installed in ``peers_venv`` (saying which are skipped), narrowed
    to the comma-separated names of ``only`` when given."""
    python = peer_python(peers_venv)
    names = list(ours)
    for name, (module, _, _) in PEERS.items():
        if peer_installed(python, module):
            names.append(name)
        else:
            print(f"skipping {name}: {module} is not installed in {peers_venv}")
    if only:
        names = [n for n in names if n in only.split(",")]
    return names


class Front:
    """One gateway under test (or none: ``direct``), its URL and the PID whose CPU counts."""

    def __init__(self, name: str, url: str | None, child: ChildProcess | None) -> None:
        self.name = name
        self.url = url
        self.child = child

    def cpu_s(self) -> float:
        return proc_cpu_s(self.child.pid) if self.child else 0.0

    def rss_bytes(self) -> int:
        return proc_rss_bytes(self.child.pid) if self.child else 0


def start_front(
    name: str,
    group: ProcessGroup,
    engines: Sequence[Engine],
    peers_python: Path,
    prefill: int = 0,
) -> Front:
    """``name`` in front of ``engines`` (``prefill``: the first that many only prefill, the
    rest only decode, for the gateways that can split a request: ``PD_PEERS`` and kvtide)."""
    if name == BARE:
        port = free_port()
        script = Path(__file__).with_name("gateway_cpu.py")
        bases = ",".join(e.url for e in engines)
        args = [sys.executable, str(script), "--serve-bare", "uvicorn", "pool", str(port), bases]
        child = group.add(ChildProcess(args, name))
        url = f"http://{LOOPBACK}:{port}"
        wait_routable(url, child)
        return Front(name, url, child)
    if name in (KVTIDE, KVTIDE_TEXT) or name.startswith((KVTIDE_VARIANT, KVTIDE_CAP)):
        extra = [] if name == KVTIDE_TEXT else ["--tokenizer", "smollm2"]
        policy = name.removeprefix("kvtide ") if name.startswith(KVTIDE_VARIANT) else "cost"
        if name.startswith(KVTIDE_CAP):
            config = Path(tempfile.mkdtemp()) / "limits.yaml"
            cap = int(name.removeprefix(KVTIDE_CAP))
            config.write_text(f"limits:\n  max_in_flight_per_replica: {cap}\n")
            extra += ["--config", str(config)]
        gw = start_gateway(group, engines, policy, extra, prefill=prefill)
        wait_routable(gw.url, gw.process)  # the tokenizer loads on first use: not measured
        return Front(name, gw.url, gw.process)
    module, policy, level = PEERS[name]
    port = free_port()
    args = [
        str(peers_python),
        "-m",
        module,
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--policy",
        policy,
        "--log-level",
        level,
        "--prometheus-host",
        LOOPBACK,
        "--prometheus-port",
        str(free_port()),
    ]
    if prefill:
        args += PD_PEERS[name]
        for i, e in enumerate(engines):
            args += ["--prefill" if i < prefill else "--decode", e.url]
    else:
        args += ["--worker-urls", *(e.url for e in engines)]
    child = group.add(ChildProcess(args, name))
    url = f"http://{LOOPBACK}:{port}"
    wait_routable(url, child)
    return Front(name, url, child)


def wait_routable(url: str, child: ChildProcess, timeout_s: float = 90.0) -> None:
    """Until one chat request goes through (the peers probe their workers first)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}

    async def probe() -> bool:
        async with aiohttp.ClientSession() as s:
            try:
                async with s.post(
                    f"{url}/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(5)
                ) as r:
                    await r.read()
                    return r.status == 200
            except (aiohttp.ClientError, TimeoutError):
                return False

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not child.is_alive:
            break
        if asyncio.run(probe()):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{child.name} never routed a request: {child.tail()}")


def stop_front(front: Front, group: ProcessGroup) -> None:
    if front.child is not None:
        front.child.stop()
        group.children.remove(front.child)


def restart_engines(engines: Sequence[Engine], engine_args: Sequence[str]) -> None:
    """Fresh engines (cold caches, new flags) on the same ports."""
    for e in engines:
        e.process.stop()
        e.process.args = [
            *e.process.args[: e.process.args.index("--kv-events-replay-port") + 2],
            *engine_args,
        ]
        e.process.restart()
    wait_all_ready(engines)


def pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r["error"] is None]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    # a router that lowers TTFT by stalling the requests decoding where it sends a prefill
    # shows here: each request's time per output token after its first
    tpot = [r["tpot_s"] for r in ok if r.get("tpot_s") is not None]
    used = [r for r in ok if r["prompt_tokens"] and r["cached_tokens"] is not None]
    prompt = sum(r["prompt_tokens"] for r in used)
    kinds: dict[str, int] = {}
    for r in rows:
        if r["error"] is not None:
            key = f"{r['error']}: {str(r.get('detail', ''))[:80]}"
            kinds[key] = kinds.get(key, 0) + 1
    return {
        "requests": len(rows),
        "errors": len(rows) - len(ok),
        "error_kinds": kinds,
        "prompt_tokens": prompt,
        "cached_token_ratio": sum(r["cached_tokens"] for r in used) / prompt if prompt else None,
        "ttft_s": {"p50": pct(ttft, 50), "p99": pct(ttft, 99)},
        "tpot_s": {"p50": pct(tpot, 50), "p99": pct(tpot, 99)},
    }


def med(values: list[float | None]) -> float | None:
    """The median of the known values; None when there are none."""
    known = [v for v in values if v is not None]
    return float(np.median(known)) if known else None


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One gateway's runs as one row: the median of each number (requests and errors summed),
    the runs themselves under ``runs`` when there are several."""
    if len(runs) == 1:
        return runs[0]
    out: dict[str, Any] = {
        "requests": sum(r["requests"] for r in runs),
        "errors": sum(r["errors"] for r in runs),
        "cached_token_ratio": med([r["cached_token_ratio"] for r in runs]),
        "ttft_s": {q: med([r["ttft_s"][q] for r in runs]) for q in ("p50", "p99")},
        "tpot_s": {q: med([r["tpot_s"][q] for r in runs]) for q in ("p50", "p99")},
    }
    for key in ("cpu_us_per_request", "idle_cpu_ms_per_s", "cpu_us_per_request_less_idle"):
        out[key] = med([r[key] for r in runs])
    out["runs"] = runs
    return out


def run_names(fronts: Sequence[str], only: str | None) -> list[str]:
    """The gateways a phase runs, in order: kvtide, its text mode and the ``kvtide cost:``
    variants named in ``only``, then the peers; narrowed to ``only`` when given."""
    chosen = only.split(",") if only else []
    variants = [n for n in chosen if n.startswith((KVTIDE_VARIANT, KVTIDE_CAP))]
    names = [*fronts[:1], KVTIDE_TEXT, *variants, *fronts[1:]]
    return [n for n in names if not chosen or n in chosen]


def summed_hot_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One gateway's hot-prefix runs as one row: requests, errors and samples summed, each
    engine's share averaged, TTFT medians; the runs under ``runs`` when there are several."""
    if len(runs) == 1:
        return runs[0]
    summed = (
        "requests",
        "errors",
        "samples",
        "samples_sending",
        "samples_with_queue",
        "samples_idle_while_queued",
        "samples_idle_while_queued_sending",
        "samples_with_waiting",
        "samples_idle_while_waiting",
    )
    out: dict[str, Any] = {key: sum(r[key] for r in runs) for key in summed}
    out["share_per_engine"] = [float(x) for x in np.mean([r["share_per_engine"] for r in runs], 0)]
    out["ttft_s"] = {q: med([r["ttft_s"][q] for r in runs]) for q in ("p50", "p99")}
    out["runs"] = runs
    return out


# --- phase 1: the workloads ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plan:
    """One workload as sent, and the engines sized for it."""

    workload: Any
    plan: list[Any]
    sizing: dict[str, Any]
    engine_args: list[str]


def size_engines(
    requests: Sequence[Any], wall_s: float, args: argparse.Namespace
) -> dict[str, Any]:
    """KV per engine from the workload's working set, engine speed from its offered load.

    KV: the fleet holds ``--kv-fraction`` of the KV the workload needs, split over the
    engines, never less than the longest request (it must fit). Needs: the larger of the
    tokens it keeps live for reuse at its peak (``peak_reused_tokens``: what perfect eviction
    needs for every hit an unbounded cache gets) and the LRU cache that serves 90% of its
    reused blocks (``lru_reuse_tokens``: what the engines' LRU needs; for the Mooncake trace,
    whose conversations return minutes later, ~5x the former; for the chat sessions ~0.9x).
    Speed: the engines' ``--speedup`` makes the prompt tokens offered per second, prefilled
    with no hit, ``--load`` of the fleet's prefill capacity (the engines' timing model), as
    ``kvtide simulate --load`` does by scaling arrivals instead (at the mean prompt's rate:
    the simulator sums each prompt's prefill time, a few % more for long prompts; for the
    same pace there, ``--time-scale`` = the arrivals' time scale x this speedup).
    """
    peak = peak_reused_tokens(requests)
    lru = lru_reuse_tokens(requests, 0.9)
    need = max(peak, lru)
    prefilling = args.pd or args.engines  # with --pd, the prefill engines hold the reuse
    per_engine = int(args.kv_fraction * need / prefilling) // BLOCK_TOKENS * BLOCK_TOKENS
    # the engines count the rendered text's tokens, a few % off the workload's: 10% margin
    longest = int(1.1 * max(r.prompt_tokens + r.output_tokens for r in requests)) + 64
    per_engine = max(per_engine, -(-longest // BLOCK_TOKENS) * BLOCK_TOKENS)
    prompt = sum(r.prompt_tokens for r in requests)
    mean = prompt / max(1, len(requests))
    capacity = prefilling * default_ttft_model().prefill_tokens_per_s(max(1, int(mean)))
    speedup = prompt / max(wall_s, 1e-9) / (args.load * capacity)
    return {
        "requests": len(requests),
        "wall_s": wall_s,
        "prompt_tokens": prompt,
        "infinite_cache_hit_ratio": stats(requests)["infinite_cache_hit_ratio"],
        "peak_reused_tokens": peak,
        "lru_reuse_tokens": lru,
        "kv_tokens_per_engine": per_engine,
        "fleet_kv_over_need": per_engine * prefilling / max(1, need),
        "speedup": speedup,
    }


def _engine_args(sizing: dict[str, Any], args: argparse.Namespace) -> list[str]:
    return [
        "--max-model-len",
        str(min(args.max_model_len, sizing["kv_tokens_per_engine"])),
        "--speedup",
        f"{sizing['speedup']:.4g}",
        "--kv-cache-tokens",
        str(sizing["kv_tokens_per_engine"]),
        "--scheduling-policy",
        args.scheduling_policy,
        *(NIXL if args.pd else []),
    ]


def workload_plans(args: argparse.Namespace) -> dict[str, Plan]:
    plans: dict[str, Plan] = {}
    which = set(args.workloads.split(","))
    spec = CHAT.format(s=args.sessions, d=args.duration, p=args.system_prompts, t=args.think_s)
    chat = open_workload(spec, seed=args.seed)
    plan = schedule(chat, LoadConfig(url="http://x", duration_s=args.duration))
    sizing = size_engines([r for _, r in plan], plan[-1][0], args)
    if "chat" in which:
        plans["chat"] = Plan(chat, plan, sizing, _engine_args(sizing, args))
    if "mooncake" in which and args.trace is not None and args.trace.exists():
        traced = [r.arrival_s for r in open_workload(str(args.trace), limit=args.trace_requests)]
        span = traced[-1] - traced[0]
        scale = args.trace_duration / span if args.trace_duration else args.trace_time_scale
        trace = open_workload(str(args.trace), limit=args.trace_requests, time_scale=scale)
        # requests longer than the engines' context would be 400s for every gateway alike
        plan = [
            (at, dataclasses.replace(r, output_tokens=min(r.output_tokens, args.max_output_tokens)))
            for at, r in schedule(trace, LoadConfig(url="http://x"))
            if r.prompt_tokens + args.max_output_tokens <= args.max_model_len
        ]
        sizing = size_engines([r for _, r in plan], plan[-1][0], args)
        sizing["time_scale"] = scale
        plans["mooncake"] = Plan(trace, plan, sizing, _engine_args(sizing, args))
    return plans


def run_workload(
    front: Front,
    engines: Sequence[Engine],
    workload: Any,
    plan: list[Any],
    seed: int,
    rows_path: Path | None = None,
    api: str = "chat",
) -> dict[str, Any]:
    """One run of ``plan`` through ``front`` (``api``: the load generator's, chat or
    Anthropic's messages): its summary; with ``rows_path`` the load generator's per-request
    rows are written there too (JSON), for analysis by phase."""
    assert front.url is not None
    config = LoadConfig(url=front.url, model=MODEL, seed=seed, timeout_s=120.0, api=api)
    # what the gateway burns with no request (health checks, scrapes, event intake), so that
    # per-request CPU at a low rate can be read apart from its constant background
    idle0 = front.cpu_s()
    time.sleep(IDLE_S)
    idle_cpu_per_s = (front.cpu_s() - idle0) / IDLE_S
    cpu0, t0 = front.cpu_s(), time.monotonic()
    report, per_engine = asyncio.run(_load_watched(config, workload, plan, engines))
    cpu = front.cpu_s() - cpu0
    if rows_path is not None:
        rows_path.write_text(json.dumps(report["requests"]) + "\n")
    out = summarize_rows(report["requests"])
    wall = time.monotonic() - t0
    out["cpu_us_per_request"] = cpu / max(1, out["requests"]) * 1e6
    out["idle_cpu_ms_per_s"] = idle_cpu_per_s * 1e3
    background = idle_cpu_per_s * wall
    out["cpu_us_per_request_less_idle"] = max(0.0, cpu - background) / max(1, out["requests"]) * 1e6
    out["wall_s"] = wall
    out["per_engine"] = per_engine
    if front.name.startswith("kvtide"):
        out["decisions"], out["index"] = asyncio.run(gateway_decisions(front.url))
    return out


DECISIONS = "kvtide_gateway_route_decisions_total"
INDEX_COUNTS = {
    "kvtide_router_predicted_cached_tokens_total": "predicted_tokens",
    "kvtide_router_reported_cached_tokens_total": "reported_tokens",
    "kvtide_router_evicted_queued_tokens_total": "evicted_queued_tokens",
}
PACE = "kvtide_router_prefill_pace_ratio"


async def gateway_decisions(url: str) -> tuple[dict[str, int], dict[str, float]]:
    """A kvtide gateway's routing decisions so far by the policy's branch (``reason``):
    how much of a run the cost's holder rule, hot spreading or the cold hash decided; and its
    index's predicted cached tokens against what the engines reported, with the predicted
    tokens the engines evicted while the requests waited in their queues, and the engines'
    prefill pace the router learned (their seconds over its TTFT model's)."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    out: dict[str, int] = {}
    index: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == DECISIONS:
                reason = sample.labels.get("reason", "")
                out[reason] = out.get(reason, 0) + int(sample.value)
            elif sample.name in INDEX_COUNTS:
                index[INDEX_COUNTS[sample.name]] = int(sample.value)
            elif sample.name == PACE:
                index["prefill_pace"] = round(sample.value, 3)
    return out, index


async def _load_watched(
    config: LoadConfig, workload: Any, plan: list[Any], engines: Sequence[Engine]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The load generator's report, and what the engines saw meanwhile: each engine's
    requests, prompt tokens and cached tokens (its counters at the end: the engines are fresh),
    its queue sampled every ``WATCH_S`` seconds, and how often one engine had nothing to do
    while another queued. Where a gateway's p99 comes from: one engine's queue or all."""
    samples: list[list[tuple[float, float]]] = []

    async def watch(session: aiohttp.ClientSession) -> None:
        while True:
            snap = await scrape_engines(session, engines)
            samples.append([(v.get("running", 0.0), v.get("waiting", 0.0)) for v in snap])
            await asyncio.sleep(WATCH_S)

    async with aiohttp.ClientSession() as session:
        watcher = asyncio.create_task(watch(session))
        try:
            report = await run_load(config, workload, smollm2(), None, plan)
        finally:
            watcher.cancel()
        final = await scrape_engines(session, engines)
    return report, engine_shares(final, samples)


async def scrape_engines(
    session: aiohttp.ClientSession, engines: Sequence[Engine]
) -> list[dict[str, float]]:
    """Each engine's /metrics: the dashboard's series (``ENGINE_SERIES``) and its counters of
    requests, prompt tokens and prefix-cache hits, each summed over its label sets."""
    out = []
    for e in engines:
        async with session.get(f"{e.url}/metrics", timeout=aiohttp.ClientTimeout(2)) as r:
            text = await r.text()
        out.append(parse_engine_metrics(text, {**ENGINE_SERIES, **ENGINE_COUNTERS}))
    return out


def engine_shares(
    final: Sequence[dict[str, float]], samples: Sequence[Sequence[tuple[float, float]]]
) -> dict[str, Any]:
    """Per engine: share of the requests and of the prompt tokens, cached-token ratio, mean
    and peak of the queue (waiting) over the samples; and the samples with a queue somewhere,
    and those of them in which another engine had nothing at all."""
    requests = sum(f.get("served", 0.0) for f in final) or 1.0
    prompt = sum(f.get("prompt_tokens", 0.0) for f in final) or 1.0
    waiting = np.array([[w for _, w in s] for s in samples]) if samples else np.zeros((1, 0))
    queued = [s for s in samples if any(w > 0 for _, w in s)]
    return {
        "request_share": [f.get("served", 0.0) / requests for f in final],
        "prompt_share": [f.get("prompt_tokens", 0.0) / prompt for f in final],
        "cached_ratio": [
            f.get("cached_tokens", 0.0) / f["prompt_tokens"] if f.get("prompt_tokens") else None
            for f in final
        ],
        "waiting_mean": [float(x) for x in waiting.mean(0)] if samples else [],
        "waiting_max": [float(x) for x in waiting.max(0)] if samples else [],
        "samples": len(samples),
        "samples_with_queue": len(queued),
        "samples_idle_while_queued": sum(any(r + w == 0 for r, w in s) for s in queued),
    }


# --- phases 2 and 3: a small open-loop driver of fixed request bodies ------------------------


async def drive(
    targets: Callable[[int], str],
    bodies: Sequence[dict[str, Any]],
    rate: float,
    seed: int,
    on_tick: Callable[[], Any] | None = None,
    on_all_sent: Callable[[], None] | None = None,
) -> list[Any]:
    """Sends ``bodies`` at Poisson ``rate`` (request i to ``targets(i)``); the outcomes.
    ``on_tick`` is awaited every 0.2 s until the last request ends, ``on_all_sent`` called once
    the last one is sent (the drain begins)."""
    rng = random.Random(seed)
    outs: list[Any] = [None] * len(bodies)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int) -> None:
            url = f"{targets(i)}/v1/chat/completions"
            outs[i] = await stream(session, url, bodies[i], {}, 60.0)

        ticker = asyncio.create_task(_tick(on_tick)) if on_tick else None
        start = time.monotonic()
        at = 0.0
        async with asyncio.TaskGroup() as tg:
            for i in range(len(bodies)):
                delay = start + at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tg.create_task(one(i))
                at += rng.expovariate(rate)
            if on_all_sent is not None:
                on_all_sent()
        if ticker is not None:
            ticker.cancel()
    return outs


async def _tick(fn: Callable[[], Any]) -> None:
    while True:
        await fn()
        await asyncio.sleep(0.2)


def chat_bodies(n: int, seed: int, max_tokens: int) -> list[dict[str, Any]]:
    """``n`` chat requests from the built-in chat workload (shared system prompts, histories)."""
    # 48 sessions gave 141 requests (those whose turns fall within the 60 s): before run 25
    # the phase sent that many, whatever n
    workload = open_workload(SMALL_CHAT.format(s=max(48, n // 2), d=60, t=5), limit=n, seed=seed)
    builder = PromptBuilder(smollm2(), seed, ids_as_words=True)  # as run_load for a built-in
    out = []
    for request in workload:
        prompt = builder.build(request)
        out.append(_body([{"role": r, "content": c} for r, c in prompt.messages], max_tokens))
    return out


def _body(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }


def overhead_run(
    front: Front, engines: Sequence[Engine], args: argparse.Namespace
) -> dict[str, Any]:
    bodies = chat_bodies(int(args.overhead_rate * args.overhead_duration), args.seed, 2)
    n = len(bodies)  # what was sent divides the CPU
    if front.url is None:
        urls = [e.url for e in engines]

        def target(i: int) -> str:
            return urls[i % len(urls)]
    else:
        url = front.url

        def target(i: int) -> str:
            return url

    own0 = own_time(front)
    cpu0 = front.cpu_s()
    outs = asyncio.run(drive(target, bodies, args.overhead_rate, args.seed))
    cpu = front.cpu_s() - cpu0
    own1 = own_time(front)
    ttft = [o.ttft_s for o in outs if o.ok and o.ttft_s is not None]
    own_us = None
    if own0 is not None and own1 is not None and own1[1] > own0[1]:
        own_us = (own1[0] - own0[0]) / (own1[1] - own0[1]) * 1e6
    return {
        "requests": n,
        "errors": sum(not o.ok for o in outs),
        "ttft_s": {"p50": pct(ttft, 50), "p99": pct(ttft, 99)},
        "cpu_us_per_request": cpu / n * 1e6 if front.child else None,
        "rss_mib": front.rss_bytes() / 2**20 if front.child else None,
        "own_time_us_mean": own_us,
    }


OWN_TIME = "kvtide_gateway_overhead_seconds"


def own_time(front: Front) -> tuple[float, float] | None:
    """A kvtide gateway's own time so far (arrival to the engine's connection, its
    ``kvtide_gateway_overhead_seconds``): (sum of seconds, requests); None for the others."""
    if front.url is None or not front.name.startswith("kvtide"):
        return None
    with urllib.request.urlopen(front.url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    got = parse_engine_metrics(text, {OWN_TIME + "_sum": "sum", OWN_TIME + "_count": "count"})
    return got.get("sum", 0.0), got.get("count", 0.0)


Sample = tuple[bool, Sequence[tuple[float, float]], float]
"""(sent while sending, one (running, waiting) per engine, requests waiting at the gateway)"""


def count_samples(samples: Sequence[Sample], max_seqs: int) -> dict[str, int]:
    """The hot phase's counts from its samples: those with a queue somewhere, engines' or the
    gateway's, those where beside it an engine has nothing at all, and how many of each came
    before the last request was sent.

    A queue at an engine is what it cannot start for want of room: more requests than its
    ``max_seqs`` batch slots (the hot phase's engines have KV for all of them). A request that
    arrived during an iteration waits in the engine's ``waiting`` until the next one even with
    slots free (vLLM's scheduler, and the emulated engine's, admit between iterations): that
    is no queue, and a router that sends a prompt to the engine holding its prefix rather than
    to an idle one that would prefill it cold is right to. Those samples are counted apart,
    as ``samples_with_waiting`` and ``samples_idle_while_waiting`` (any request waiting
    anywhere: the count before run 25)."""

    def queued(s: Sequence[tuple[float, float]], gw: float) -> bool:
        return gw > 0 or any(r + w > max_seqs for r, w in s)

    def waiting(s: Sequence[tuple[float, float]], gw: float) -> bool:
        return gw > 0 or any(w > 0 for _, w in s)

    def idle(s: Sequence[tuple[float, float]]) -> bool:
        return any(r + w == 0 for r, w in s)

    with_queue = [(sent, s) for sent, s, gw in samples if queued(s, gw)]
    idle_queued = [sent for sent, s in with_queue if idle(s)]
    with_waiting = [s for _, s, gw in samples if waiting(s, gw)]
    return {
        "samples": len(samples),
        "samples_sending": sum(sent for sent, _, _ in samples),
        "samples_with_queue": len(with_queue),
        "samples_idle_while_queued": len(idle_queued),
        "samples_idle_while_queued_sending": sum(idle_queued),
        "samples_with_waiting": len(with_waiting),
        "samples_idle_while_waiting": sum(idle(s) for s in with_waiting),
    }


def hot_run(
    front: Front, engines: Sequence[Engine], args: argparse.Namespace, salt: int
) -> dict[str, Any]:
    rng = random.Random(salt)
    words = ["alpha", "bravo", "cargo", "delta", "ember", "fjord", "gamma", "harbor"]
    hot = [
        f"[{salt}-{k}] You are the assistant of team {k}. "
        + " ".join(rng.choice(words) for _ in range(args.hot_prefix_words))
        for k in range(2)
    ]
    n = int(args.hot_rate * args.hot_duration)
    bodies = [
        _body(
            [
                {"role": "system", "content": hot[i % 2]},
                {"role": "user", "content": f"question {salt}-{i}: where is parcel {i}?"},
            ],
            args.hot_output_tokens,
        )
        for i in range(n)
    ]
    # (sending, per engine, at the gateway): the drain after the last send is apart,
    # since there an engine that finished its share idles beside another's queue whatever
    # the router did
    samples: list[Sample] = []
    sending = [True]
    served0: dict[str, float] = {}

    async def scrape_all() -> dict[str, dict[str, float]]:
        async with aiohttp.ClientSession() as s:
            scraped = await scrape_engines(s, engines)
        return {e.url: v for e, v in zip(engines, scraped, strict=True)}

    async def front_queued() -> float:
        """Requests waiting in kvtide's own queue (``limits.max_in_flight_per_replica``)."""
        if not front.name.startswith("kvtide") or front.url is None:
            return 0.0
        url = f"{front.url}/metrics"
        async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(2)) as r:
            text = await r.text()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("kvtide_gateway_queued ")
        )

    async def tick() -> None:
        snap = await scrape_all()
        engines_now = [(v.get("running", 0.0), v.get("waiting", 0.0)) for v in snap.values()]
        samples.append((sending[0], engines_now, await front_queued()))

    served0 = {u: v["served"] for u, v in asyncio.run(scrape_all()).items()}
    assert front.url is not None
    url = front.url

    def all_sent() -> None:
        sending[0] = False

    outs = asyncio.run(drive(lambda i: url, bodies, args.hot_rate, salt, tick, all_sent))
    time.sleep(0.5)
    served = {u: v["served"] - served0[u] for u, v in asyncio.run(scrape_all()).items()}
    total = sum(served.values()) or 1.0
    ttft = [o.ttft_s for o in outs if o.ok and o.ttft_s is not None]
    return {
        "requests": n,
        "errors": sum(not o.ok for o in outs),
        "share_per_engine": [served[e.url] / total for e in engines],
        **count_samples(samples, args.hot_max_seqs),
        "ttft_s": {"p50": pct(ttft, 50), "p99": pct(ttft, 99)},
    }


# --- the run ---------------------------------------------------------------------------------


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:8.1f}"


def _ratio(x: float | None, y: float | None) -> str:
    return "-" if not x or not y else f"x{x / y:.2f}"


def parser() -> argparse.ArgumentParser:
    """The bench's flags (``bench/trace_windows.py`` reads its sizing defaults here)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peers-venv", type=Path, default=Path("/work/peers-venv"))
    p.add_argument("--trace", type=Path, help="mooncake_conversation.jsonl (skipped without)")
    p.add_argument("--trace-requests", type=int, default=500, help="the trace's first N")
    p.add_argument(
        "--trace-duration",
        type=float,
        default=150.0,
        help="seconds to send them over (sets the time scale; 0: --trace-time-scale)",
    )
    p.add_argument("--trace-time-scale", type=float, default=1.0, help="<1: faster than traced")
    p.add_argument("--max-output-tokens", type=int, default=16, help="trace outputs capped")
    p.add_argument("--duration", type=float, default=120.0, help="chat workload seconds")
    p.add_argument("--sessions", type=int, default=240, help="chat sessions")
    p.add_argument("--system-prompts", type=int, default=16, help="chat system prompts")
    p.add_argument("--think-s", type=float, default=15.0, help="chat mean think time")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument(
        "--kv-fraction",
        type=float,
        default=0.5,
        help="the fleet's KV over the workload's peak reused tokens (both workloads)",
    )
    p.add_argument(
        "--load",
        type=float,
        default=0.8,
        help="offered prefill with no hits over the fleet's prefill capacity (sets --speedup)",
    )
    p.add_argument("--max-model-len", type=int, default=32_768, help="engines' context")
    p.add_argument(
        "--scheduling-policy",
        choices=("fcfs", "priority"),
        default="fcfs",
        help="the engines' waiting queue, for every gateway: priority honours the priority "
        "`kvtide cost:deadline_k=K` sets (the peers set none: FCFS among theirs)",
    )
    p.add_argument("--overhead-rate", type=float, default=200.0)
    p.add_argument("--overhead-duration", type=float, default=5.0)
    p.add_argument("--hot-rate", type=float, default=40.0)
    p.add_argument("--hot-duration", type=float, default=8.0)
    p.add_argument("--hot-max-seqs", type=int, default=4)
    p.add_argument("--hot-prefix-words", type=int, default=800)
    p.add_argument("--hot-output-tokens", type=int, default=24)
    p.add_argument("--phases", default="workloads,overhead,hot")
    p.add_argument("--workloads", default="chat,mooncake", help="of the workloads phase")
    p.add_argument(
        "--api",
        default="chat",
        choices=("chat", "responses", "messages"),
        help="the workloads phase's API: OpenAI's chat completions or Responses "
        "(/v1/responses), or Anthropic's Messages (/v1/messages; sglang-router 0.3.2 has "
        "no such route)",
    )
    p.add_argument(
        "--pd",
        type=int,
        default=0,
        metavar="P",
        help="the workloads phase disaggregated: the first P engines only prefill, the rest "
        "only decode (engines with --kv-transfer-config, KV and speed sized on the P), "
        "through kvtide (--prefill/--decode) and vllm-router (--vllm-pd-disaggregation); "
        "the gateways without vLLM's P/D are skipped",
    )
    p.add_argument("--only", help="comma-separated gateway names to run (default all)")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per gateway of the workloads and hot phases, in rounds (medians)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, dest="json_path")
    p.add_argument(
        "--rows",
        type=Path,
        dest="rows_dir",
        help="directory for each workload run's per-request rows (WORKLOAD-GATEWAY-ROUND.json)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error(f"--repeat: expected at least 1 run per gateway, got {args.repeat}")
    if args.rows_dir is not None:
        try:
            args.rows_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            p.error(f"--rows: cannot make directory {args.rows_dir}: {e.strerror}")
    phases = set(args.phases.split(","))
    if args.pd and not 0 < args.pd < args.engines:
        p.error(f"--pd: expected 1 to {args.engines - 1} prefill engines, got {args.pd}")
    if args.pd and phases != {"workloads"}:
        p.error("--pd: only the workloads phase runs disaggregated (--phases workloads)")
    python = peer_python(args.peers_venv)
    fronts = gateways_to_run([KVTIDE], args.peers_venv, args.only)
    if args.pd:
        fronts = [n for n in fronts if n.startswith("kvtide") or n in PD_PEERS]
    print(f"bench/gateways.py rev {git_rev()} config {json.dumps(vars(args), default=str)}")
    results: dict[str, Any] = {"config": vars(args), "rev": git_rev(), "gateways": fronts}
    base = [
        "--max-model-len",
        str(args.max_model_len),
        "--scheduling-policy",
        args.scheduling_policy,
    ]
    with ProcessGroup() as group:
        engines = [start_engine(group, MODEL, base, f"engine {i}") for i in range(args.engines)]
        wait_all_ready(engines)
        if "workloads" in phases:
            results["workloads"] = {}
            for wname, wp in workload_plans(args).items():
                rows = results["workloads"][wname] = {}
                results.setdefault("sizing", {})[wname] = wp.sizing
                print(f"  {wname} sizing {json.dumps(wp.sizing)}", flush=True)
                names = run_names(fronts, args.only)
                runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
                # rounds of every gateway (drift on a shared machine spreads over all of
                # them); within a round every gateway gets the same text (one seed)
                for round_ in range(args.repeat):
                    for name in names:
                        # fresh engines for each run: a warm cache would favour later gateways
                        restart_engines(engines, wp.engine_args)
                        rows_path = None
                        if args.rows_dir is not None:
                            slug = "".join(c if c.isalnum() else "_" for c in name)
                            rows_path = args.rows_dir / f"{wname}-{slug}-{round_}.json"
                        front = start_front(name, group, engines, python, args.pd)
                        try:
                            row = run_workload(
                                front,
                                engines,
                                wp.workload,
                                wp.plan,
                                args.seed + 1 + round_,
                                rows_path,
                                args.api,
                            )
                        finally:
                            stop_front(front, group)
                        runs[name].append(row)
                        print(f"  {wname:<9} {name:<28} {json.dumps(row)}", flush=True)
                for name in names:
                    rows[name] = median_row(runs[name])
                print_workload(wname, rows)
        if "overhead" in phases:
            restart_engines(engines, [*base, "--speedup", "100000"])
            rows = results["overhead"] = {}
            for name in ["direct", BARE, *fronts[:1], KVTIDE_TEXT, *fronts[1:]]:
                if name == "direct":
                    front = Front("direct", None, None)
                else:
                    front = start_front(name, group, engines, python)
                try:
                    rows[name] = overhead_run(front, engines, args)
                finally:
                    stop_front(front, group)
                print(f"  overhead {name:<28} {json.dumps(rows[name])}", flush=True)
            print_overhead(rows)
        if "hot" in phases:
            hot_args = [*base, "--speedup", "1", "--max-num-seqs", str(args.hot_max_seqs)]
            names = run_names(fronts, args.only)
            hot_runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
            # as the workloads: rounds, fresh engines for each run, one text per round for
            # every gateway (where the two prefixes hash decides which engines they share)
            for round_ in range(args.repeat):
                for name in names:
                    restart_engines(engines, hot_args)
                    front = start_front(name, group, engines, python)
                    try:
                        row = hot_run(front, engines, args, 1000 + round_)
                    finally:
                        stop_front(front, group)
                    hot_runs[name].append(row)
                    print(f"  hot {name:<28} {json.dumps(row)}", flush=True)
            rows = results["hot"] = {n: summed_hot_row(hot_runs[n]) for n in names}
            print_hot(rows)
    if args.json_path is not None:
        args.json_path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0


def print_workload(name: str, rows: dict[str, Any]) -> None:
    ours = rows.get(KVTIDE)
    print(
        f"\n{name}: {'gateway':<28}{'req':>6}{'err':>5}{'cached':>8}{'TTFT p50':>10}"
        f"{'p99':>9}{'TPOT p50':>9}{'p99':>9}{'CPU us/req':>11}{'idle ms/s':>10}"
        f"{'less idle':>10}  kvtide/peer TTFT p50, p99"
    )
    for gw, r in rows.items():
        t = r["ttft_s"]
        ratio = ""
        if ours is not None and gw != KVTIDE:
            mine = ours["ttft_s"]
            ratio = f"  {_ratio(mine['p50'], t['p50'])}, {_ratio(mine['p99'], t['p99'])}"
        cached = "-" if r["cached_token_ratio"] is None else f"{r['cached_token_ratio']:.1%}"
        print(
            f"  {gw:<34}{r['requests']:>6}{r['errors']:>5}{cached:>8}{_ms(t['p50']):>10}"
            f"{_ms(t['p99']):>9}{_ms(r['tpot_s']['p50']):>9}{_ms(r['tpot_s']['p99']):>9}"
            f"{r['cpu_us_per_request']:>11.0f}"
            f"{r['idle_cpu_ms_per_s']:>10.1f}{r['cpu_us_per_request_less_idle']:>10.0f}{ratio}"
        )
    for gw, r in rows.items():
        if "runs" in r:  # medians above: each run's numbers, in round order
            each = ", ".join(
                f"{x['cached_token_ratio'] or 0:.1%} {_ms(x['ttft_s']['p50']).strip()}/"
                f"{_ms(x['ttft_s']['p99']).strip()} {_ms(x['tpot_s']['p50']).strip()}/"
                f"{_ms(x['tpot_s']['p99']).strip()}"
                for x in r["runs"]
            )
            print(f"    {gw} runs (cached, TTFT p50/p99 ms, TPOT p50/p99 ms): {each}")
    print("  per engine (first run): requests, prompt tokens, cached, waiting mean/max")
    for gw, r in rows.items():
        e = (r["runs"][0] if "runs" in r else r).get("per_engine")
        if e:
            print(f"    {gw}: {engine_line(e)}")
    for gw, r in rows.items():
        for i, run in enumerate(r.get("runs", [r])):
            if run.get("decisions"):
                print(f"    {gw} run {i + 1} decisions by reason: {json.dumps(run['decisions'])}")
            index = run.get("index")
            if index and index.get("predicted_tokens"):
                lost = index.get("evicted_queued_tokens", 0) / index["predicted_tokens"]
                print(
                    f"    {gw} run {i + 1} predicted cached tokens {index['predicted_tokens']:,}, "
                    f"reported {index.get('reported_tokens', 0):,}, evicted while queued "
                    f"{index.get('evicted_queued_tokens', 0):,} ({lost:.1%} of predicted), "
                    f"prefill pace {index.get('prefill_pace', 1.0):.2f}x the model"
                )


def engine_line(e: dict[str, Any]) -> str:
    """One run's ``per_engine`` on one line."""

    def shares(xs: Sequence[float | None]) -> str:
        return " ".join("-" if x is None else f"{x:.2f}" for x in xs)

    peaks = zip(e["waiting_mean"], e["waiting_max"], strict=True)
    queues = " ".join(f"{m:.1f}/{x:.0f}" for m, x in peaks)
    return (
        f"req {shares(e['request_share'])} | prompt {shares(e['prompt_share'])} | cached "
        f"{shares(e['cached_ratio'])} | waiting {queues} | idle beside a queue "
        f"{e['samples_idle_while_queued']}/{e['samples_with_queue']} of {e['samples']}"
    )


def print_overhead(rows: dict[str, Any]) -> None:
    direct = rows["direct"]["ttft_s"]
    floor = rows.get(BARE, {}).get("cpu_us_per_request")
    print(
        f"\noverhead: {'gateway':<28}{'err':>5}{'TTFT p50':>10}{'p99':>9}{'added p50':>10}"
        f"{'added p99':>10}{'CPU us/req':>11}{'over bare':>10}{'RSS MiB':>8}{'own us':>8}"
    )
    for gw, r in rows.items():
        t = r["ttft_s"]
        add50 = None if t["p50"] is None else t["p50"] - direct["p50"]
        add99 = None if t["p99"] is None else t["p99"] - direct["p99"]
        r["added_s"] = {"p50": add50, "p99": add99}
        us = r["cpu_us_per_request"]
        cpu = "-" if us is None else f"{us:.0f}"
        over = "-" if us is None or floor is None or gw == BARE else f"{us - floor:+.0f}"
        rss = "-" if r["rss_mib"] is None else f"{r['rss_mib']:.0f}"
        own = r.get("own_time_us_mean")
        own_s = "-" if own is None else f"{own:.0f}"
        print(
            f"  {gw:<38}{r['errors']:>5}{_ms(t['p50']):>10}{_ms(t['p99']):>9}"
            f"{_ms(add50):>10}{_ms(add99):>10}{cpu:>11}{over:>10}{rss:>8}{own_s:>8}"
        )


def print_hot(rows: dict[str, Any]) -> None:
    print(
        f"\nhot prefixes: {'gateway':<28}{'err':>5}{'share per engine':>26}"
        f"{'queued':>8}{'idle+queued':>12}{'…sending':>10}{'waiting':>8}{'idle+waiting':>13}"
        f"{'TTFT p50':>10}{'p99':>9}"
    )
    for gw, r in rows.items():
        share = " ".join(f"{s:.2f}" for s in r["share_per_engine"])
        t = r["ttft_s"]
        print(
            f"  {gw:<40}{r['errors']:>5}{share:>26}{r['samples_with_queue']:>8}"
            f"{r['samples_idle_while_queued']:>12}{r['samples_idle_while_queued_sending']:>10}"
            f"{r['samples_with_waiting']:>8}{r['samples_idle_while_waiting']:>13}"
            f"{_ms(t['p50']):>10}{_ms(t['p99']):>9}"
        )


if __name__ == "__main__":
    sys.exit(main())
