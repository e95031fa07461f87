"""The emulated engine's asyncio task: the simulator's ``EngineDriver`` and ``Scheduler`` on a
``ScaledClock``, woken when the next token is due, its step outputs sent to request streams.

One model, two clocks: the simulator calls the same driver from its event heap on a
ManualClock; here the wake-up is a ``loop.call_later`` timer on the wall clock (scaled by
``--speedup``) and arrivals and aborts come from HTTP handlers on the same thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import numpy as np

from kvtide.clock import ScaledClock
from kvtide.core.hashing import BlockHashes, hash_tokens
from kvtide.engine.driver import EngineDriver, StepOutput
from kvtide.engine.scheduler import RequestRecord, Scheduler
from kvtide.engine_server.kv_publisher import EnginePublisher
from kvtide.engine_server.metrics import EngineMetrics
from kvtide.engine_server.stream import RequestStream
from kvtide.routing.identity import cache_salt_seed
from kvtide.telemetry.online import EngineTelemetry
from kvtide.text import Tokenizer
from kvtide.types import Request

FILLER_WORDS = [
    "",
    "the",
    "tide",
    "came",
    "in",
    "over",
    "the",
    "flats",
    "while",
    "the",
    "harbour",
    "master",
    "kept",
    "his",
    "log",
    "of",
    "every",
    "ship",
    "that",
    "passed",
    "the",
    "light",
    "and",
    "the",
    "clerk",
    "wrote",
    "down",
    "each",
    "name",
    "and",
    "each",
    "cargo",
][1:]


def filler_tokens(tokenizer: Tokenizer) -> tuple[list[int], list[str]]:
    """Token ids and texts of the emulated output: words that are one token each, cycled."""
    ids: list[int] = []
    texts: list[str] = []
    for word in FILLER_WORDS:
        enc = tokenizer.encode(" " + word, add_special_tokens=False)
        if len(enc) == 1:
            ids.append(enc[0])
            texts.append(tokenizer.decode(enc))
    if not ids:  # a tokenizer with no such words: its first ordinary ids
        ids = list(range(min(16, tokenizer.vocab_size)))
        texts = [tokenizer.decode([i]) for i in ids]
    return ids, texts


class EmulatedEngine:
    """Runs ``driver`` in real time; ``submit`` and ``abort`` may be called from any handler."""

    def __init__(
        self,
        driver: EngineDriver,
        clock: ScaledClock,
        metrics: EngineMetrics,
        model_name: str,
        filler: Sequence[str],
        publisher: EnginePublisher | None = None,
        on_record: Callable[[RequestRecord], None] = lambda record: None,
        telemetry: EngineTelemetry | None = None,
    ) -> None:
        """``on_record`` receives each finished request's record on the engine's clock (what
        the simulator's metrics read), for tests and diagnosis."""
        self.driver = driver
        self.on_record = on_record
        self.telemetry = telemetry
        self.scheduler: Scheduler = driver.scheduler
        self.clock = clock
        self.metrics = metrics
        self.model_name = model_name
        self.filler = list(filler)
        self.publisher = publisher
        self.block_tokens = self.scheduler.block_tokens
        self.blocks = publisher.blocks if publisher is not None else None
        self._streams: dict[str, RequestStream] = {}
        self._hashes: dict[str, BlockHashes] = {}
        self._seeds: dict[str | None, int] = {}
        self.kv_lease_s = 30.0
        """How long (model seconds) a finished ``hold_kv`` request's blocks wait for
        ``release_held`` before ``expire_held`` lets them go (vLLM's ``kv_lease_duration``)."""
        self.held_until: dict[str, float] = {}
        """Finished ``hold_kv`` requests, by when their lease ends."""
        self._kick: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        metrics.bind_gauges(
            lambda: float(self.scheduler.num_running),
            lambda: float(self.scheduler.num_waiting),
            self.kv_usage,
            lambda: float(self.scheduler.cache.tree.num_evicted_total),
        )

    def kv_usage(self) -> float:
        """Fraction of the KV pool held by requests (cached but unreferenced blocks count as
        free, as in vLLM's ``kv_cache_usage_perc``)."""
        cache = self.scheduler.cache
        return 1.0 - (cache.pool.num_free + cache.num_evictable_blocks) / cache.capacity_blocks

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def hashes_for(self, token_ids: Sequence[int], cache_salt: str | None) -> BlockHashes:
        seed = self._seeds.get(cache_salt)
        if seed is None:
            seed = self._seeds[cache_salt] = cache_salt_seed(self.model_name, cache_salt)
        return hash_tokens(np.asarray(token_ids, dtype=np.int64), self.block_tokens, seed)

    def submit(
        self,
        request_id: str,
        token_ids: Sequence[int],
        max_tokens: int,
        cache_salt: str | None,
        priority: int = 0,
        remote_tokens: int = 0,
        hold_kv: bool = False,
    ) -> RequestStream:
        """Queues a request now (``priority``: its place among the waiting under the
        ``priority`` scheduling policy; ``remote_tokens``: prompt tokens whose KV a prefill
        engine holds, loaded over this engine's NIC; ``hold_kv``: a prefill whose blocks a
        decode engine will read, kept when it ends at its length until ``release_held`` or
        its lease's end); raises ``CapacityError`` when it can never fit the KV pool."""
        now = self.clock.now()  # the arrival, before the engine's own work on the request
        self._catch_up(now)
        hashes = self.hashes_for(token_ids, cache_salt)
        request = Request(
            request_id=request_id,
            arrival_s=now,
            prompt_tokens=len(token_ids),
            output_tokens=max_tokens,
            block_tokens=self.block_tokens,
        )
        self.driver.add(
            request, hashes, now, priority=priority, remote_tokens=remote_tokens, hold_kv=hold_kv
        )
        stream = RequestStream(
            request_id, len(token_ids), max_tokens, self.metrics, self.block_tokens
        )
        self._streams[request_id] = stream
        if self.blocks is not None:
            self._hashes[request_id] = hashes
            self.blocks.hold(hashes, token_ids, cache_salt)
        self._wake()
        return stream

    def abort(self, request_id: str) -> None:
        """The client went away (or a stop string ended it): free its KV now."""
        now = self.clock.now()
        self._catch_up(now)
        if self.driver.abort(request_id, now):
            self._wake()

    def release_held(self, request_id: str) -> bool:
        """The decode engine has read a held request's KV: its blocks go (its prompt's stay
        cached, evictable). ``False`` if it holds none by that id (its lease ran out)."""
        now = self.clock.now()
        self._catch_up(now)
        self.held_until.pop(request_id, None)
        if not self.driver.release_held(request_id, now):
            return False
        self._wake()  # what waited for those blocks may start
        return True

    def renew_held(self, request_id: str, until_s: float) -> None:
        """A heartbeat: a held request's lease runs until ``until_s`` at least."""
        if request_id in self.held_until:
            self.held_until[request_id] = max(self.held_until[request_id], until_s)

    def expire_held(self) -> list[str]:
        """Lets go the held requests whose lease has ended; returns their ids."""
        now = self.clock.now()
        due = [rid for rid, until in self.held_until.items() if until <= now]
        for rid in due:
            self.release_held(rid)
        return due

    def _wake(self) -> None:
        kick = self._kick
        if kick is not None and not kick.done():
            kick.set_result(None)

    def _catch_up(self, now: float) -> None:
        """Applies the iterations that ended by ``now`` before an arrival or an abort at
        ``now`` changes the engine, as the simulator's event heap would have (a late timer
        must not let the change reach an iteration that had already begun)."""
        wake = self.driver.next_wake_s
        while wake is not None and wake <= now:
            self.step(now)
            wake = self.driver.next_wake_s

    def step(self, now: float) -> bool:
        """Applies what is due by ``now`` and hands the tokens to their streams; whether it
        handed any (the next iteration is then not planned yet: see ``run``)."""
        outputs = self.driver.on_wake(now, defer_plan=True)
        if self.publisher is not None:
            # before the outputs: a request that finishes here releases its blocks' tokens
            events = self.driver.take_events()
            if events:
                # stamped in Unix time, as vLLM stamps its batches: a router measures the
                # events' delay against its own time.time()
                self.publisher.publish(events, self.clock.epoch_s(now))
        if self.telemetry is not None:
            self.telemetry.tick()  # at most once per detector interval: cheap otherwise
        if outputs:
            self._dispatch(outputs, now)
        return bool(outputs)

    def _dispatch(self, outputs: list[StepOutput], now: float) -> None:
        streams = self._streams
        filler = self.filler
        k = len(filler)
        for out in outputs:
            stream = streams.get(out.request_id)
            if stream is None:
                continue
            if out.finish_reason == "abort":
                self._end(stream, "abort")
                continue
            if out.is_first_token:
                stream.first_token(out.cached_tokens, out.fetched_tokens)
            stream.push(filler[(out.num_generated - 1) % k])
            if out.record is not None:
                self.on_record(out.record)
            if out.finish_reason is not None:
                stream.is_length_capped = out.finish_reason == "length"
                self._end(stream, out.finish_reason)
            elif stream.is_finished:
                # a stop string ended it at this token: leave the engine now, before its next
                # iteration (or a later output of this step) makes tokens it does not have
                self._end(stream, "stop")
                self.driver.abort(out.request_id, now)

    def _end(self, stream: RequestStream, reason: str) -> None:
        stream.finish(reason)
        rid = stream.request_id
        del self._streams[rid]
        if rid in self.scheduler.held:  # a hold_kv request that ended at its length
            self.held_until[rid] = self.clock.now() + self.kv_lease_s
        hashes = self._hashes.pop(stream.request_id, None)
        if hashes is not None and self.blocks is not None:
            self.blocks.release(hashes)

    async def run(self) -> None:
        """The engine task: step, sleep until the next token is due or work arrives, repeat.
        Ends when ``close`` is called."""
        loop = asyncio.get_running_loop()
        clock = self.clock
        while not self._closed:
            if self.step(clock.now()):
                # the woken handlers write these tokens before this task plans the next
                # iteration (the driver's plan is deferred until asked for)
                await asyncio.sleep(0)
                continue
            kick = self._kick = loop.create_future()
            wake = self.driver.next_wake_s
            timer = None
            if wake is not None:
                delay = clock.to_wall_s(wake - clock.now())
                timer = loop.call_later(delay if delay > 0 else 0, _resolve, kick)
            await kick
            if timer is not None:
                timer.cancel()

    def close(self) -> None:
        """Stops the task; requests still in flight end with ``abort``."""
        self._closed = True
        for stream in list(self._streams.values()):
            self._end(stream, "abort")
        self._wake()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
