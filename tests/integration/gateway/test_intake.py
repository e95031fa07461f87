"""The gateway's KV-event intake over real ZMQ: events translated by token ids land in the
index in the gateway's namespace (model + cache_salt), a lost batch is replayed, and a publisher
restart (numbering from 0 again) is a new epoch that clears the replica's old blocks."""

from __future__ import annotations

import asyncio
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import zmq

from kvtide.clock import EpochClock
from kvtide.core.hashing import hash_tokens
from kvtide.gateway.intake import EpochIngest, EpochSubscriber, EventIntake
from kvtide.routing.identity import namespace_seed
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.state.kv_events import KvEventPublisher
from kvtide.state.kv_wire import EngineBlockStored, EngineEventBatch
from kvtide.types import ReplicaId

R = ReplicaId("e0")
BT = 16


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stored(tokens: np.ndarray, salt: str | None, parent: int | None = None) -> EngineBlockStored:
    n = len(tokens) // BT
    return EngineBlockStored(
        block_hashes=tuple(range(1000 + int(tokens[0]), 1000 + int(tokens[0]) + n)),
        parent_block_hash=parent,
        token_ids=tuple(int(t) for t in tokens),
        block_size=BT,
        cache_salt=salt,
    )


def _seed(salt: str | None, lora: str | None = None) -> int:
    return namespace_seed(lora or "emu", (salt or "").encode())


async def _until(cond, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.02)


async def _bind_again(endpoint: str, replay: str) -> KvEventPublisher:
    """A publisher on the sockets just closed: ZMQ releases a port asynchronously."""
    for _ in range(100):
        try:
            return KvEventPublisher(endpoint, replay)
        except zmq.ZMQError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"{endpoint} stayed in use")


def test_events_land_in_the_namespace_and_a_restart_is_a_new_epoch() -> None:
    pub_port, replay_port = _port(), _port()
    endpoint, replay = f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}"
    tokens = np.arange(64, dtype=np.int64)
    salted = hash_tokens(tokens, BT, _seed("tenant-salt"))
    plain = hash_tokens(tokens, BT, _seed(None))

    async def scenario() -> None:
        index = GlobalPrefixIndex()
        executor = ThreadPoolExecutor(2)
        pub = KvEventPublisher(endpoint, replay)
        pub.start_replay_thread()
        intake = EventIntake(R, endpoint, replay, BT, _seed, index, executor, poll_s=0.02)
        task = asyncio.create_task(intake.run())
        try:
            # slow joiner: probe until the intake hears the publisher
            while not intake.stats.batches:
                pub.publish(EngineEventBatch(0.0, ()))
                await asyncio.sleep(0.05)
            pub.publish(EngineEventBatch(1.0, (_stored(tokens, "tenant-salt"),)))
            await _until(lambda: index.match(salted).device_blocks(R) == 4)
            assert index.match(plain).device_blocks(R) == 0  # another namespace
            # a lost batch the publisher still buffers: replayed, applied in order
            pub.publish(EngineEventBatch(2.0, (_stored(tokens + 500, None),)), drop=True)
            pub.publish(EngineEventBatch(3.0, (_stored(tokens, None),)))
            other = hash_tokens(tokens + 500, BT, _seed(None))
            await _until(lambda: index.match(other).device_blocks(R) == 4)
            assert index.match(plain).device_blocks(R) == 4
            # the engine restarts: a new publisher on the same sockets, numbering from 0
            pub.close()
            pub = await _bind_again(endpoint, replay)
            pub.start_replay_thread()
            fresh = tokens + 9000
            epochs = intake.ingest.num_epochs
            while intake.ingest.num_epochs == epochs:
                pub.publish(EngineEventBatch(4.0, (_stored(fresh, None),)))
                await asyncio.sleep(0.05)
            await _until(
                lambda: index.match(hash_tokens(fresh, BT, _seed(None))).device_blocks(R) == 4
            )
            # the previous life's blocks are gone
            assert index.match(salted).device_blocks(R) == 0
            assert index.match(plain).device_blocks(R) == 0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            executor.shutdown(wait=True)
            intake.close()
            pub.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_quiet_engines_poll_is_woken_for_a_restart_and_for_the_stop() -> None:
    """Polls wait up to a second for a quiet engine's next batch; a restart (replay from the
    engine's buffer) and the intake's stop do not wait for that second."""
    pub_port, replay_port = _port(), _port()
    endpoint, replay = f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}"

    async def scenario() -> tuple[float, float]:
        pub = KvEventPublisher(endpoint, replay)
        pub.start_replay_thread()
        intake = EventIntake(R, endpoint, replay, BT, _seed, GlobalPrefixIndex())
        assert intake.poll_s >= 1.0
        task = asyncio.create_task(intake.run())
        loop = asyncio.get_running_loop()
        try:
            await _until(lambda: intake.is_connected)  # the first poll (a bootstrap) returned
            await asyncio.sleep(0.1)  # the next poll is waiting on a quiet engine
            replays = intake.subscriber.num_replays
            t0 = loop.time()
            intake.restart()
            await _until(lambda: intake.subscriber.num_replays > replays)
            restart_s = loop.time() - t0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            t0 = loop.time()
            intake.close()  # waits for the worker's last poll
            close_s = loop.time() - t0
            pub.close()
        return restart_s, close_s

    restart_s, close_s = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert restart_s < 0.5
    assert close_s < 0.5


