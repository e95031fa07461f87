"""The gateway's KV-event intake in the gateway itself, over real ZMQ, against a stand-in
engine's HTTP side (its /v1/models): blocks land in the namespace requests for them are
hashed in (the base model's, read from /v1/models when the replica names none, or the LoRA
adapter's), a malformed event does not end the intake, and with ``--state redis://`` a
recovery rewrites Redis from the local index without forgetting what the engine's replay
buffer no longer holds."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from tests.integration.gateway.procs import free_port

from kvtide.core.hashing import hash_tokens
from kvtide.gateway.app import Gateway
from kvtide.gateway.config import GatewayConfig, ReplicaSpec
from kvtide.state.kv_events import KvEventPublisher
from kvtide.state.kv_wire import EngineBlockStored, EngineEventBatch
from kvtide.types import ReplicaId

pytestmark = pytest.mark.timeout(60)

BT = 16
MODELS = (
    b'{"object":"list","data":[{"id":"emu","object":"model","parent":null},'
    b'{"id":"lora-a","object":"model","parent":"emu"}]}'
)


def _stored(
    tokens: np.ndarray, base: int, parent: int | None = None, lora: str | None = None
) -> EngineBlockStored:
    n = len(tokens) // BT
    return EngineBlockStored(
        block_hashes=tuple(range(base, base + n)),
        parent_block_hash=parent,
        token_ids=tuple(int(t) for t in tokens),
        block_size=BT,
        lora_name=lora,
    )


async def _until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.02)


async def _engine_http(models_delay_s: float) -> tuple[asyncio.Server, str]:
    """An engine's HTTP side: /v1/models after ``models_delay_s`` (an engine still busy),
    200 with an empty object for anything else (health, metrics)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        body = b"{}"
        if line.split()[1] == b"/v1/models":
            await asyncio.sleep(models_delay_s)
            body = MODELS
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
        writer.write(head.encode() + b"\r\nconnection: close\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", free_port())
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def _run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 45))


def test_blocks_land_in_the_base_models_namespace_or_their_adapters() -> None:
    """A replica added without a model: its intake waits for /v1/models (started before,
    every block went under a placeholder name for the intake's life), and a block stored
    under a LoRA adapter is the adapter's, as a request naming the adapter is hashed."""

    async def scenario() -> None:
        server, url = await _engine_http(models_delay_s=0.3)
        endpoint, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        pub = KvEventPublisher(endpoint, replay)
        pub.start_replay_thread()
        early = np.arange(0, 64)  # cached before the gateway knew the engine
        pub.publish(EngineEventBatch(time.time(), (_stored(early, 1000),)))
        gw = Gateway(GatewayConfig(tokenizer="smollm2", tenant_secret="s"))
        try:
            async with gw.lifespan():
                replica = gw.add_replica(ReplicaSpec(url, None, endpoint, replay))
                rid = replica.replica_id
                await _until(lambda: rid in gw.intakes)
                assert replica.base_model == "emu"
                late, adapted = np.arange(100, 164), np.arange(200, 264)
                pub.publish(EngineEventBatch(time.time(), (_stored(late, 2000),)))
                pub.publish(
                    EngineEventBatch(time.time(), (_stored(adapted, 3000, None, "lora-a"),))
                )

                def held(tokens: np.ndarray, model: str) -> int:
                    hashes = hash_tokens(tokens, BT, gw.seed(model, ""))
                    return gw.index.match(hashes).device_blocks(ReplicaId(rid))

                await _until(lambda: held(adapted, "lora-a") == 4)
                assert held(early, "emu") == 4 and held(late, "emu") == 4
                assert held(adapted, "emu") == 0  # not the base model's KV
                assert held(early, "default") == 0
        finally:
            pub.close()
            server.close()

    _run(scenario)


