"""Provisional index entries: a router's own recent decisions, until the engines' events land.

An event-fed index lags the engines: a request routed at t reaches its replica's cache, and the
index learns of it from that replica's ``BlockStored`` events only after the event lag (and
never, when the batch is lost and not yet repaired). A follow-up sharing the prefix (the next
turn of a conversation, a burst on one document) that arrives within the lag then finds the
prefix nowhere, or only its shared system prompt, and loses the replica that computed the rest.

``ProvisionalEntries`` records, per routed request, that its replica will hold the request's
full blocks (optimistic updates, as Dynamo's KV router and llm-d's precise prefix scorer do),
and ``merge`` adds them to an index answer (per replica, the longer prefix of the two, as
device-tier blocks). An entry lives while its request is in flight and ``hold_s`` after it
ends: by then the engine's events have confirmed it (the index then answers the same) or
contradicted it (eviction, a lost batch repaired by a resync), and the index is trusted again.
``hold_s`` defaults to the worst event lag the index health has seen.

Entries are refcounted per replica and block, so overlapping prompts (turn 2 extends turn 1)
keep the shared blocks until the last of them expires, and what a replica holds provisionally
is always a prefix-closed set of chained hashes: the longest held prefix is found by bisection.
Each replica has one flat dict, block hash -> refs: recording and expiring a 2k-token prompt's
120 blocks costs ~20 us, against ~40 us with a dict of replicas per block (120 small dicts made
and dropped per request), and the gateway pays it on every request. A plain ``dict``, not a
``Counter``: a Counter's subscripts from Python cost ~6x a dict's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

from kvtide.core.hashing import BlockHashes
from kvtide.routing.index import PrefixMatch
from kvtide.routing.policies import RoutingContext
from kvtide.types import BlockHash, ReplicaId


class ProvisionalEntries:
    """Blocks a router expects replicas to hold because it sent them there."""

    __slots__ = ("_expiring", "_expiring_ids", "_held", "_hold_s", "_live", "_now")

    def __init__(self, now: Callable[[], float], hold_s: Callable[[], float]) -> None:
        self._now = now
        self._hold_s = hold_s
        self._held: dict[ReplicaId, dict[BlockHash, int]] = {}  # replica -> block hash -> refs
        self._live: dict[str, tuple[ReplicaId, list[BlockHash]]] = {}  # request id -> entry
        self._expiring: deque[tuple[float, ReplicaId, list[BlockHash], str]] = deque()
        self._expiring_ids: dict[str, tuple[ReplicaId, list[BlockHash]]] = {}

    def __len__(self) -> int:
        """Blocks with at least one provisional holder (a union over replicas: for tests and
        diagnostics, not the request path)."""
        return len(set().union(*self._held.values()))

    def record(self, request_id: str, replica: ReplicaId, hashes: BlockHashes) -> None:
        """``request_id`` was sent to ``replica``: it will hold ``hashes`` (full blocks)."""
        self.expire()
        if not hashes or request_id in self._live:
            return
        blocks = hashes.tolist()
        held = self._held.get(replica)
        if held is None:
            held = self._held[replica] = {}
        get = held.get
        for h in blocks:
            held[h] = get(h, 0) + 1
        self._live[request_id] = (replica, blocks)

    def holds(self, request_id: str) -> bool:
        """Whether ``request_id`` has an entry, in flight or expiring."""
        self.expire()
        return request_id in self._live or request_id in self._expiring_ids

    def extend(self, request_id: str, hashes: BlockHashes) -> None:
        """``request_id``'s replica will hold ``hashes`` (its prompt's full blocks, known
        after it was recorded with the first of them): its entry, in flight or expiring,
        grows to them. Unknown or expired: nothing to do."""
        entry = self._live.get(request_id) or self._expiring_ids.get(request_id)
        if entry is None:
            return
        replica, blocks = entry
        more = hashes[len(blocks) :].tolist()
        held = self._held[replica]
        get = held.get
        for h in more:
            held[h] = get(h, 0) + 1
        blocks += more  # in place: the entry's list, wherever it is queued

    def done(self, request_id: str) -> None:
        """The request ended: its entry lasts ``hold_s`` more, for the events to land."""
        entry = self._live.pop(request_id, None)
        if entry is not None:
            self._expiring.append((self._now() + self._hold_s(), *entry, request_id))
            self._expiring_ids[request_id] = entry
        self.expire()

    def expire(self) -> None:
        now = self._now()
        q = self._expiring
        while q and q[0][0] <= now:
            _, replica, blocks, request_id = q.popleft()
            same = self._expiring_ids.get(request_id)
            if same is not None and same[1] is blocks:  # not a later entry of the same id
                del self._expiring_ids[request_id]
            held = self._held[replica]
            pop = held.pop
            for h in blocks:
                refs = pop(h)
                if refs > 1:
                    held[h] = refs - 1
            if not held:
                del self._held[replica]

    def match(self, hashes: BlockHashes) -> dict[ReplicaId, int]:
        """Per replica, the longest prefix of ``hashes`` it holds provisionally."""
        if not self._held or not hashes:
            return {}
        first = hashes[0]
        ints: list[BlockHash] | None = None
        out: dict[ReplicaId, int] = {}
        for replica, held in self._held.items():
            if first not in held:
                continue
            if ints is None:
                ints = hashes.tolist()
            lo, hi = 1, len(ints)  # holds ints[:lo]; find the largest such lo
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if ints[mid - 1] in held:
                    lo = mid
                else:
                    hi = mid - 1
            out[replica] = lo
        return out

    def merge(self, match: PrefixMatch, hashes: BlockHashes) -> PrefixMatch:
        """``match`` with provisional holdings added as device-tier blocks."""
        self.expire()
        extra = self.match(hashes)
        if not extra:
            return match
        tiers: list[Mapping[ReplicaId, int]] = []
        for held in match.within_tier:
            merged = dict(held)
            for replica, n in extra.items():
                if n > merged.get(replica, 0):
                    merged[replica] = n
            tiers.append(merged)
        return PrefixMatch(match.num_blocks, tuple(tiers))


def provisional_entries(ctx: RoutingContext, hold_s: float | None = None) -> ProvisionalEntries:
    """Entries on ``ctx``'s clock, held ``hold_s`` after a request ends (default: the worst
    event lag ``ctx.health`` has seen)."""
    if hold_s is None:
        health = ctx.health
        return ProvisionalEntries(ctx.clock.now, lambda: health.max_lag_s)
    fixed = float(hold_s)
    return ProvisionalEntries(ctx.clock.now, lambda: fixed)
