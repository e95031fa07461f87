"""RedisIndexStore: the block -> replicas index in Redis, shared by several gateway replicas.

The only module that imports redis. Key layout (``P`` = ``prefix``, default "kvtide"):

    P:blk:{<block hash, 16 hex digits>}   HASH  "<replica>|<tier>" -> the replica's epoch
        One key per block, hash-tagged on the block hash so a Redis Cluster shards the index by
        block. TTL ``ttl_s``, refreshed by every store of the block: blocks of a replica that
        died without a word vanish within ``ttl_s``.
    P:epoch                               HASH  "<replica>" -> epoch (int)
        Bumping a replica's epoch clears it in O(1) (AllBlocksCleared, resync): fields written
        under an older epoch are ignored by queries and expire with their keys.

Writes are pipelined (one round trip per event batch). A query costs two round trips: first
``sample_blocks`` evenly spaced blocks of the prompt, then every block inside the sampled
intervals where some replica's held prefix ends (held prefixes are monotone along the prompt,
see ``kvtide.routing.index``). One writer per engine replica is assumed (ingestion partitioned
by replica), so a writer's cached epoch of its replica stays current.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis

from kvtide.core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvtide.core.hashing import as_block_hashes
from kvtide.errors import StateStoreError
from kvtide.routing.index import PrefixMatch
from kvtide.routing.table import NUM_TIERS
from kvtide.types import BlockHash, ReplicaId


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
        self.prefix = prefix
        self.ttl_s = math.ceil(ttl_s)
        self.sample_blocks = max(sample_blocks, 2)
        self._epoch_key = f"{prefix}:epoch"
        self._epochs: dict[ReplicaId, int] = {}

    def block_key(self, h: int) -> str:
        return f"{self.prefix}:blk:{{{h & 0xFFFFFFFFFFFFFFFF:016x}}}"

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
        epoch = self._epoch(replica)
        pipe = self.client.pipeline(transaction=False)
        queued = 0
        for e in events:
            if isinstance(e, AllBlocksCleared):
                if queued:
                    self._call(pipe.execute)
                    pipe = self.client.pipeline(transaction=False)
                    queued = 0
                self.clear_replica(replica)
                epoch = self._epochs[replica]
                continue
            field = f"{replica}|{int(e.tier)}"
            if isinstance(e, BlockStored):
                for h in e.block_hashes:
                    key = self.block_key(h)
                    pipe.hset(key, field, epoch)
                    pipe.expire(key, self.ttl_s)
                    queued += 2
            elif isinstance(e, BlockRemoved):
                for h in e.block_hashes:
                    pipe.hdel(self.block_key(h), field)
                    queued += 1
        if queued:
            self._call(pipe.execute)

    def clear_replica(self, replica: ReplicaId) -> None:
        self._epochs[replica] = int(self._call(self.client.hincrby, self._epoch_key, replica, 1))

    # --- queries ---------------------------------------------------------------------------

    def match(self, hashes: Sequence[BlockHash], *, exact: bool = False) -> PrefixMatch:
        seq = as_block_hashes(hashes).tolist()
        n = len(seq)
        if n == 0:
            return PrefixMatch(0)
        if exact:
            epochs, rows = self._fetch(seq, range(n))
            known = dict(zip(range(n), rows, strict=True))
            return self._lengths(n, list(range(n)), known, epochs, {})
        step = max(1, math.ceil(n / self.sample_blocks))
        samples = sorted(set(range(0, n, step)) | {n - 1})
        epochs, rows = self._fetch(seq, samples)
        known = dict(zip(samples, rows, strict=True))
        # brackets (sample i, sample i+1) in which some replica's prefix ends, per tier
        wanted: set[int] = set()
        for t in range(NUM_TIERS):
            for i in _ends(samples, known, epochs, t).values():
                if i + 1 < len(samples):
                    wanted.update(range(samples[i] + 1, samples[i + 1]))
        wanted -= known.keys()
        extra: dict[int, dict[ReplicaId, int]] = {}
        if wanted:
            order = sorted(wanted)
            _, more = self._fetch(seq, order)
            extra = dict(zip(order, more, strict=True))
        return self._lengths(n, samples, known, epochs, extra)

    def _lengths(
        self,
        n: int,
        samples: list[int],
        known: dict[int, dict[ReplicaId, int]],
        epochs: Mapping[ReplicaId, int],
        extra: dict[int, dict[ReplicaId, int]],
    ) -> PrefixMatch:
        rows = {**known, **extra}
        out: list[dict[ReplicaId, int]] = []
        for t in range(NUM_TIERS):
            lengths: dict[ReplicaId, int] = {}
            for r, i in _ends(samples, known, epochs, t).items():
                length = samples[i] + 1
                while length < n and length in rows and rows[length].get(r, NUM_TIERS) <= t:
                    length += 1
                lengths[r] = length
            out.append(lengths)
        return PrefixMatch(n, tuple(out))

    def _fetch(
        self, seq: list[BlockHash], positions: Iterable[int]
    ) -> tuple[dict[ReplicaId, int], list[dict[ReplicaId, int]]]:
        """Current epochs, and per position the replicas holding that block -> best tier."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self._epoch_key)
        positions = list(positions)
        for p in positions:
            pipe.hgetall(self.block_key(seq[p]))
        res: list[Any] = self._call(pipe.execute)
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


def _s(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


def _ends(
    samples: list[int],
    known: dict[int, dict[ReplicaId, int]],
    epochs: Mapping[ReplicaId, int],
    tier: int,
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
