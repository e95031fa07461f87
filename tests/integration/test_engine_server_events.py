"""Events are the truth: a GlobalPrefixIndex fed by `kvtide engine`'s KV events over real ZMQ
(vLLM's wire format, translated by token ids as for a real vLLM) holds exactly the blocks the
engine's cache holds at the end of a run, also when messages were lost on the way and repaired
through the replay socket; and no batch announces blocks before a prefill chunk computed them.

The server runs in this process (in a thread, on its own event loop) so that the test can read
the engine's cache at the end; requests and events still cross real loopback sockets.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import openai
import pytest
from engine_process import free_port, in_process_engine

from kvtide.clock import ManualClock
from kvtide.costs.cost_model import CostModel
from kvtide.costs.specs import gpu_preset, resolve_model
from kvtide.engine.scheduler import RequestRecord
from kvtide.engine.timing import IterationTimer
from kvtide.engine_server.server import EngineServer, ServerConfig
from kvtide.routing.identity import cache_salt_seed
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.routing.ingest import SequencedIngest, snapshot_events
from kvtide.state.kv_events import KvEventSubscriber
from kvtide.state.kv_translate import EngineEventSink, EventTranslator
from kvtide.state.kv_wire import EngineBlockStored, EngineEventBatch
from kvtide.types import ReplicaId

R = ReplicaId("engine-0")
MODEL = "emu"
BT = 16


class LossySubscriber(KvEventSubscriber):
    """Loses each message numbered in ``lose`` the first time it arrives (not on replay)."""

    def __init__(self, *args: object, lose: set[int], **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.lose = set(lose)
        self.lost: list[int] = []
        self._replaying = False

    def _replay_from(self, first: int, on_answer: Callable[[], None] | None = None) -> bool:
        self._replaying = True
        try:
            return super()._replay_from(first, on_answer)
        finally:
            self._replaying = False

    def _receive(self, seq_raw: bytes, payload: bytes) -> object:
        seq = int.from_bytes(seq_raw, "big", signed=True)
        if seq in self.lose and not self._replaying:
            self.lose.discard(seq)
            self.lost.append(seq)
            return None
        return super()._receive(seq_raw, payload)


def _subscriber(
    server: EngineServer, lose: set[int]
) -> tuple[LossySubscriber, GlobalPrefixIndex, EventTranslator]:
    pub = server.built.publisher
    assert pub is not None
    index = GlobalPrefixIndex()
    translator = EventTranslator(BT, lambda e: cache_salt_seed(MODEL, e.cache_salt))
    sink = EngineEventSink(index, translator)
    ingest: SequencedIngest[EngineEventBatch] = SequencedIngest(
        sink.apply, sink.clear, ManualClock()
    )
    sub = LossySubscriber(
        R,
        pub.publisher.bound_endpoint,
        ingest,
        replay_endpoint=pub.publisher.bound_replay_endpoint,
        lose=lose,
    )
    return sub, index, translator


def _prompts(rng: random.Random, n: int) -> list[tuple[list[int], str | None]]:
    """Shared prefixes (system prompts, documents) under three salts, fresh suffixes."""
    prefixes = [
        [rng.randrange(100, 40_000) for _ in range(rng.randrange(2, 12) * BT)] for _ in range(6)
    ]
    out = []
    for _ in range(n):
        prefix = rng.choice(prefixes)
        suffix = [rng.randrange(100, 40_000) for _ in range(rng.randrange(1, 60))]
        out.append((prefix + suffix, rng.choice([None, "a", "b"])))
    return out


async def _drive(url: str, prompts: list[tuple[list[int], str | None]]) -> None:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
    sem = asyncio.Semaphore(8)

    async def one(ids: list[int], salt: str | None) -> None:
        async with sem:
            extra = {"cache_salt": salt} if salt else None
            await client.completions.create(model=MODEL, prompt=ids, max_tokens=8, extra_body=extra)

    await asyncio.gather(*(one(ids, salt) for ids, salt in prompts))
    await client.close()


def _engine_blocks(server: EngineServer) -> set[int]:
    scheduler = server.built.scheduler
    assert scheduler is not None
    blocks: set[int] = set()
    for event in snapshot_events(scheduler.cache):
        blocks.update(int(h) for h in event.block_hashes)  # type: ignore[union-attr]
    return blocks


@pytest.mark.parametrize("lose", [set(), {3, 4, 17, 40}], ids=["no-loss", "lost-and-replayed"])
def test_index_fed_by_events_holds_exactly_the_engine_blocks(lose: set[int]) -> None:
    config = ServerConfig(
        port=free_port(),
        speedup=500,
        served_model_name=MODEL,
        kv_cache_tokens=1600,  # 100 blocks: the run evicts
        block_tokens=BT,
        kv_events_port=0,
        max_batched_tokens=64,  # 4 blocks per prefill chunk
    )
    with in_process_engine(config) as server:
        sub, index, translator = _subscriber(server, lose)
        sub.bootstrap()  # nothing published yet: joins at sequence 0
        asyncio.run(_drive(f"http://127.0.0.1:{config.port}", _prompts(random.Random(7), 120)))
        pub = server.built.publisher
        assert pub is not None
        last = pub.publisher.next_seq - 1
        for _ in range(200):
            sub.poll(timeout_s=0.05)
            if sub.ingest.next_seq(R) > last:
                break
        assert sub.ingest.next_seq(R) == last + 1
        assert sorted(sub.lost) == sorted(lose)
        if lose:
            assert sub.num_replays >= 1
        truth = _engine_blocks(server)
        scheduler = server.built.scheduler
        assert scheduler is not None and scheduler.cache.tree.num_evicted_total > 0
        assert index.replica_blocks().get(R, 0) == len(truth)
        assert all(index.holds(R, h) for h in truth)  # type: ignore[arg-type]
        assert translator.counters.unresolved_stores == 0
        assert translator.counters.malformed == 0
        sub.close()


def test_no_block_is_announced_before_the_iteration_computing_it_ends() -> None:
    """A 40-block prompt prefilled in 4-block chunks: every batch's BlockStored blocks, counted
    up to the batch's timestamp (Unix time, as vLLM's, read back on the engine's clock), are at
    most 4 per prefill iteration that had ended by then (iteration times from the same cost
    model), and they come over several batches, not all at admission. Slow time (--speedup
    0.1: a chunk takes ~76 ms of wall time), so that even a starved event loop wakes more than
    once during the prefill."""
    config = ServerConfig(
        port=free_port(),
        speedup=0.1,
        served_model_name=MODEL,
        kv_cache_tokens=16_000,
        block_tokens=BT,
        kv_events_port=0,
        max_batched_tokens=64,
    )
    records: list[RequestRecord] = []
    with in_process_engine(config) as server:
        server.built.backend.on_record = records.append  # type: ignore[attr-defined]
        clock = server.built.backend.clock  # type: ignore[attr-defined]
        sub, _, _ = _subscriber(server, set())
        batches: list[tuple[float, int]] = []

        def count(replica: ReplicaId, batch: EngineEventBatch) -> None:
            n = sum(len(e.block_hashes) for e in batch.events if isinstance(e, EngineBlockStored))
            if n:
                batches.append((clock.from_epoch_s(batch.ts), n))  # Unix time -> engine's

        sub.ingest = SequencedIngest(count, lambda r: None, ManualClock())
        sub.bootstrap()
        rng = random.Random(3)
        ids = [rng.randrange(100, 40_000) for _ in range(40 * BT + 5)]
        asyncio.run(_drive(f"http://127.0.0.1:{config.port}", [(ids, None)]))
        for _ in range(100):
            sub.poll(timeout_s=0.05)
        sub.close()
    (record,) = records
    timer = IterationTimer.from_cost_model(
        CostModel(resolve_model(config.model), gpu_preset(config.gpu))
    )
    ends, t = [], record.arrival_s
    for k in range(len(ids) // 64 + 1):  # 64-token chunks; the last carries the tail
        chunk = min(64, len(ids) - 64 * k)
        t += timer.iteration_s([(chunk, 64 * k)], 0, 0)
        ends.append(t)
    assert sum(n for _, n in batches) == 40 and len(batches) > 1
    announced = 0
    for ts, n in batches:
        announced += n
        assert announced <= 4 * sum(1 for end in ends if end <= ts + 1e-9)
