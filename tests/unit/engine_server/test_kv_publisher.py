"""The engine's KV events on a real ZMQ socket: token ids and salt in BlockStored, holds counted
per request and tier, and SGLang's shape (signed int64 hashes) behind the flag."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from kvtide.core.events import BlockRemoved, BlockStored
from kvtide.core.hashing import hash_tokens
from kvtide.engine_server.kv_publisher import BlockTokens, EnginePublisher, EventFormat
from kvtide.state.kv_events import KvEventPublisher
from kvtide.state.kv_wire import EngineBlockStored, decode_batch
from kvtide.types import Tier

BT = 4


def _received(fmt: EventFormat) -> tuple[list[object], list[int]]:
    ctx = zmq.Context.instance()
    pub = KvEventPublisher("tcp://127.0.0.1:*", None, context=ctx)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.bound_endpoint)
    blocks = BlockTokens(BT)
    engine = EnginePublisher(pub, blocks, event_format=fmt)
    tokens = list(range(100, 112))  # three blocks
    hashes = hash_tokens(np.asarray(tokens), BT, seed=7).tolist()
    blocks.hold(hashes, tokens, "salty")
    try:
        for _ in range(100):  # ZMQ's slow joiner: probe until the subscriber is connected
            engine.publish([BlockRemoved((hashes[0],))], 0.0)
            if sub.poll(50):
                sub.recv_multipart()
                break
        else:
            pytest.fail("subscriber never connected")
        while sub.poll(50):
            sub.recv_multipart()
        blocks.hold(hashes, tokens, "salty")  # the probe above released one hold per probe
        engine.publish([BlockStored(tuple(hashes[:2]), None, None, BT)], 1.0)
        engine.publish([BlockStored((hashes[2],), hashes[1], None, BT)], 2.0)
        assert sub.poll(2000)
        events = [decode_batch(sub.recv_multipart()[2]).events[0]]
        assert sub.poll(2000)
        events.append(decode_batch(sub.recv_multipart()[2]).events[0])
    finally:
        sub.close(linger=0)
        engine.close()
    return events, hashes


def test_block_stored_carries_token_ids_and_salt() -> None:
    events, hashes = _received("vllm")
    first, second = events
    assert isinstance(first, EngineBlockStored) and isinstance(second, EngineBlockStored)
    assert first.block_hashes == tuple(hashes[:2]) and first.parent_block_hash is None
    assert first.token_ids == tuple(range(100, 108)) and first.cache_salt == "salty"
    assert second.parent_block_hash == hashes[1] and second.token_ids == (108, 109, 110, 111)
    assert second.cache_salt is None  # as vLLM: the salt is in the request's first block only


def test_sglang_shape_signs_hashes_and_keeps_its_salt_field() -> None:
    events, hashes = _received("sglang")
    first = events[0]
    assert isinstance(first, EngineBlockStored)
    signed = [h - (1 << 64) if h >= 1 << 63 else h for h in hashes[:2]]
    assert list(first.block_hashes) == signed
    assert all(-(1 << 63) <= h < 1 << 63 for h in first.block_hashes)  # type: ignore[operator]
    assert first.cache_salt == "salty" and first.token_ids == tuple(range(100, 108))


def test_holds_keep_tokens_while_a_request_or_a_tier_holds_the_block() -> None:
    blocks = BlockTokens(BT)
    tokens = list(range(8))
    hashes = hash_tokens(np.asarray(tokens), BT, seed=1).tolist()
    blocks.hold(hashes, tokens, None)  # request A
    assert blocks.stored(BlockStored(tuple(hashes), None, None, BT)) == (tuple(tokens), None)
    blocks.release(hashes)  # A finishes: the device tier still holds both
    assert len(blocks) == 2
    blocks.release([hashes[1]])  # the device evicts the second block
    assert len(blocks) == 1
    assert blocks.stored(BlockStored((hashes[1],), hashes[0], None, BT)) == ((), None)
    blocks.release([hashes[0]])
    assert len(blocks) == 0


class _Capture:
    """The batches an ``EnginePublisher`` hands its ZMQ publisher, kept instead of sent."""

    def __init__(self) -> None:
        self.batches: list[object] = []

    def publish(self, batch: object) -> int:
        self.batches.append(batch)
        return len(self.batches) - 1


def test_an_offload_in_one_batch_announces_the_host_store_with_its_tokens() -> None:
    """The device's removal comes before the host tier's store of the same blocks in one
    batch: released at once, the store found no tokens and went out empty (which the
    gateway drops as malformed: offloaded blocks were never indexed)."""
    blocks = BlockTokens(BT)
    tokens = list(range(8))
    hashes = tuple(hash_tokens(np.asarray(tokens), BT, seed=1).tolist())
    blocks.hold(hashes, tokens, "s")  # a request brought them
    capture = _Capture()
    engine = EnginePublisher(capture, blocks)  # type: ignore[arg-type]
    engine.publish([BlockStored(hashes, None, None, BT)], 0.0)  # the device stores them
    blocks.release(hashes)  # the request finished: the device tier alone holds them
    offload = [BlockRemoved(hashes), BlockStored(hashes, None, None, BT, Tier.HOST)]
    engine.publish(offload, 1.0)
    host_store = capture.batches[1].events[1]  # type: ignore[attr-defined]
    assert isinstance(host_store, EngineBlockStored) and host_store.medium == "CPU"
    assert host_store.token_ids == tuple(tokens) and host_store.cache_salt == "s"
    assert len(blocks) == 2  # the host tier holds them now
