"""RedisIndexStore: the block -> replicas index in Redis, shared by several gateway replicas.

The only module that imports redis. Key layout (``P`` = ``prefix``, default "kvtide"):

    P:blk:{<block hash, 16 hex digits>}   HASH  "<replica>|<tier>" -> the replica's epoch
        One key per block, hash-tagged on the block hash so a Redis Cluster shards the index by
        block. TTL ``ttl_s``, refreshed by every store of the block: blocks of a replica that
        died without a word vanish within ``ttl_s``.
    P:epoch                               HASH  "<replica>" -> epoch (int)
        Bumping a replica's epoch clears it in O(1) (AllBlocksCleared, resync): fields written
        under an older epoch are ignored by queries and expire with their keys.

``RedisIndexStore`` is synchronous; ``AsyncRedisIndexStore`` is the same for asyncio callers.
Writes are pipelined (one round trip per event batch). A query costs two round trips: first
``sample_blocks`` evenly spaced blocks of the prompt, then every block inside the sampled
intervals where some replica's held prefix ends (held prefixes are monotone along the prompt,
see ``kvtide.routing.index``). One writer per engine replica is assumed (ingestion partitioned
by replica), so a writer's cached epoch of its replica stays current.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Iterable, Iterator, Sequence
from typing import Any

import redis
import redis.asyncio

from kvtide.core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvtide.core.hashing import as_block_hashes
from kvtide.errors import StateStoreError
from kvtide.routing.index import PrefixMatch
from kvtide.routing.table import NUM_TIERS
from kvtide.types import BlockHash, ReplicaId


class _Layout:
    """Key names and write commands of the layout described in the module docstring."""

    __slots__ = ("epoch_key", "prefix", "ttl_s")

    def __init__(self, prefix: str, ttl_s: float) -> None:
        self.prefix = prefix
        self.ttl_s = math.ceil(ttl_s)
        self.epoch_key = f"{prefix}:epoch"

    def block_key(self, h: int) -> str:
        return f"{self.prefix}:blk:{{{h & 0xFFFFFFFFFFFFFFFF:016x}}}"

    def commands(
        self, replica: ReplicaId, epoch: int, events: list[BlockStored | BlockRemoved]
    ) -> list[tuple[str, str, tuple[object, ...]]]:
        out: list[tuple[str, str, tuple[object, ...]]] = []
        for e in events:
            field = f"{replica}|{int(e.tier)}"
            if isinstance(e, BlockStored):
                for h in e.block_hashes:
                    key = self.block_key(h)
                    out.append(("hset", key, (field, epoch)))
                    out.append(("expire", key, (self.ttl_s,)))
            else:
                out.extend(("hdel", self.block_key(h), (field,)) for h in e.block_hashes)
        return out


class RedisIndexStore:
    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = "kvtide",
        ttl_s: float = 3600.0,
        sample_blocks: int = 32,
    ) -> None:
        self.client = client
        self.layout = _Layout(prefix, ttl_s)
        self.prefix = prefix
        self.sample_blocks = max(sample_blocks, 2)
        self._epoch_key = self.layout.epoch_key
        self._epochs: dict[ReplicaId, int] = {}

    def block_key(self, h: int) -> str:
        return self.layout.block_key(h)

    # --- writes ----------------------------------------------------------------------------

    def _epoch(self, replica: ReplicaId) -> int:
        e = self._epochs.get(replica)
        if e is None:
            raw = self._call(self.client.hget, self._epoch_key, replica)
            e = self._epochs[replica] = int(raw) if raw is not None else 0
        return e

    def apply(self, replica: ReplicaId, event: KVEvent) -> None:
        self.apply_all(replica, (event,))

    def apply_all(self, replica: ReplicaId, events: Iterable[KVEvent]) -> None:
        for segment in _segments(events):
            if segment is None:
                self.clear_replica(replica)
                continue
            pipe = self.client.pipeline(transaction=False)
            for op, key, args in self.layout.commands(replica, self._epoch(replica), segment):
                getattr(pipe, op)(key, *args)
            self._call(pipe.execute)

    def clear_replica(self, replica: ReplicaId) -> None:
        self._epochs[replica] = int(self._call(self.client.hincrby, self._epoch_key, replica, 1))

    # --- queries ---------------------------------------------------------------------------

    def match(self, hashes: Sequence[BlockHash], *, exact: bool = False) -> PrefixMatch:
        q = _Query(as_block_hashes(hashes).tolist(), self.sample_blocks, exact)
        positions = q.first_positions()
        while positions:
            positions = q.take(*self._fetch(q.seq, positions))
        return q.result()

    def _fetch(
        self, seq: list[BlockHash], positions: list[int]
    ) -> tuple[dict[ReplicaId, int], list[dict[ReplicaId, int]]]:
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self._epoch_key)
        for p in positions:
            pipe.hgetall(self.block_key(seq[p]))
        return _parse(self._call(pipe.execute))

    @staticmethod
    def _call(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except redis.RedisError as exc:
            raise StateStoreError(f"redis: {exc}") from exc

    def delete_all(self) -> int:
        """Deletes every key under the prefix (tests, teardown); returns how many."""
        n = 0
        for key in self.client.scan_iter(match=f"{self.prefix}:*", count=1000):
            n += int(self._call(self.client.delete, key))
        self._epochs.clear()
        return n


class AsyncRedisIndexStore:
    """The same index and key layout for asyncio callers (the gateway): ``await match`` and
    hand the result to ``RouteRequest.prefix_match``, so ``choose`` itself stays I/O-free."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        prefix: str = "kvtide",
        ttl_s: float = 3600.0,
        sample_blocks: int = 32,
    ) -> None:
        self.client = client
        self.layout = _Layout(prefix, ttl_s)
        self.prefix = prefix
        self.sample_blocks = max(sample_blocks, 2)
        self._epoch_key = f"{prefix}:epoch"
        self._epochs: dict[ReplicaId, int] = {}

    async def _epoch(self, replica: ReplicaId) -> int:
        e = self._epochs.get(replica)
        if e is None:
            raw = await _acall(self.client.hget(self._epoch_key, replica))
            e = self._epochs[replica] = int(raw) if raw is not None else 0
        return e

    async def apply_all(self, replica: ReplicaId, events: Iterable[KVEvent]) -> None:
        for segment in _segments(events):
            if segment is None:
                await self.clear_replica(replica)
                continue
            epoch = await self._epoch(replica)
            pipe = self.client.pipeline(transaction=False)
            for op, key, args in self.layout.commands(replica, epoch, segment):
                getattr(pipe, op)(key, *args)
            await _acall(pipe.execute())

    async def clear_replica(self, replica: ReplicaId) -> None:
        self._epochs[replica] = int(await _acall(self.client.hincrby(self._epoch_key, replica, 1)))

    async def match(self, hashes: Sequence[BlockHash], *, exact: bool = False) -> PrefixMatch:
        q = _Query(as_block_hashes(hashes).tolist(), self.sample_blocks, exact)
        positions = q.first_positions()
        while positions:
            pipe = self.client.pipeline(transaction=False)
            pipe.hgetall(self._epoch_key)
            for p in positions:
                pipe.hgetall(self.layout.block_key(q.seq[p]))
            positions = q.take(*_parse(await _acall(pipe.execute())))
        return q.result()