def test_live_copies_of_replayed_batches_are_duplicates_not_a_restart() -> None:
    """A replay returns every batch the engine buffers, those published while it ran too; the
    SUB socket then delivers those again. They are duplicates: taken for a restart (numbers
    below the next expected), they cleared the replica after a lost batch under load."""
    pub_port, replay_port = _port(), _port()
    endpoint, replay = f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}"
    pub = KvEventPublisher(endpoint, replay)
    pub.start_replay_thread()
    applied: list[int] = []
    cleared: list[ReplicaId] = []
    ingest = EpochIngest(
        lambda _r, b: applied.extend(e.block_hashes[0] for e in b.events),  # type: ignore[attr-defined]
        cleared.append,
        EpochClock(),
    )
    sub = EpochSubscriber(R, endpoint, ingest, replay_endpoint=replay)
    try:
        # slow joiner: probe until the subscriber hears the publisher
        while not sub.poll(0.05):
            pub.publish(EngineEventBatch(0.0, ()))
        blocks = [np.arange(16 * i, 16 * i + 16) for i in range(6)]
        first = pub.next_seq
        for i, tokens in enumerate(blocks):  # the second is lost; all six queue at the SUB
            pub.publish(EngineEventBatch(1.0, (_stored(tokens, None),)), drop=i == 1)
        time.sleep(0.3)
        # the first live batch applies, the third opens the gap, whose replay returns the
        # second to the sixth; the SUB socket's fourth to sixth follow
        assert sub.poll(0.0) == 5
        assert sub.num_replays == 1
        assert ingest.num_epochs == 0 and not cleared
        assert applied == [1000 + 16 * i for i in range(6)]
        assert ingest.next_seq(R) == first + 6
        # past the replay, a number below the next expected is again a restart
        pub.close()
        pub = asyncio.run(_bind_again(endpoint, replay))
        while not ingest.num_epochs:
            pub.publish(EngineEventBatch(2.0, ()))
            sub.poll(0.05)
        assert cleared == [R]
    finally:
        sub.close()
        pub.close()


def test_a_bootstrap_the_engine_does_not_answer_is_tried_again_and_costs_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An engine whose replay socket does not answer yet (still starting, busy): the intake
    follows the live stream meanwhile, keeps what it gave through each unanswered retry,
    and once the replay answers has what the engine published before the intake joined."""
    monkeypatch.setattr(EventIntake, "RETRY_FIRST_S", 0.2)
    pub_port, replay_port = _port(), _port()
    endpoint, replay = f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}"
    before, live = np.arange(64, dtype=np.int64), np.arange(64, dtype=np.int64) + 700
    hashed_before = hash_tokens(before, BT, _seed(None))
    hashed_live = hash_tokens(live, BT, _seed(None))

    async def scenario() -> None:
        index = GlobalPrefixIndex()
        pub = KvEventPublisher(endpoint, replay)  # its replay thread not started: no answer
        pub.publish(EngineEventBatch(1.0, (_stored(before, None),)))  # nobody listening
        counted: list[int] = []
        intake = EventIntake(
            R, endpoint, replay, BT, _seed, index, poll_s=0.02, on_bootstrap_failures=counted.append
        )
        intake.subscriber.replay_timeout_s = 0.2
        task = asyncio.create_task(intake.run())
        try:
            await _until(lambda: intake.stats.bootstrap_failures >= 1)
            while not intake.stats.batches:  # slow joiner: probe until the intake hears
                pub.publish(EngineEventBatch(0.0, ()))
                await asyncio.sleep(0.05)
            pub.publish(EngineEventBatch(2.0, (_stored(live, None),)))
            await _until(lambda: index.match(hashed_live).device_blocks(R) == 4)
            failures = intake.stats.bootstrap_failures
            await _until(lambda: intake.stats.bootstrap_failures > failures)
            # an unanswered retry kept the live stream's blocks
            assert index.match(hashed_live).device_blocks(R) == 4
            assert index.match(hashed_before).device_blocks(R) == 0
            pub.start_replay_thread()
            await _until(lambda: index.match(hashed_before).device_blocks(R) == 4)
            assert index.match(hashed_live).device_blocks(R) == 4
            # answered: no more retries; the gateway's counter was told of each failure
            failures = intake.stats.bootstrap_failures
            assert sum(counted) == failures
            replays = intake.subscriber.num_replays
            await asyncio.sleep(1.0)
            assert intake.stats.bootstrap_failures == failures
            assert intake.subscriber.num_replays == replays
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            intake.close()
            pub.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