def test_a_malformed_event_is_counted_and_the_intake_goes_on() -> None:
    """A stored block with a negative token id (which the block hashing refuses) ended the
    intake for good: its index froze while /ready still said connected."""

    async def scenario() -> None:
        server, url = await _engine_http(models_delay_s=0.0)
        endpoint, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        pub = KvEventPublisher(endpoint, replay)
        pub.start_replay_thread()
        gw = Gateway(GatewayConfig(tokenizer="smollm2", tenant_secret="s"))
        try:
            async with gw.lifespan():
                rid = gw.add_replica(ReplicaSpec(url, "emu", endpoint, replay)).replica_id
                await _until(lambda: gw.intakes[rid].is_connected)
                bad = np.arange(-16, 48)
                pub.publish(EngineEventBatch(time.time(), (_stored(bad, 1000),)))
                good = np.arange(300, 364)
                pub.publish(EngineEventBatch(time.time(), (_stored(good, 2000),)))
                hashes = hash_tokens(good, BT, gw.seed("emu", ""))
                await _until(lambda: gw.index.match(hashes).device_blocks(rid) == 4)
                assert not gw.intake_tasks[rid].done()
                assert gw.intakes[rid].subscriber.num_malformed == 1
        finally:
            pub.close()
            server.close()

    _run(scenario)


@pytest.mark.redis
def test_redis_is_rewritten_from_the_local_index_when_it_returns(redis_client: Any) -> None:
    """A recovery (or a new lease holder) rewrites the engine's entries in Redis from the
    gateway's own index, which the outage did not touch. Before, both indexes were rebuilt
    from the engine's replay buffer: a block older than the buffer (a hot system prompt)
    was forgotten in both, and every block stored under it later was unresolved."""
    prefix = f"kvtide-test-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        server, url = await _engine_http(models_delay_s=0.0)
        endpoint, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        pub = KvEventPublisher(endpoint, replay, buffer_steps=20)
        pub.start_replay_thread()
        config = GatewayConfig(
            tokenizer="smollm2",
            tenant_secret="s",
            state="redis://127.0.0.1:6379/0",
            state_prefix=prefix,
        )
        gw = Gateway(config)
        shared = gw.shared
        assert shared is not None
        try:
            async with gw.lifespan():
                rid = gw.add_replica(ReplicaSpec(url, "emu", endpoint, replay)).replica_id
                await _until(lambda: rid in shared.owned and gw.intakes[rid].is_connected)
                system = np.arange(0, 64)
                pub.publish(EngineEventBatch(time.time(), (_stored(system, 1000),)))
                hashes = hash_tokens(system, BT, gw.seed("emu", ""))

                async def in_redis(h: object = hashes) -> int:
                    return (await shared.store.match(h)).device_blocks(rid)  # type: ignore[arg-type]

                for _ in range(250):
                    if await in_redis() == 4:
                        break
                    await asyncio.sleep(0.02)
                for _ in range(40):  # the engine's replay buffer moves past the prompt
                    pub.publish(EngineEventBatch(time.time(), ()))
                redis_client.delete(
                    *redis_client.scan_iter(f"{prefix}:blk:*")
                )  # what an outage loses
                shared._failed(ConnectionError("Redis went away"))  # as a failed call marks it
                resyncs = shared.num_resyncs
                await _until(lambda: shared.num_resyncs > resyncs and not shared.degraded)
                assert await in_redis() == 4
                assert gw.index.match(hashes).device_blocks(rid) == 4  # the local index kept it
                turn = np.arange(64, 128)  # a new turn under the old prompt resolves
                pub.publish(EngineEventBatch(time.time(), (_stored(turn, 2000, parent=1003),)))
                whole = hash_tokens(np.concatenate([system, turn]), BT, gw.seed("emu", ""))
                await _until(lambda: gw.index.match(whole).device_blocks(rid) == 8)
                assert gw.intakes[rid].translator.counters.unresolved_stores == 0
                # a replica removed here is no longer this gateway's to write for
                gw.remove_replica(rid)
                assert rid not in shared.owned
        finally:
            pub.close()
            server.close()
            for key in redis_client.scan_iter(f"{prefix}:*"):
                redis_client.delete(key)

    _run(scenario)
