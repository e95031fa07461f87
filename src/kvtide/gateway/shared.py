"""``--state redis://``: gateway replicas share the index and their load through Redis.

Every gateway still subscribes to every engine's events and keeps its own index (the fallback,
always warm); one of them, the holder of a short Redis lease per engine, also writes that
engine's events into the shared index (``state.redis_store``, pipelined, hash-tagged keys), so
each engine has one intake. Routing asks Redis for the prefix match with a short timeout and
hands it to the policy in ``RouteRequest.prefix_match``. Each gateway publishes its requests in
flight per engine, and counts the others' in the engine's load; and the tokens it charged each
tenant, taking the others' out of its own buckets (``TenantTable.spent_elsewhere``), so the
replicas hold a tenant to one tokens-per-minute limit without a Redis call per request.

Text mode (no tokenizer, so no engine events to learn from) shares the gateway replicas' own
decisions instead: each decision's chunk hashes are written, batched in the background, into a
shadow index of their own under ``PREFIX:shadow`` with the shadow's time to live, and routing asks
it as it asks the event-fed one. Every gateway thus routes on what all of them placed.

The engine holding each stored Responses answer (``gateway.response_homes``) is shared too,
written in the background under ``PREFIX:resp:ID`` for a day, so that a follow-up naming it
reaches that engine through any gateway replica: a gateway that does not know an id asks Redis
once, with the short timeout.

When Redis does not answer the gateway is degraded: it routes on its local index, says so in
``/ready`` and ``kvtide_gateway_state_degraded``, and when Redis answers again every engine it
holds the lease of is resynced: its entries rewritten in Redis from this gateway's own index.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import redis.asyncio

from kvtide.core.events import AllBlocksCleared, BlockStored, KVEvent
from kvtide.core.hashing import BlockHashes
from kvtide.errors import StateStoreError
from kvtide.routing.index import PrefixMatch
from kvtide.state.redis_store import AsyncRedisIndexStore
from kvtide.types import BlockHash, ReplicaId, Tier

log = logging.getLogger("kvtide.gateway")

HOME_TTL_S = 86_400
"""How long Redis keeps the engine of a stored Responses answer."""
LEASE_S = 5.0
"""An intake lease lasts this long; its holder renews it every maintenance round (1 s)."""
_CHUNK_BLOCKS = 4096
"""Blocks written to Redis under one deadline (~0.1 s of pipelined writes here)."""


def _chunks(events: Iterable[KVEvent]) -> Iterator[list[KVEvent]]:
    """``events`` in order, cut so that no piece holds more than ``_CHUNK_BLOCKS`` blocks
    (a larger event goes alone)."""
    chunk: list[KVEvent] = []
    size = 0
    for e in events:
        n = 0 if isinstance(e, AllBlocksCleared) else len(e.block_hashes)
        if chunk and size + n > _CHUNK_BLOCKS:
            yield chunk
            chunk, size = [], 0
        chunk.append(e)
        size += n
    if chunk:
        yield chunk


class SharedState:
    def __init__(
        self,
        url: str,
        prefix: str,
        timeout_s: float = 0.25,
        on_resync: Callable[[ReplicaId], None] = lambda replica: None,
        shadow_ttl_s: float | None = None,
    ) -> None:
        self.client = redis.asyncio.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self.store = AsyncRedisIndexStore(self.client, prefix=prefix)
        # text mode: the shared index holds the gateways' decisions, not the engines' events
        self.shadow = shadow_ttl_s is not None
        if shadow_ttl_s is not None:
            self.store = AsyncRedisIndexStore(
                self.client, prefix=f"{prefix}:shadow", ttl_s=shadow_ttl_s
            )
        self._pending: dict[ReplicaId, dict[BlockHash, None]] = {}
        self._wake: asyncio.Event | None = None
        self._homes: dict[str, str] = {}  # response id -> "replica tenant", not yet written
        self._homes_wake: asyncio.Event | None = None
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.gateway_id = uuid.uuid4().hex[:12]
        self.on_resync = on_resync
        self.degraded = False
        self.owned: set[ReplicaId] = set()
        self._locks: dict[ReplicaId, asyncio.Lock] = {}  # one writer at a time per engine
        self._resyncing: set[ReplicaId] = set()
        self.num_resyncs = 0
        self.others_in_flight: dict[ReplicaId, int] = {}
        self.num_errors = 0
        self._unsent: dict[str, int] = {}  # tenants' tokens charged here, not yet in Redis
        self._tenant_totals: dict[str, int] = {}  # each tenant's shared total, last round
        self.spent_elsewhere: dict[str, int] = {}
        """Tokens the other gateways charged each tenant since the last round."""

    def _failed(self, exc: BaseException) -> None:
        self.num_errors += 1
        if not self.degraded:
            log.warning("state store unreachable, routing on the local index: %s", exc)
        self.degraded = True

    async def match(self, hashes: Sequence[BlockHash]) -> PrefixMatch | None:
        """The shared index's answer, or None (degraded: the policy reads the local one)."""
        if self.degraded or not hashes:
            return None
        try:
            return await asyncio.wait_for(self.store.match(hashes), self.timeout_s)
        except (StateStoreError, TimeoutError, OSError) as exc:
            self._failed(exc)
            return None

    async def write(self, replica: ReplicaId, ops: Iterable[tuple[str, list[KVEvent]]]) -> None:
        """An intake's committed operations, when this gateway holds that engine's lease."""
        if replica not in self.owned or self.degraded:
            return
        events: list[KVEvent] = []
        for kind, batch in ops:
            events.extend([AllBlocksCleared()] if kind == "clear" else batch)
        async with self._lock(replica):
            await self._apply(replica, events)

    async def resync(
        self, replica: ReplicaId, held: Callable[[], Mapping[Tier, Sequence[BlockHash]]]
    ) -> None:
        """Rewrites the engine's entries in Redis from this gateway's own index (``held``: its
        blocks per tier, read when the write starts), after Redis was away or when this
        gateway takes the engine's lease. The local index is left as it is: rebuilding it
        from the engine's replay buffer, as before, forgot every block older than the buffer
        (a hot system prompt) in both indexes, and every block stored under one later."""
        if replica in self._resyncing:
            return
        self._resyncing.add(replica)
        try:
            async with self._lock(replica):  # the intake's writes wait: none before the clear
                if replica not in self.owned or self.degraded:
                    return
                events: list[KVEvent] = [AllBlocksCleared()]
                for tier, blocks in held().items():
                    events.extend(
                        BlockStored(tuple(blocks[i : i + _CHUNK_BLOCKS]), None, None, 0, tier)
                        for i in range(0, len(blocks), _CHUNK_BLOCKS)
                    )
                await self._apply(replica, events)
                self.num_resyncs += 1
        finally:
            self._resyncing.discard(replica)

    def _lock(self, replica: ReplicaId) -> asyncio.Lock:
        lock = self._locks.get(replica)
        if lock is None:
            lock = self._locks[replica] = asyncio.Lock()
        return lock

    async def _apply(self, replica: ReplicaId, events: list[KVEvent]) -> None:
        """``events`` in pieces of at most ``_CHUNK_BLOCKS`` blocks, each under its own
        deadline: a whole replay buffer under one (1 s) timed out past ~35k blocks, marked the
        gateway degraded, and the resync on recovery wrote it again, forever."""
        try:
            for chunk in _chunks(events):
                await asyncio.wait_for(self.store.apply_all(replica, chunk), 4 * self.timeout_s)
        except (StateStoreError, TimeoutError, OSError) as exc:
            self._failed(exc)

    def forget(self, replica: ReplicaId) -> None:
        """A replica removed from this gateway: its lease is no longer this gateway's to
        write under (kept, a re-added replica's intake wrote a clear under another holder's
        lease, and the holder's writes went to an epoch no query reads)."""
        self.owned.discard(replica)
        self.others_in_flight.pop(replica, None)

    def record(self, replica: ReplicaId, hashes: BlockHashes) -> None:
        """Text mode: a decision to share (written by ``write_decisions``, never on the request's
        path). Batched per replica; a hot prefix routed many times in a batch is written once."""
        pending = self._pending.setdefault(replica, {})
        pending.update(dict.fromkeys(hashes.tolist()))
        if self._wake is not None:
            self._wake.set()

    def record_home(self, response_id: str, replica: ReplicaId, tenant: str) -> None:
        """A stored answer's engine and tenant to share (written by ``write_homes``)."""
        self._homes[response_id] = f"{replica} {tenant}"
        if self._homes_wake is not None:
            self._homes_wake.set()

    async def write_homes(self) -> None:
        """Runs for the gateway's lifetime: writes the recorded answers' engines, batched."""
        self._homes_wake = asyncio.Event()
        while True:
            await self._homes_wake.wait()
            self._homes_wake.clear()
            batch, self._homes = self._homes, {}
            if self.degraded:
                continue  # this gateway still knows them; the others route them as new
            pipe = self.client.pipeline(transaction=False)
            for response_id, home in batch.items():
                pipe.set(f"{self.prefix}:resp:{response_id}", home, ex=HOME_TTL_S)
            try:
                await asyncio.wait_for(pipe.execute(), 4 * self.timeout_s)
            except (redis.RedisError, TimeoutError, OSError) as exc:
                self._failed(exc)

    async def home(self, response_id: str) -> tuple[ReplicaId, str] | None:
        """The engine and tenant of a stored answer another gateway passed on, or None
        (unknown, or degraded)."""
        if self.degraded:
            return None
        try:
            got = await asyncio.wait_for(
                self.client.get(f"{self.prefix}:resp:{response_id}"), self.timeout_s
            )
        except (redis.RedisError, TimeoutError, OSError) as exc:
            self._failed(exc)
            return None
        if got is None:
            return None
        replica, _, tenant = (got.decode() if isinstance(got, bytes) else got).partition(" ")
        return ReplicaId(replica), tenant

    async def write_decisions(self) -> None:
        """Runs for the gateway's lifetime (text mode): writes the recorded decisions."""
        self._wake = asyncio.Event()
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, {}
            if self.degraded:
                continue  # the local shadow has them; Redis learns the next ones
            events = {
                replica: [BlockStored(tuple(hashes), None, None, 0)]
                for replica, hashes in batch.items()
            }
            try:
                for replica, stored in events.items():
                    await asyncio.wait_for(
                        self.store.apply_all(replica, stored), 4 * self.timeout_s
                    )
            except (StateStoreError, TimeoutError, OSError) as exc:
                self._failed(exc)

    async def maintain(self, in_flight: dict[ReplicaId, int], spent: dict[str, int]) -> None:
        """One round: health, leases, load counters, tenants' tokens (``spent`` here since
        the last round: ``spent_elsewhere`` gets the others'); a recovery resyncs the leased
        engines."""
        for tenant, tokens in spent.items():
            self._unsent[tenant] = self._unsent.get(tenant, 0) + tokens
        self.spent_elsewhere = {}
        try:
            await asyncio.wait_for(self._round(in_flight), 4 * self.timeout_s)
        except (redis.RedisError, StateStoreError, TimeoutError, OSError) as exc:
            self._failed(exc)
            return
        if self.degraded:
            log.warning("state store back: resyncing %d engines", len(self.owned))
            self.degraded = False
            for replica in self.owned:
                self.on_resync(replica)

    async def _round(self, in_flight: dict[ReplicaId, int]) -> None:
        p, me = self.prefix, self.gateway_id
        lease_ms = int(LEASE_S * 1000)
        pipe = self.client.pipeline(transaction=False)
        for replica, n in in_flight.items():
            pipe.set(f"{p}:intake:{{{replica}}}", me, nx=True, px=lease_ms)
            pipe.get(f"{p}:intake:{{{replica}}}")
            pipe.hset(f"{p}:load:{{{replica}}}", me, n)
            pipe.pexpire(f"{p}:load:{{{replica}}}", lease_ms)
            pipe.hgetall(f"{p}:load:{{{replica}}}")
        # tenants' tokens: one counter per tenant that every gateway adds its own to; what
        # the others added since the last round is what this one has not seen (kept 2 min
        # past the last write: a limit's bucket refills in 1)
        unsent = dict(self._unsent)
        for tenant, tokens in unsent.items():
            pipe.incrby(f"{p}:tpm:{{{tenant}}}", tokens)
            pipe.pexpire(f"{p}:tpm:{{{tenant}}}", 120_000)
        res = await pipe.execute()
        base = 5 * len(in_flight)
        for i, (tenant, tokens) in enumerate(unsent.items()):
            total = int(res[base + 2 * i])
            last = self._tenant_totals.get(tenant)
            if last is not None and total - tokens > last:
                self.spent_elsewhere[tenant] = total - tokens - last
            self._tenant_totals[tenant] = total
            self._unsent[tenant] -= tokens
        renew = self.client.pipeline(transaction=False)
        newly: list[ReplicaId] = []
        for i, replica in enumerate(in_flight):
            _, owner, _, _, loads = res[5 * i : 5 * i + 5]
            owner = owner.decode() if isinstance(owner, bytes) else owner
            if owner == me:
                renew.pexpire(f"{p}:intake:{{{replica}}}", lease_ms)
                if replica not in self.owned:
                    newly.append(replica)
                self.owned.add(replica)
            else:
                self.owned.discard(replica)
            self.others_in_flight[replica] = sum(
                int(v)
                for k, v in loads.items()
                if (k.decode() if isinstance(k, bytes) else k) != me
            )
        await renew.execute()
        for replica in newly:  # a new holder writes the engine's state from the start
            self.on_resync(replica)

    async def close(self) -> None:
        await self.client.aclose()
