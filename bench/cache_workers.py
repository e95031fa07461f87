"""One cache system replaying an expanded trace, run in its own process by bench/cache_ops.py.

    python bench/cache_workers.py SYSTEM DATA_DIR --capacity 200000,... --runs 3 --out RESULT.json

SYSTEM is ``kvtide``, ``kvtide-list``, ``kvtide-ghost``, ``kvtide-tel-null``,
``kvtide-tel-prom``, ``ref``, ``ref-vllm``, ``sglang`` or ``vllm``.
DATA_DIR holds ``tokens.npy`` (int32, every prompt's token ids end to end) and ``offsets.npy``
(int64, n + 1 offsets), written once by cache_ops.py. The peers run under the peer venv's
python (bench/setup_peers.sh), so this module imports only the standard library and numpy at
the top and each system only inside its own adapter: the peer venv has no kvtide, and
kvtide's venv no torch.

Each request is one call of ``step``, timed alone (this thread's CPU time, and wall time).
Turning the stored int32 tokens into what that system's engine holds (a numpy array for kvtide,
a list for vLLM and the reference, an ``array('q')`` for SGLang) happens before the clock
starts. Hashing is inside the timed step for every system: kvtide's ``hash_tokens``, vLLM's
sha256 block hasher (run by its ``Request`` constructor, as in the engine), the reference's
chained Python ``hash``; SGLang's radix tree keys on tokens and hashes nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
import traceback
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BLOCK_TOKENS = 16

Step = Callable[[Any], int]


class System:
    """A fresh cache at one capacity: ``prepare`` (untimed) then ``step`` (timed) per request."""

    name = ""
    version = ""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self.hash_ns = 0  # CPU time spent hashing, for systems that time it apart

    def prepare(self, tokens: np.ndarray) -> Any:
        return tokens.tolist()

    def step(self, prepared: Any) -> int:
        raise NotImplementedError


# --- kvtide ----------------------------------------------------------------------------------


def _kvtide_systems() -> tuple[type[System], type[System], type[System]]:
    import kvtide
    from kvtide.clock import ManualClock
    from kvtide.core.cache import CacheConfig, KVCache
    from kvtide.core.hashing import Namespace, hash_tokens

    seed = Namespace().seed

    class Kvtide(System):
        """kvtide's KVCache, policy lru: hash, match, insert (evicts as needed), hold, release."""

        name = "kvtide"
        version = kvtide.__version__
        # ghost_blocks=0: no miss classification, which no peer does either
        # (kvtide-ghost keeps the default to show what it costs).
        options: dict[str, Any] = {"ghost_blocks": 0}  # noqa: RUF012

        def __init__(self, capacity_tokens: int) -> None:
            super().__init__(capacity_tokens)
            self.cache = KVCache(
                CacheConfig(
                    capacity_blocks=capacity_tokens // BLOCK_TOKENS,
                    block_tokens=BLOCK_TOKENS,
                    policy="lru",
                    **self.options,
                ),
                ManualClock(),
            )

        def prepare(self, tokens: np.ndarray) -> Any:
            return tokens.astype(np.int64)

        def step(self, tokens: Any) -> int:
            cache = self.cache
            start = time.thread_time_ns()
            hashes = hash_tokens(tokens, BLOCK_TOKENS, seed)
            self.hash_ns += time.thread_time_ns() - start
            match = cache.match(hashes)
            self._last_hashes, self._last_hit = hashes, match.num_blocks
            # The last prompt token is always recomputed (vLLM and SGLang alike).
            hit = min(match.num_blocks, (len(tokens) - 1) // BLOCK_TOKENS)
            access = cache.insert(hashes, match=match)
            cache.lock(access.handle)  # the running request holds its blocks ...
            cache.unlock(access.handle)  # ... and releases them when it finishes
            return hit * BLOCK_TOKENS

    class KvtideList(Kvtide):
        """The same, fed a Python list of token ids (the conversion to numpy is timed)."""

        name = "kvtide-list"

        def prepare(self, tokens: np.ndarray) -> Any:
            return tokens.tolist()

    class KvtideGhost(Kvtide):
        """The same with CacheConfig's defaults: evicted hashes are remembered (4x capacity)
        to classify misses."""

        name = "kvtide-ghost"
        options: dict[str, Any] = {}  # noqa: RUF012

    return Kvtide, KvtideList, KvtideGhost


COLLECT_EVERY = 10
"""Requests between two ``CacheTelemetry.collect`` calls (an engine collects once per
iteration of several requests, or per scrape: every 10 requests is on the costly side)."""


def _kvtide_telemetry_systems() -> tuple[type[System], type[System]]:
    from kvtide.telemetry import CacheTelemetry, NullRecorder, PrometheusRecorder, Recorder

    Ghost = _kvtide_systems()[2]

    class KvtideTelemetryNull(Ghost):  # type: ignore[misc, valid-type]
        """kvtide-ghost with the request counted (``count_lookup``) and ``CacheTelemetry``
        attached (block hooks, collect every COLLECT_EVERY requests) on the null recorder."""

        name = "kvtide-tel-null"

        def make_recorder(self) -> Recorder:
            return NullRecorder()

        def __init__(self, capacity_tokens: int) -> None:
            super().__init__(capacity_tokens)
            self.recorder = self.make_recorder()
            self.telemetry = CacheTelemetry(self.recorder, self.cache)
            self.n = 0

        def step(self, tokens: Any) -> int:
            cached: int = super().step(tokens)
            self.cache.count_lookup(self._last_hashes, self._last_hit, len(tokens))
            self.n += 1
            if self.n % COLLECT_EVERY == 0:
                self.telemetry.collect()
            return cached

    class KvtideTelemetryProm(KvtideTelemetryNull):
        """The same on the Prometheus recorder, rendered (a scrape) every 1,000 requests."""

        name = "kvtide-tel-prom"

        def make_recorder(self) -> Recorder:
            return PrometheusRecorder()

        def step(self, tokens: Any) -> int:
            cached = super().step(tokens)
            if self.n % 1000 == 0:
                rec = self.recorder
                assert isinstance(rec, PrometheusRecorder)
                rec.exposition()
            return cached

    return KvtideTelemetryNull, KvtideTelemetryProm


# --- the reference ---------------------------------------------------------------------------


def _ref_systems() -> tuple[type[System], type[System]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from page_lru import PageLRU, VLLMPoolLRU

    class Ref(System):
        """bench/page_lru.py's PageLRU: the plain page LRU kvtide must equal."""

        name = "ref"
        version = "bench/page_lru.py PageLRU"

        def __init__(self, capacity_tokens: int) -> None:
            super().__init__(capacity_tokens)
            self.lru = PageLRU(capacity_tokens // BLOCK_TOKENS, BLOCK_TOKENS)

        def step(self, tokens: Any) -> int:
            return self.lru.request(tokens)

    class RefVLLM(System):
        """bench/page_lru.py's VLLMPoolLRU: vLLM's block pool quirks, to explain its hits."""

        name = "ref-vllm"
        version = "bench/page_lru.py VLLMPoolLRU"

        def __init__(self, capacity_tokens: int) -> None:
            super().__init__(capacity_tokens)
            self.lru = VLLMPoolLRU(capacity_tokens // BLOCK_TOKENS, BLOCK_TOKENS)

        def step(self, tokens: Any) -> int:
            return self.lru.request(tokens)

    return Ref, RefVLLM


# --- SGLang ----------------------------------------------------------------------------------


def _stub_torchvision() -> None:
    """SGLang's RadixCache module imports ``sglang.srt.configs`` (through memory_pool), whose
    multimodal configs (internvl_utils, deepseek_ocr) import torchvision at the top. PyPI's
    torchvision wheels are CUDA builds that fail to load against the CPU torch, and no CPU
    torchvision is installable here, so torchvision stays uninstalled and these three
    sys.modules entries stand in for it: their attributes are placeholders that raise if ever
    called (only image preprocessing would call them; the radix cache never does).

    transformers must decide "torchvision is not available" before the stub exists (it probes
    with importlib.util.find_spec, which a sys.modules entry would satisfy), so
    transformers.image_utils is imported first, with torchvision truly absent.
    """
    import importlib.machinery
    import importlib.util
    import types

    if importlib.util.find_spec("torchvision") is not None:
        return  # a working torchvision is installed: use it
    import transformers.image_utils  # noqa: F401  (see the docstring: order matters)

    class Unavailable:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("torchvision is stubbed out in bench/cache_workers.py")

    def getattr_(attr: str) -> object:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unavailable

    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        module.__path__ = []
        module.__getattr__ = getattr_  # type: ignore[method-assign]
        sys.modules[name] = module


def _sglang_system() -> type[System]:
    _stub_torchvision()
    import sglang
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import (
        EvictParams,
        InsertParams,
        MatchPrefixParams,
    )
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    # In the engine the KV slot tensors live on the GPU; here they are small CPU tensors, and
    # torch's default two OpenMP threads stall a ~100 KB copy by up to a millisecond on shared
    # cores. One thread keeps the tensor work at its real (tiny) size.
    torch.set_num_threads(1)

    class NullAllocator:
        """What RadixCache asks of the token-to-KV pool: a device and ``free_segment``."""

        device = "cpu"

        def free_segment(self, indices: Any, start_pos: int = 0) -> None:
            pass

    class SGLang(System):
        """SGLang's RadixCache, page_size 16, lru, as the scheduler drives it for one request:
        match with the key capped at input_len - 1 (``Req._compute_max_prefix_len``), lock the
        matched node, insert the page-aligned prompt with a copy of its KV slot indices
        (``_insert_cache``), evict down to capacity, unlock."""

        name = "sglang"
        version = sglang.__version__

        def __init__(self, capacity_tokens: int) -> None:
            super().__init__(capacity_tokens)
            self.cache = RadixCache.create_simulated(
                mock_allocator=NullAllocator(), page_size=BLOCK_TOKENS
            )
            self.slots = torch.arange(1 << 21, dtype=torch.int64)

        def prepare(self, tokens: np.ndarray) -> Any:
            out = array("q")
            out.frombytes(tokens.astype(np.int64).tobytes())
            return out

        def step(self, tokens: Any) -> int:
            cache = self.cache
            n = len(tokens)
            match = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens, limit=n - 1)))
            node = match.last_device_node
            cache.inc_lock_ref(node)
            key_len = n // BLOCK_TOKENS * BLOCK_TOKENS
            cache.insert(InsertParams(key=RadixKey(tokens), value=self.slots[:key_len].clone()))
            over = cache.evictable_size() + cache.protected_size() - self.capacity_tokens
            if over > 0:
                cache.evict(EvictParams(num_tokens=over))
            cache.dec_lock_ref(node)
            return int(match.device_prefix_len)

    return SGLang


# --- vLLM ------------------------------------------------------------------------------------


def _vllm_system() -> type[System]:
    import torch
    import vllm
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    torch.set_num_threads(1)  # as for SGLang: no OpenMP stalls on shared cores
    # CacheConfig.prefix_caching_hash_algo defaults to "sha256" (pickle + sha256).
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    block_hasher = get_request_block_hasher(BLOCK_TOKENS, hash_fn)
    sampling = SamplingParams(max_tokens=1)

    class VLLM(System):
        """vLLM v1's KVCacheManager (one full-attention group, prefix caching on), driven as
        the scheduler drives a new request: Request (hashes its blocks), get_computed_blocks,
        allocate_slots for the rest of the prompt, then free."""

        name = "vllm"
        version = vllm.__version__

        def __init__(self, capacity_tokens: int) -> None:
            super().__init__(capacity_tokens)
            # BlockPool keeps block 0 as its null block, so one more block gives
            # capacity // 16 usable ones.
            spec = FullAttentionSpec(
                block_size=BLOCK_TOKENS, num_kv_heads=1, head_size=1, dtype=torch.float16
            )
            config = KVCacheConfig(
                num_blocks=capacity_tokens // BLOCK_TOKENS + 1,
                kv_cache_tensors=[],
                kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
            )
            self.manager = KVCacheManager(
                config,
                max_model_len=1 << 22,
                scheduler_block_size=BLOCK_TOKENS,
                hash_block_size=BLOCK_TOKENS,
                enable_caching=True,
            )
            self.next_id = 0

        def step(self, tokens: Any) -> int:
            manager = self.manager
            self.next_id += 1
            request = Request(str(self.next_id), tokens, sampling, None, block_hasher=block_hasher)
            blocks, hit, _ = manager.get_computed_blocks(request)
            new = manager.allocate_slots(
                request,
                request.num_tokens - hit,
                num_new_computed_tokens=hit,
                new_computed_blocks=blocks,
            )
            if new is None:
                raise RuntimeError(f"vLLM could not allocate {len(tokens)} tokens")
            manager.free(request)
            return int(hit)

    return VLLM


LOADERS: dict[str, Callable[[], type[System]]] = {
    "kvtide": lambda: _kvtide_systems()[0],
    "kvtide-list": lambda: _kvtide_systems()[1],
    "kvtide-ghost": lambda: _kvtide_systems()[2],
    "kvtide-tel-null": lambda: _kvtide_telemetry_systems()[0],
    "kvtide-tel-prom": lambda: _kvtide_telemetry_systems()[1],
    "ref": lambda: _ref_systems()[0],
    "ref-vllm": lambda: _ref_systems()[1],
    "sglang": _sglang_system,
    "vllm": _vllm_system,
}


def replay(
    system: type[System], tokens: np.ndarray, offsets: np.ndarray, capacity_tokens: int
) -> tuple[int, int, int, int]:
    """One run on a fresh cache: hit tokens, then the wall and the CPU nanoseconds (this
    thread's) spent inside ``step``, and the CPU nanoseconds of that spent hashing where the
    system times it apart (kvtide). CPU time is the steadier one on shared cores."""
    cache = system(capacity_tokens)
    step = cache.step
    prepare = cache.prepare
    wall = time.perf_counter_ns
    cpu = time.thread_time_ns
    hit = 0
    wall_ns = 0
    cpu_ns = 0
    gc.collect()
    for i in range(len(offsets) - 1):
        prepared = prepare(tokens[offsets[i] : offsets[i + 1]])
        start_cpu = cpu()
        start = wall()
        hit += step(prepared)
        wall_ns += wall() - start
        cpu_ns += cpu() - start_cpu
    return hit, wall_ns, cpu_ns, cache.hash_ns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=sorted(LOADERS))
    parser.add_argument("data", type=Path)
    parser.add_argument("--capacity", required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    out: dict[str, Any] = {
        "system": args.system,
        "python": platform.python_version(),
        "executable": sys.executable,
    }
    try:
        system = LOADERS[args.system]()
    except Exception as exc:  # any import failure means "not importable"; say why
        out["error"] = f"not importable: {type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc(limit=-3)
        args.out.write_text(json.dumps(out))
        return 0
    out["version"] = system.version
    tokens = np.load(args.data / "tokens.npy", mmap_mode="r")
    offsets = np.load(args.data / "offsets.npy")
    prompt_tokens = int(offsets[-1])
    results = []
    for capacity in (int(c) for c in args.capacity.split(",")):
        hits, wall_ns, cpu_ns, hash_ns = [], [], [], []
        n = len(offsets) - 1
        for _ in range(args.runs):
            hit, wall_elapsed, cpu_elapsed, hashing = replay(system, tokens, offsets, capacity)
            hits.append(hit)
            hash_ns.append(hashing)
            wall_ns.append(wall_elapsed)
            cpu_ns.append(cpu_elapsed)
            print(
                f"  {args.system} {capacity:>9,} tokens: {cpu_elapsed / 1e3 / n:8.1f} us/request"
                f" CPU, {wall_elapsed / 1e3 / n:8.1f} wall, hit {hit / prompt_tokens:.4%}",
                file=sys.stderr,
                flush=True,
            )
        results.append(
            {
                "capacity_tokens": capacity,
                "hit_tokens": hits,
                "prompt_tokens": prompt_tokens,
                "requests": n,
                "wall_ns": wall_ns,
                "cpu_ns": cpu_ns,
                "hash_ns": hash_ns,
            }
        )
    out["results"] = results
    args.out.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
