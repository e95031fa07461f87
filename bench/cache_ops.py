"""Prefix-cache operations on a real trace: kvtide's LRU against SGLang's RadixCache, vLLM's
KVCacheManager and a plain-Python page LRU, one request at a time, in one run.

    nice python bench/cache_ops.py ../shared/traces/mooncake_conversation.jsonl \
        --capacity 200000,1000000,3000000 --runs 3 [--requests N] [--json FILE]

The Mooncake trace is expanded into token ids (position j of 512-token block h becomes a token
derived from (h, j), ``kvtide.core.hashing.expand_block_ids``; the last block is cut at
``input_length``) and replayed through 16-token blocks: match, insert the whole prompt, evict to
capacity, release. Each system runs in its own process (the peers under the peer venv's python,
see bench/setup_peers.sh) on the same expanded tokens, written once to a temporary .npy file.
Hit ratio = hit tokens / prompt tokens; no system hits a prompt's last token. Time per request
is the median over ``--runs`` of the time inside the cache calls, block hashing included.
A peer that cannot be imported is reported as "not importable" and the rest still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from kvtide import __version__ as kvtide_version
from kvtide.core.hashing import expand_block_ids
from kvtide.errors import KvtideError
from kvtide.workloads.mooncake import read_mooncake
from revision import git_rev

HERE = Path(__file__).resolve().parent
PEER_PYTHON = Path("/work/venvs/peerlibs/bin/python")
SYSTEMS = (
    "kvtide",
    "kvtide-list",
    "kvtide-ghost",
    "kvtide-tel-null",
    "kvtide-tel-prom",
    "ref",
    "ref-vllm",
    "sglang",
    "vllm",
)
PEERS = ("sglang", "vllm")


def expand_trace(path: Path, limit: int | None, out_dir: Path) -> tuple[int, int]:
    """Writes tokens.npy (int32) and offsets.npy for the first ``limit`` requests."""
    chunks: list[np.ndarray] = []
    offsets = [0]
    for i, req in enumerate(read_mooncake(path)):
        if limit is not None and i >= limit:
            break
        assert req.block_ids is not None
        tokens = expand_block_ids(req.block_ids, req.block_tokens, req.prompt_tokens)
        chunks.append(tokens.astype(np.int32))  # expand_block_ids gives 31-bit ids
        offsets.append(offsets[-1] + len(tokens))
    if len(offsets) == 1:
        raise KvtideError(f"{path}: no requests")
    np.save(out_dir / "tokens.npy", np.concatenate(chunks))
    np.save(out_dir / "offsets.npy", np.asarray(offsets, dtype=np.int64))
    return len(offsets) - 1, offsets[-1]


def run_worker(system: str, python: Path, data: Path, capacities: str, runs: int) -> dict[str, Any]:
    if not python.exists():
        return {"system": system, "error": f"not importable: no python at {python}"}
    out = data / f"result-{system}.json"
    cmd = [str(python), str(HERE / "cache_workers.py"), system, str(data)]
    cmd += ["--capacity", capacities, "--runs", str(runs), "--out", str(out)]
    env = dict(os.environ, PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=None, text=True)
    if proc.returncode != 0 or not out.exists():
        return {"system": system, "error": f"worker failed (exit {proc.returncode})"}
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def summarize(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for system, result in results.items():
        for r in result.get("results", []):
            us = [ns / 1e3 / r["requests"] for ns in r["cpu_ns"]]
            wall_us = [ns / 1e3 / r["requests"] for ns in r["wall_ns"]]
            hash_us = [ns / 1e3 / r["requests"] for ns in r.get("hash_ns", [])]
            rows.append(
                {
                    "system": system,
                    "version": result.get("version"),
                    "capacity_tokens": r["capacity_tokens"],
                    "hit_tokens": r["hit_tokens"][0],
                    "hit_tokens_stable": len(set(r["hit_tokens"])) == 1,
                    "prompt_tokens": r["prompt_tokens"],
                    "hit_ratio": r["hit_tokens"][0] / r["prompt_tokens"],
                    "us_per_request": statistics.median(us),
                    "us_per_request_runs": us,
                    "wall_us_per_request": statistics.median(wall_us),
                    "hash_us_per_request": statistics.median(hash_us) if any(hash_us) else None,
                }
            )
    return rows


def print_report(rows: list[dict[str, Any]], results: dict[str, dict[str, Any]]) -> None:
    by_key = {(r["system"], r["capacity_tokens"]): r for r in rows}
    capacities = sorted({r["capacity_tokens"] for r in rows})
    print()
    print("us/request: CPU time inside the cache calls, median of runs; wall: the same, wall clock")
    head = f"{'capacity':>10}  {'system':<12} {'hit ratio':>9} {'hit tokens':>12}"
    print(head + f" {'us/request':>11} {'wall':>9}  {'runs (us)':<24} {'kvtide faster':>13}")
    for cap in capacities:
        base = by_key.get(("kvtide", cap))
        for system in results:
            r = by_key.get((system, cap))
            if r is None:
                continue
            runs = " ".join(f"{u:.1f}" for u in r["us_per_request_runs"])
            ratio = ""
            if base is not None and system != "kvtide":
                ratio = f"{r['us_per_request'] / base['us_per_request']:.2f}x"
            flag = "" if r["hit_tokens_stable"] else " (hits differ between runs!)"
            print(
                f"{cap:>10,}  {system:<12} {r['hit_ratio']:>9.4%} {r['hit_tokens']:>12,}"
                f" {r['us_per_request']:>11.1f} {r['wall_us_per_request']:>9.1f}  {runs:<24}"
                f" {ratio:>13}{flag}"
            )
        if base is not None and base["hash_us_per_request"] is not None:
            hashing = base["hash_us_per_request"]
            ops = base["us_per_request"] - hashing
            line = f"kvtide: {hashing:.1f} us hashing + {ops:.1f} us cache calls"
            for peer in PEERS:
                r = by_key.get((peer, cap))
                if r is not None:
                    line += f"; {peer} / kvtide without hashing {r['us_per_request'] / ops:.2f}x"
            print(f"{'':>12}{line}")
        if base is not None:
            same = []
            for system in results:
                r = by_key.get((system, cap))
                if r is None or system == "kvtide":
                    continue
                diff = r["hit_tokens"] - base["hit_tokens"]
                same.append(f"{system} {'=' if diff == 0 else f'{diff:+,} tokens'}")
            print(f"{'':>12}hit tokens vs kvtide: {', '.join(same)}")
        null, prom = by_key.get(("kvtide-tel-null", cap)), by_key.get(("kvtide-tel-prom", cap))
        if null is not None and prom is not None:
            cost = prom["us_per_request"] / null["us_per_request"] - 1
            print(
                f"{'':>12}telemetry: Prometheus recorder vs null recorder {cost:+.1%} of the "
                f"cache's time per request (target <= +5%)"
            )
    for system, result in results.items():
        if "error" in result:
            print(f"{system}: {result['error']}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trace", type=Path, help="Mooncake jsonl trace")
    parser.add_argument("--capacity", default="200000,1000000,3000000", help="tokens, comma list")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=None, help="first N requests only")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma list of systems")
    parser.add_argument(
        "--peer-python",
        type=Path,
        default=Path(os.environ.get("KVTIDE_PEER_PYTHON", PEER_PYTHON)),
        help="python of the peer venv (bench/setup_peers.sh); env KVTIDE_PEER_PYTHON",
    )
    args = parser.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    try:
        capacities = [int(c) for c in args.capacity.split(",")]
    except ValueError:
        capacities = []
    if unknown or not capacities or min(capacities) < 16 or args.runs < 1:
        problem = f"unknown systems {unknown}" if unknown else "bad --capacity or --runs"
        print(f"cache_ops: {problem}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kvtide-cache-ops-") as tmp:
        data = Path(tmp)
        try:
            n, prompt_tokens = expand_trace(args.trace, args.requests, data)
        except (KvtideError, OSError) as exc:
            print(f"cache_ops: {exc}", file=sys.stderr)
            return 2
        print(
            f"cache_ops  git {git_rev()}  kvtide {kvtide_version}"
            f"  python {platform.python_version()}  peer python {args.peer_python}"
        )
        print(
            f"trace {args.trace}  requests {n:,}  prompt tokens {prompt_tokens:,}"
            f"  block 16 tokens  capacities {args.capacity}  runs {args.runs} (median)"
        )
        print(
            "one request at a time: match (never the last prompt token), insert the whole"
            " prompt, evict to capacity, release; hashing is timed (kvtide xxh-style numpy hash,"
            " vLLM sha256, ref Python hash; SGLang hashes nothing)"
        )
        results: dict[str, dict[str, Any]] = {}
        for system in systems:
            python = args.peer_python if system in PEERS else Path(sys.executable)
            print(f"running {system} ...", file=sys.stderr, flush=True)
            results[system] = run_worker(system, python, data, args.capacity, args.runs)
    for system, result in results.items():
        version = result.get("version") or "-"
        print(f"  {system:<12} {version:<22} python {result.get('python', '-')}")
    rows = summarize(results)
    print_report(rows, results)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "config": {
                        "trace": str(args.trace),
                        "requests": n,
                        "prompt_tokens": prompt_tokens,
                        "capacities": capacities,
                        "runs": args.runs,
                        "git": git_rev(),
                    },
                    "rows": rows,
                    "errors": {s: r["error"] for s, r in results.items() if "error" in r},
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
