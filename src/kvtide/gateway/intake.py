"""KV events from each engine over ZMQ into the gateway's index, off the event loop.

Receiving, decoding and translating (engine hash -> kvtide hash from token ids) run in a
worker thread of the intake's own, one ``poll`` at a time; what they would do to the index is
staged as a list of operations and applied on the event loop in one synchronous step. Routing
also runs on the loop, so a lookup never sees half a batch, and a resync (clear, then the
replayed batches) never shows a concurrent lookup an emptied replica. An engine restart (its
sequence numbers start again) is a new epoch: its entries are cleared before the new stream.

A poll waits for the engine's next batch up to ``poll_s`` (1 s), or until the loop wakes it
through an inproc socket (a restart to replay, the intake stopping), so a quiet engine costs
one thread round trip a second. Each round trip (executor hand-off, ZMQ poll, the loop's
wake-up) took ~0.35 ms of CPU on a 2-core VM: four engines polled every 50 ms, as before, cost
the gateway 27-33 ms of CPU a second at rest, 3.3 ms now (bench/gateways.py's idle column,
docs/gateways.md run 12).

Lag (Unix time now minus the batch's stamp, vLLM's ``time.time()``), sequence gaps and resyncs
are counted by the worker's own ``IndexHealth`` and added to the router's (``health``) on the
loop after each poll: the router's is read by routing and by the metrics, on the loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import zmq

from kvtide.clock import EpochClock
from kvtide.core.events import KVEvent
from kvtide.routing.consistency import IndexHealth, ReplicaConsistency
from kvtide.routing.index import IndexStore
from kvtide.routing.ingest import Gap, SequencedIngest
from kvtide.state.kv_events import KvEventSubscriber
from kvtide.state.kv_translate import EventTranslator
from kvtide.state.kv_wire import EngineBlockStored, EngineEventBatch
from kvtide.types import ReplicaId

Op = tuple[str, list[KVEvent]]
"""("clear", []) or ("apply", events)."""


class EpochIngest(SequencedIngest[EngineEventBatch]):
    """``SequencedIngest`` that treats a live batch numbered below the one expected as an
    engine restart. ZMQ PUB/SUB never redelivers, so old numbers come only from a replay, and
    from the live copies of what a replay already gave: the replay that repairs a gap returns
    every batch the engine buffers, including those published while it ran, which the SUB
    socket then delivers again. Taken for a restart, those cleared the replica's every entry
    after a lost batch under load. A live batch is such a copy when a replay gave its number
    with the same publish stamp (a restarted engine's batch of that number has its own);
    the replay's stamps are kept until the live stream passes its last. (A restarted engine
    that has already published past the old numbering looks like a gap instead; the health
    checker's re-admission restarts the intake for that case.)"""

    num_epochs = 0
    replaying = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # per replica: the last replay's batches, number -> publish stamp, in order
        self._replayed: dict[ReplicaId, dict[int, float]] = {}

    def receive(
        self, replica: ReplicaId, seq: int, payload: EngineEventBatch, sent_s: float | None = None
    ) -> Gap | None:
        if self.replaying:
            self._replayed.setdefault(replica, {})[seq] = payload.ts
            return super().receive(replica, seq, payload, sent_s)
        replayed = self._replayed.get(replica)
        if replayed is not None and seq > next(reversed(replayed)):
            del self._replayed[replica]  # FIFO: no live copy of a replayed batch follows
            replayed = None
        nxt = self.next_seq(replica)
        copy = replayed is not None and replayed.get(seq) == payload.ts
        if nxt is not None and seq < nxt and not copy:
            self.num_epochs += 1
            self.rewind(replica)
        return super().receive(replica, seq, payload, sent_s)

    def rewind(self, replica: ReplicaId) -> None:
        self._replayed.pop(replica, None)
        super().rewind(replica)


class EpochSubscriber(KvEventSubscriber):
    """Tells its ``EpochIngest`` when batches come from a replay."""

    ingest: EpochIngest

    def _replay_from(self, first: int, on_answer: Callable[[], None] | None = None) -> bool:
        self.ingest.replaying = True
        try:
            return super()._replay_from(first, on_answer)
        finally:
            self.ingest.replaying = False


@dataclass(slots=True)
class IntakeStats:
    batches: int = 0
    epochs: int = 0
    resyncs: int = 0
    gaps: int = 0
    bootstrap_failures: int = 0  # replays at (re)start unanswered or cut short, each retried


_WAKE_IDS = itertools.count()


class EventIntake:
    """One engine's event stream. ``seed_for`` gives the namespace seed the gateway hashes
    that engine's requests in, from a stored block's ``cache_salt`` and ``lora_name`` (a
    request for an adapter is hashed in the adapter's namespace). ``executor``: the
    thread its polls run in; by default one of its own, so that polls that wait a second
    never queue behind other engines' (``close`` shuts it down)."""

    RETRY_FIRST_S = 1.0
    RETRY_MAX_S = 30.0

    def __init__(
        self,
        replica: ReplicaId,
        endpoint: str,
        replay_endpoint: str | None,
        block_tokens: int,
        seed_for: Callable[[str | None, str | None], int],
        index: IndexStore,
        executor: ThreadPoolExecutor | None = None,
        poll_s: float = 1.0,
        after_commit: Callable[[ReplicaId, list[Op]], Awaitable[None]] | None = None,
        health: IndexHealth | None = None,
        on_batches: Callable[[int], None] | None = None,
        on_bootstrap_failures: Callable[[int], None] | None = None,
    ) -> None:
        self.replica = replica
        self.on_batches = on_batches
        """Told how many batches each poll received (the gateway's counter)."""
        self.on_bootstrap_failures = on_bootstrap_failures
        """Told how many bootstrap replays failed since the last poll (the gateway's counter)."""
        self.health = health
        self.index = index
        self._own_executor = executor is None
        self.executor = executor or ThreadPoolExecutor(1, thread_name_prefix=f"kvtide-{replica}")
        self.poll_s = poll_s
        self.replay_endpoint = replay_endpoint
        self.after_commit = after_commit
        self._ops: list[Op] = []
        seeds: dict[tuple[str | None, str | None], int] = {}

        def seed_of(e: EngineBlockStored) -> int:
            key = (e.cache_salt, e.lora_name)
            seed = seeds.get(key)
            if seed is None:
                seed = seeds[key] = seed_for(*key)
            return seed

        self.translator = EventTranslator(block_tokens, seed_of)
        self.ingest = EpochIngest(self._stage_apply, self._stage_clear, EpochClock())
        self._published = ReplicaConsistency()
        self.subscriber = EpochSubscriber(
            replica, endpoint, self.ingest, replay_endpoint=replay_endpoint
        )
        self.stats = IntakeStats()
        self.is_connected = False
        self._restart = True  # bootstrap from the replay socket on the first poll
        # a bootstrap whose replay went unanswered (an engine still binding its replay
        # socket, a slow one) is tried again, 1 s later, then 2, 4 ... up to 30 s apart
        self._retry_at: float | None = None
        self._retry_s = self.RETRY_FIRST_S
        self._bootstrap_failures = 0  # counted in the worker, copied to stats on the loop
        self._closed = False
        # the loop's way to end a poll early: PAIR sockets, the receiver used in the worker
        # only, the sender on the loop until the run ends, then by ``close``
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        wake = f"inproc://kvtide-intake-wake-{next(_WAKE_IDS)}"
        self._wake_rx = ctx.socket(zmq.PAIR)
        self._wake_rx.bind(wake)
        self._wake_tx = ctx.socket(zmq.PAIR)
        self._wake_tx.connect(wake)
        self._poller = zmq.Poller()
        self._poller.register(self.subscriber.socket, zmq.POLLIN)
        self._poller.register(self._wake_rx, zmq.POLLIN)

    def _stage_apply(self, replica: ReplicaId, batch: EngineEventBatch) -> None:
        self._ops.append(("apply", self.translator.translate(replica, batch.events)))

    def _stage_clear(self, replica: ReplicaId) -> None:
        self.translator.clear(replica)
        self._ops.append(("clear", []))

    def restart(self) -> None:
        """The engine came back after an ejection: start over from its replay buffer."""
        self._restart = True
        self._wake()

    def _wake(self) -> None:
        """On the loop: ends the poll running now (or the next one) at once."""
        with contextlib.suppress(zmq.ZMQError):  # a wake already queued, or the intake closed
            self._wake_tx.send(b"", zmq.NOBLOCK)

    def _poll(self) -> tuple[int, list[Op]]:
        """In the worker thread: one poll (up to ``poll_s`` for the first batch, less when
        woken or a bootstrap is due again); returns the batches received and staged ops."""
        if self._closed:
            return 0, []
        if not self._restart:
            wait_s = self.poll_s
            if self._retry_at is not None:
                wait_s = max(0.0, min(wait_s, self._retry_at - time.monotonic()))
            ready = dict(self._poller.poll(int(wait_s * 1000)))
            if self._wake_rx in ready:
                while self._wake_rx.poll(0):
                    self._wake_rx.recv()
            if self._closed:
                return 0, []
            if self._retry_at is not None and time.monotonic() >= self._retry_at:
                self._restart = True
        if self._restart:
            self._restart = False
            self._bootstrap()
        got = self.subscriber.poll(0.0)
        ops, self._ops = self._ops, []
        return got, ops

    def _bootstrap(self) -> None:
        if self.replay_endpoint is None:
            self.ingest.rewind(self.replica)
            return
        if self.subscriber.bootstrap(0):
            self._retry_at, self._retry_s = None, self.RETRY_FIRST_S
            return
        self._bootstrap_failures += 1
        self._retry_at = time.monotonic() + self._retry_s
        self._retry_s = min(2 * self._retry_s, self.RETRY_MAX_S)

    def commit(self, ops: list[Op]) -> None:
        """On the loop: the staged operations, in one synchronous step."""
        for kind, events in ops:
            if kind == "clear":
                self.index.clear_replica(self.replica)
            else:
                self.index.apply_all(self.replica, events)

    def publish_health(self) -> None:
        """On the loop, between polls: what the worker's ingest counted since the last call
        (lag samples, lost batches, gaps, resyncs), added to the router's ``health``."""
        if self.health is None:
            return
        src = self.ingest.health.replicas.get(self.replica)
        if src is None:
            return
        last = self._published
        num_lag = src.num_lag_samples - last.num_lag_samples
        lost = src.events_lost - last.events_lost
        gaps = src.gaps - last.gaps
        resyncs = src.resyncs - last.resyncs
        if not (num_lag or lost or gaps or resyncs):
            return
        dst = self.health.replicas.get(self.replica)
        if dst is None:
            dst = self.health.replicas[self.replica] = ReplicaConsistency()
        if num_lag:
            dst.last_lag_s = src.last_lag_s
            dst.max_lag_s = max(dst.max_lag_s, src.max_lag_s)
            self.health.max_lag_s = max(self.health.max_lag_s, src.max_lag_s)
            dst.sum_lag_s += src.sum_lag_s - last.sum_lag_s
            dst.num_lag_samples += num_lag
        # a gap is repaired (replayed or resynced) before its poll returns: trust is not
        # touched, only the counts move
        dst.events_lost += lost
        dst.gaps += gaps
        dst.resyncs += resyncs
        last.num_lag_samples, last.sum_lag_s = src.num_lag_samples, src.sum_lag_s
        last.events_lost, last.gaps, last.resyncs = src.events_lost, src.gaps, src.resyncs

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                got, ops = await loop.run_in_executor(self.executor, self._poll)
                self.publish_health()
                if ops:
                    self.commit(ops)
                    if self.after_commit is not None:
                        await self.after_commit(self.replica, ops)
                self.stats.batches += got
                if got and self.on_batches is not None:
                    self.on_batches(got)
                self.stats.epochs = self.ingest.num_epochs
                self.stats.resyncs = self.ingest.counters.resyncs
                self.stats.gaps = self.ingest.counters.gaps
                failed = self._bootstrap_failures - self.stats.bootstrap_failures
                if failed and self.on_bootstrap_failures is not None:
                    self.on_bootstrap_failures(failed)
                self.stats.bootstrap_failures += failed
                self.is_connected = True
        finally:
            self._closed = True
            self._wake()  # the worker's poll returns now, not in up to poll_s

    def close(self) -> None:
        """After ``run`` ended: waits for its last poll (woken, so at once) when the intake
        owns its thread, then closes the sockets."""
        self._closed = True
        self._wake()
        if self._own_executor:
            self.executor.shutdown(wait=True)
        self.subscriber.close()
        self._wake_tx.close(linger=0)
        self._wake_rx.close(linger=0)
