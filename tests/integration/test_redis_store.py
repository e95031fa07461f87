"""RedisIndexStore on the real Redis at 127.0.0.1:6379, checked against the in-process index."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import pytest

from kvtide.clock import ManualClock
from kvtide.core.events import AllBlocksCleared, BlockStored
from kvtide.core.hashing import hash_block_ids
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.routing.ingest import snapshot_events
from kvtide.routing.policies import RoutingContext
from kvtide.routing.registry import make_policy
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.state.memory import MemoryIndexStore
from kvtide.types import ReplicaId, Tier

redis = pytest.importorskip("redis")

from kvtide.state.redis_store import RedisIndexStore  # noqa: E402

pytestmark = pytest.mark.redis


@pytest.fixture
def store() -> Iterator[RedisIndexStore]:
    client = redis.Redis(host="127.0.0.1", port=6379, socket_timeout=2.0)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    s = RedisIndexStore(client, prefix=f"kvtide-test-{uuid.uuid4().hex}", ttl_s=60)
    yield s
    s.delete_all()
    client.close()


def _prompts(rng: random.Random, n: int) -> list[list[int]]:
    return [[rng.randrange(3) for _ in range(rng.randrange(1, 120))] for _ in range(n)]


def test_redis_answers_like_the_in_process_index(store: RedisIndexStore) -> None:
    from kvtide.core.cache import CacheConfig, KVCache

    rng = random.Random(11)
    local = GlobalPrefixIndex()
    caches = {
        ReplicaId(f"r{i}"): KVCache(
            CacheConfig(capacity_blocks=150, record_events=True, ghost_blocks=0), ManualClock()
        )
        for i in range(3)
    }
    prompts = [hash_block_ids(ids, 5) for ids in _prompts(rng, 25)]
    for _ in range(60):
        r, cache = rng.choice(list(caches.items()))
        cache.access(rng.choice(prompts), 0)
        events = cache.take_events()
        local.apply_all(r, events)
        store.apply_all(r, events)
    for p in prompts:
        assert store.match(p) == local.match(p)
        assert store.match(p, exact=True) == local.match(p, exact=True)
    # a snapshot applied after a clear gives the same answers again
    r0 = ReplicaId("r0")
    store.apply_all(r0, [AllBlocksCleared(), *snapshot_events(caches[r0])])
    for p in prompts:
        assert store.match(p) == local.match(p)


def test_tiers_clear_and_key_layout(store: RedisIndexStore) -> None:
    p = hash_block_ids(list(range(40)), 5)
    hs = p.tolist()
    a, b = ReplicaId("a"), ReplicaId("b")
    store.apply_all(
        a,
        [
            BlockStored(tuple(hs[:10]), None, None, 16, Tier.DEVICE),
            BlockStored(tuple(hs[10:25]), hs[9], None, 16, Tier.HOST),
        ],
    )
    store.apply(b, BlockStored(tuple(hs[:33]), None, None, 16, Tier.DEVICE))
    m = store.match(p)
    assert m.tier_blocks(a) == (10, 15, 0) and m.tier_blocks(b) == (33, 0, 0)
    key = store.block_key(hs[0])
    assert key.endswith(f"{{{hs[0]:016x}}}") and store.client.ttl(key) > 0
    store.clear_replica(a)
    assert dict(store.match(p).device) == {b: 33}
    store.apply(a, BlockStored(tuple(hs[:2]), None, None, 16, Tier.DEVICE))
    assert store.match(p).device_blocks(a) == 2


def test_precise_policy_routes_through_the_redis_store(store: RedisIndexStore) -> None:
    p = hash_block_ids(list(range(8)), 5)
    store.apply(ReplicaId("r1"), BlockStored(tuple(p.tolist()), None, None, 16))
    policy = make_policy("precise", RoutingContext(clock=ManualClock(), index=store))
    reps = [ReplicaState(f"r{i}") for i in range(3)]
    assert policy.choose(RouteRequest(p, 128, 16), reps).replica == "r1"


def test_memory_store_is_an_index_store() -> None:
    s = MemoryIndexStore()
    p = hash_block_ids([1, 2], 5)
    s.apply(ReplicaId("x"), BlockStored(tuple(p.tolist()), None, None, 16))
    assert s.match(p).device == {"x": 2}
    s.clear_replica(ReplicaId("x"))
    assert s.match(p).device == {}


def test_async_store_shares_the_layout(store: RedisIndexStore) -> None:
    import asyncio

    from kvtide.state.redis_store import AsyncRedisIndexStore

    p = hash_block_ids(list(range(50)), 5)
    hs = tuple(p.tolist())

    async def scenario() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=6379, socket_timeout=2.0)
        try:
            a = AsyncRedisIndexStore(client, prefix=store.prefix, ttl_s=60)
            await a.apply_all(ReplicaId("x"), [BlockStored(hs[:30], None, None, 16)])
            assert (await a.match(p)).device == {"x": 30}
            assert store.match(p).device == {"x": 30}  # the sync store reads the same keys
            await a.apply_all(ReplicaId("x"), [AllBlocksCleared()])
            assert (await a.match(p)).device == {}
        finally:
            await client.aclose()

    asyncio.run(scenario())
