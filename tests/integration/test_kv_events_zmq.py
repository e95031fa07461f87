"""KV events over real ZMQ sockets on 127.0.0.1: publish, subscribe, lose, replay, resync."""

from __future__ import annotations

import numpy as np
import pytest

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.hashing import hash_tokens
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.routing.ingest import SequencedIngest
from kvtide.state.kv_events import KvEventPublisher, KvEventSubscriber
from kvtide.state.kv_translate import EngineEventSink, EventTranslator, NativeEventSink
from kvtide.state.kv_wire import EngineBlockStored, EngineEventBatch
from kvtide.types import ReplicaId

Batch = EngineEventBatch

R = ReplicaId("r0")
SEED = 99


@pytest.fixture
def publisher() -> KvEventPublisher:
    pub = KvEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_steps=100)
    pub.start_replay_thread()
    yield pub  # type: ignore[misc]
    pub.close()


def _connect(
    pub: KvEventPublisher, sink: NativeEventSink | EngineEventSink, **kw: object
) -> tuple[KvEventSubscriber, SequencedIngest[EngineEventBatch]]:
    ingest: SequencedIngest[EngineEventBatch] = SequencedIngest(
        sink.apply, sink.clear, ManualClock()
    )
    sub = KvEventSubscriber(
        R,
        pub.bound_endpoint,
        ingest,
        replay_endpoint=pub.bound_replay_endpoint,
        **kw,  # type: ignore[arg-type]
    )
    # ZMQ's slow joiner: publish probes until one arrives (bounded), then replay the rest
    for _ in range(100):
        pub.publish(Batch(0.0, ()))
        if sub.poll(timeout_s=0.05):
            break
    else:
        pytest.fail("subscriber never connected")
    sub.bootstrap()
    return sub, ingest


def _drain(
    sub: KvEventSubscriber, want_next: int, ingest: SequencedIngest[EngineEventBatch]
) -> None:
    for _ in range(100):
        sub.poll(timeout_s=0.05)
        if ingest.next_seq(R) == want_next and not ingest.has_gap(R):
            return
    pytest.fail(f"stuck at {ingest.next_seq(R)}, wanted {want_next}")


def test_a_kvtide_cache_published_over_zmq_is_indexed_exactly(publisher: KvEventPublisher) -> None:
    index = GlobalPrefixIndex()
    sub, ingest = _connect(publisher, NativeEventSink(index))
    cache = KVCache(
        CacheConfig(capacity_blocks=30, record_events=True, ghost_blocks=0), ManualClock()
    )
    rng = np.random.default_rng(0)
    prompts = [hash_tokens(rng.integers(0, 1000, 16 * k), 16, SEED) for k in (5, 9, 12, 20)]
    for i in range(12):
        cache.access(prompts[i % 4], 0)
        publisher.publish_events(cache.take_events(), ts_s=float(i))
    _drain(sub, publisher.next_seq, ingest)
    for p in prompts:
        m = cache.match(p, touch=True)
        assert index.match(p).device.get(R, 0) == m.num_blocks
    sub.close()


def test_a_lost_batch_is_replayed(publisher: KvEventPublisher) -> None:
    index = GlobalPrefixIndex()
    sub, ingest = _connect(publisher, NativeEventSink(index))
    cache = KVCache(
        CacheConfig(capacity_blocks=100, record_events=True, ghost_blocks=0), ManualClock()
    )
    p = hash_tokens(np.arange(16 * 6), 16, SEED)
    cache.access(p[:2], 0)
    publisher.publish_events(cache.take_events(), 1.0, drop=True)  # never reaches the socket
    cache.access(p, 0)
    publisher.publish_events(cache.take_events(), 2.0)
    _drain(sub, publisher.next_seq, ingest)
    assert sub.num_replays >= 1 and ingest.counters.gaps == 1
    assert index.match(p).device == {R: 6}
    assert ingest.health.is_trusted
    sub.close()


def test_a_gap_the_publisher_no_longer_buffers_drops_and_rebuilds() -> None:
    pub = KvEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_steps=1)
    pub.start_replay_thread()
    try:
        index = GlobalPrefixIndex()
        translator = EventTranslator(16, SEED)
        sub, ingest = _connect(pub, EngineEventSink(index, translator))
        toks = list(range(64))
        ours = hash_tokens(toks, 16, SEED)

        def stored(blocks: range, parent: int | None) -> Batch:
            return Batch(
                0.0,
                (
                    EngineBlockStored(
                        tuple(b"h%d" % i for i in blocks),
                        parent if parent is None else b"h%d" % parent,
                        tuple(toks[16 * blocks.start : 16 * blocks.stop]),
                        16,
                    ),
                ),
            )

        pub.publish(stored(range(0, 2), None))
        pub.publish(stored(range(2, 3), 1), drop=True)
        pub.publish(stored(range(3, 4), 2), drop=True)  # the buffer keeps only this one...
        pub.publish(Batch(0.0, ()))  # ...then only this one: the replay cannot fill the gap
        _drain(sub, pub.next_seq, ingest)
        assert ingest.counters.resyncs == 1 and index.match(ours).device == {}
        pub.publish(stored(range(0, 4), None))  # the engine re-announces reused blocks
        _drain(sub, pub.next_seq, ingest)
        assert index.match(ours).device == {R: 4}
        sub.close()
    finally:
        pub.close()


def test_engine_hashes_translate_to_kvtide_hashes_from_token_ids(
    publisher: KvEventPublisher,
) -> None:
    index = GlobalPrefixIndex()
    translator = EventTranslator(16, SEED)
    sub, ingest = _connect(publisher, EngineEventSink(index, translator))
    toks = list(range(1000, 1000 + 48))
    publisher.publish(
        Batch(0.0, (EngineBlockStored((11, 22), None, tuple(toks[:32]), 16, medium="GPU"),))
    )
    publisher.publish(
        Batch(0.0, (EngineBlockStored((33,), 22, tuple(toks[32:48]), 16, medium="CPU"),))
    )
    _drain(sub, publisher.next_seq, ingest)
    m = index.match(hash_tokens(toks, 16, SEED))
    assert m.tier_blocks(R) == (2, 1, 0)
    assert translator.num_mapped(R) == 3
    sub.close()