async def _acall(awaitable: Awaitable[Any]) -> Any:
    try:
        return await awaitable
    except redis.RedisError as exc:
        raise StateStoreError(f"redis: {exc}") from exc


class _Query:
    """The prefix query as a small state machine, shared by the sync and async stores: first
    the sampled positions, then every position inside a sampled interval where some replica's
    held prefix ends (held prefixes are monotone along a prompt)."""

    def __init__(self, seq: list[BlockHash], sample_blocks: int, exact: bool) -> None:
        self.seq = seq
        n = self.n = len(seq)
        step = 1 if exact else max(1, math.ceil(n / sample_blocks))
        self.samples = sorted(set(range(0, n, step)) | {n - 1}) if n else []
        self.epochs: dict[ReplicaId, int] = {}
        self.known: dict[int, dict[ReplicaId, int]] = {}
        self.extra: dict[int, dict[ReplicaId, int]] = {}
        self._wanted: list[int] | None = None

    def first_positions(self) -> list[int]:
        return list(self.samples)

    def take(self, epochs: dict[ReplicaId, int], rows: list[dict[ReplicaId, int]]) -> list[int]:
        """Takes one round's answers; returns the positions to fetch next (none: done)."""
        if self._wanted is None:
            self.epochs = epochs
            self.known = dict(zip(self.samples, rows, strict=True))
            samples = self.samples
            wanted: set[int] = set()
            for t in range(NUM_TIERS):
                for i in _ends(samples, self.known, t).values():
                    if i + 1 < len(samples):
                        wanted.update(range(samples[i] + 1, samples[i + 1]))
            self._wanted = sorted(wanted - self.known.keys())
            return self._wanted
        self.extra = dict(zip(self._wanted, rows, strict=True))
        return []

    def result(self) -> PrefixMatch:
        if not self.n:
            return PrefixMatch(0)
        rows = {**self.known, **self.extra}
        samples, n = self.samples, self.n
        out: list[dict[ReplicaId, int]] = []
        for t in range(NUM_TIERS):
            lengths: dict[ReplicaId, int] = {}
            for r, i in _ends(samples, self.known, t).items():
                length = samples[i] + 1
                while length < n and length in rows and rows[length].get(r, NUM_TIERS) <= t:
                    length += 1
                lengths[r] = length
            out.append(lengths)
        return PrefixMatch(n, tuple(out))


