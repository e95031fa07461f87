"""Block hashing: kvtide's hash_tokens against vLLM's default prefix-caching hash (sha256 over a
pickled (parent, block tokens, extra keys) tuple per block, chained) on the same tokens.

    nice python bench/hashing.py [--tokens 32768] [--block-tokens 16] [--runs 5] [--json FILE]

vLLM runs in a subprocess under the peer venv's python (bench/setup_peers.sh), calling its own
``hash_block_tokens`` with ``sha256`` (the default ``prefix_caching_hash_algo``) and with
``sha256_cbor``, and its ``get_request_block_hasher`` through a ``Request`` (what its engine
runs per new request). Tokens are seeded random 31-bit ids. Times are per prompt: the median over
``--runs`` of the mean of a timed loop, in this thread's CPU time (steady on shared cores).
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from revision import git_rev

PEER_PYTHON = Path("/work/venvs/peerlibs/bin/python")
SEED = 0


def make_tokens(num_tokens: int) -> np.ndarray:
    return np.random.default_rng(SEED).integers(0, 2**31, size=num_tokens, dtype=np.int64)


def time_us(fn: Callable[[], object], runs: int, min_s: float) -> list[float]:
    """Per-call CPU microseconds, one value per run (each run loops for about ``min_s``)."""
    fn()
    loops = 1
    while True:  # size the loop once
        start = time.thread_time()
        for _ in range(loops):
            fn()
        if time.thread_time() - start >= min_s / 4 or loops >= 1 << 20:
            break
        loops *= 2
    out = []
    for _ in range(runs):
        start = time.thread_time()
        for _ in range(loops):
            fn()
        out.append((time.thread_time() - start) / loops * 1e6)
    return out


# --- the vLLM side (runs under the peer venv's python) -------------------------------------


def vllm_worker(tokens_path: Path, block_tokens: int, runs: int, loop_s: float) -> dict[str, Any]:
    import vllm
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256, sha256_cbor
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.kv_cache_utils import (
        get_request_block_hasher,
        hash_block_tokens,
        init_none_hash,
    )
    from vllm.v1.request import Request

    tokens = np.load(tokens_path).tolist()
    out: dict[str, Any] = {"version": vllm.__version__, "python": platform.python_version()}

    def chain(hash_fn: Callable[[Any], bytes]) -> Callable[[], object]:
        def run() -> object:
            parent = None
            for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
                parent = hash_block_tokens(
                    hash_fn, parent, tokens[start : start + block_tokens], None
                )
            return parent

        return run

    for name, hash_fn in (("sha256", sha256), ("sha256_cbor", sha256_cbor)):
        init_none_hash(hash_fn)
        assert kv_cache_utils.NONE_HASH is not None
        out[f"vllm hash_block_tokens {name}"] = time_us(chain(hash_fn), runs, loop_s)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(block_tokens, sha256)
    sampling = SamplingParams(max_tokens=1)

    def request() -> object:
        return Request("r", tokens, sampling, None, block_hasher=hasher).block_hashes

    out["vllm Request(block_hasher=sha256)"] = time_us(request, runs, loop_s)
    return out


# --- the kvtide side -------------------------------------------------------------------------


def kvtide_side(
    tokens: np.ndarray, block_tokens: int, runs: int, loop_s: float
) -> dict[str, list[float]]:
    from kvtide.core.hashing import Namespace, hash_tokens

    seed = Namespace().seed
    as_list = tokens.tolist()
    return {
        "kvtide hash_tokens (numpy int64)": time_us(
            lambda: hash_tokens(tokens, block_tokens, seed), runs, loop_s
        ),
        "kvtide hash_tokens (Python list)": time_us(
            lambda: hash_tokens(as_list, block_tokens, seed), runs, loop_s
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--block-tokens", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--loop-s", type=float, default=0.2, help="seconds per timed run")
    parser.add_argument(
        "--peer-python",
        type=Path,
        default=Path(os.environ.get("KVTIDE_PEER_PYTHON", PEER_PYTHON)),
    )
    parser.add_argument("--vllm-worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tokens < args.block_tokens or args.block_tokens < 1 or args.runs < 1:
        print("hashing: bad --tokens, --block-tokens or --runs", file=sys.stderr)
        return 2
    if args.vllm_worker is not None:  # the subprocess side
        tokens_path, out_path = args.vllm_worker, args.vllm_worker.with_suffix(".json")
        result = vllm_worker(tokens_path, args.block_tokens, args.runs, args.loop_s)
        out_path.write_text(json.dumps(result))
        return 0

    from kvtide import __version__

    tokens = make_tokens(args.tokens)
    rev = git_rev()
    print(
        f"hashing  git {rev}  kvtide {__version__}  python {platform.python_version()}"
        f"  {args.tokens} tokens ({args.tokens // args.block_tokens} blocks of"
        f" {args.block_tokens})  seed {SEED}  runs {args.runs} (median, CPU time)"
    )
    timings = kvtide_side(tokens, args.block_tokens, args.runs, args.loop_s)
    peer_note = ""
    with tempfile.TemporaryDirectory(prefix="kvtide-hashing-") as tmp:
        tokens_path = Path(tmp) / "tokens.npy"
        np.save(tokens_path, tokens)
        if not args.peer_python.exists():
            peer_note = f"vllm: not importable (no python at {args.peer_python})"
        else:
            cmd = [str(args.peer_python), str(Path(__file__).resolve()), "--vllm-worker"]
            cmd += [str(tokens_path), "--block-tokens", str(args.block_tokens)]
            cmd += ["--runs", str(args.runs), "--tokens", str(args.tokens)]
            cmd += ["--loop-s", str(args.loop_s)]
            env = dict(os.environ, PYTHONWARNINGS="ignore")
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            out_path = tokens_path.with_suffix(".json")
            if proc.returncode != 0 or not out_path.exists():
                last = (proc.stderr.strip().splitlines() or ["?"])[-1]
                peer_note = f"vllm: not importable ({last})"
            else:
                peer = json.loads(out_path.read_text())
                peer_note = f"vllm {peer.pop('version')} (python {peer.pop('python')})"
                timings.update(peer)
    print(peer_note)
    medians = {name: statistics.median(us) for name, us in timings.items()}
    base = medians["kvtide hash_tokens (numpy int64)"]
    print(f"{'':<40} {'us/prompt':>10} {'runs (us)':<40} {'vs kvtide numpy':>15}")
    for name, us in timings.items():
        runs = " ".join(f"{u:.0f}" for u in us)
        print(f"{name:<40} {medians[name]:>10.1f} {runs:<40} {medians[name] / base:>14.1f}x")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "tokens": args.tokens,
                    "block_tokens": args.block_tokens,
                    "git": rev,
                    "us_per_prompt": timings,
                    "median": medians,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