def _parse(res: list[Any]) -> tuple[dict[ReplicaId, int], list[dict[ReplicaId, int]]]:
    """Epochs, and per fetched block the replicas holding it (current epoch) -> best tier."""
    epochs = {ReplicaId(_s(k)): int(v) for k, v in res[0].items()}
    rows = []
    for raw in res[1:]:
        row: dict[ReplicaId, int] = {}
        for f, v in raw.items():
            rid, _, tier = _s(f).rpartition("|")
            r = ReplicaId(rid)
            if int(v) != epochs.get(r, 0):
                continue  # written before the replica was last cleared
            t = int(tier)
            if t < row.get(r, NUM_TIERS):
                row[r] = t
        rows.append(row)
    return epochs, rows


def _segments(events: Iterable[KVEvent]) -> Iterator[list[BlockStored | BlockRemoved] | None]:
    """Runs of stores and removals, split by clears (``None``), in order."""
    run: list[BlockStored | BlockRemoved] = []
    for e in events:
        if isinstance(e, AllBlocksCleared):
            if run:
                yield run
                run = []
            yield None
        else:
            run.append(e)
    if run:
        yield run


def _s(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


def _ends(
    samples: list[int], known: dict[int, dict[ReplicaId, int]], tier: int
) -> dict[ReplicaId, int]:
    """Per replica holding sample 0 in a tier <= ``tier``: the index of the last sample up to
    which it holds every sample."""
    first = known[samples[0]]
    alive = {r for r, t in first.items() if t <= tier}
    ends: dict[ReplicaId, int] = {}
    for i, p in enumerate(samples):
        row = known[p]
        still = {r for r in alive if row.get(r, NUM_TIERS) <= tier}
        for r in alive - still:
            ends[r] = i - 1
        alive = still
        if not alive:
            break
    for r in alive:
        ends[r] = len(samples) - 1
    return ends
