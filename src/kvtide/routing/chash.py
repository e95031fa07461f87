"""Consistent hashing with bounded loads, and rendezvous hashing.

Bounded loads: Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads",
SODA'18. Each replica may hold at most ceil((1+eps) * average) requests (the average counting
the one being placed); a key walks the ring clockwise from its point to the first replica below
that cap. Since the caps add up to more than the total load, the walk always ends. Envoy
(``hash_balance_factor``) and HAProxy (``hash-balance-factor``) ship the same rule.

Ring points are xxh3 hashes of "<replica>#<i>": the same on every router process, so router
replicas without a coordinator agree on where a cold prefix goes.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Iterator, Sequence

import xxhash

from kvtide.errors import ConfigError
from kvtide.routing.decision import RouteDecision
from kvtide.routing.policies import BasePolicy, RoutingContext, check_epsilon, load_cap
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.types import ReplicaId

_MASK64 = (1 << 64) - 1


def _h64(data: bytes) -> int:
    return xxhash.xxh3_64_intdigest(data)


def prefix_key(request: RouteRequest, key_blocks: int) -> int:
    """The routing key of a request: the chained hash of its first ``key_blocks`` blocks (one
    hash that covers the whole prefix), or of its session / request id when it has no full
    block. Too small a ``key_blocks`` keys every request on the shared system prompt."""
    hashes = request.block_hashes
    if n := len(hashes):
        return int(hashes[min(key_blocks, n) - 1])
    return _h64((request.session_id or request.request_id).encode())


class HashRing:
    """Replicas at ``vnodes`` points each on a 64-bit ring."""

    __slots__ = ("_owners", "_points", "replicas", "vnodes")

    def __init__(self, replicas: Iterable[ReplicaId], vnodes: int = 160) -> None:
        if vnodes < 1:
            raise ConfigError(f"vnodes must be >= 1, got {vnodes}")
        self.vnodes = vnodes
        self.replicas = tuple(sorted(set(replicas)))
        pts = sorted((_h64(f"{r}#{i}".encode()), r) for r in self.replicas for i in range(vnodes))
        self._points = [p for p, _ in pts]
        self._owners = [r for _, r in pts]

    def __len__(self) -> int:
        return len(self.replicas)

    def walk(self, key: int) -> Iterator[ReplicaId]:
        """Distinct replicas clockwise from ``key``'s point."""
        points = self._points
        if not points:
            return
        owners = self._owners
        n = len(points)
        i = bisect.bisect_left(points, key & _MASK64)
        seen: set[ReplicaId] = set()
        want = len(self.replicas)
        for j in range(n):
            r = owners[(i + j) % n]
            if r not in seen:
                yield r
                seen.add(r)
                if len(seen) == want:
                    return

    def owner(self, key: int) -> ReplicaId:
        return next(self.walk(key))


def rendezvous_top(key: int, replicas: Sequence[ReplicaId], k: int) -> list[ReplicaId]:
    """The ``k`` replicas with the highest rendezvous (HRW) weight for ``key``
    (Thaler and Ravishankar, 1998): stable when other replicas come and go."""
    kb = (key & _MASK64).to_bytes(8, "little")
    ids = _ID_BYTES
    if len(ids) > 65_536:  # replica ids come and go; keep the memo bounded
        ids.clear()

    def weight(r: ReplicaId) -> int:
        raw = ids.get(r)
        if raw is None:
            raw = ids[r] = r.encode()
        return _h64(kb + raw)

    return heapq.nlargest(k, replicas, key=weight)


_ID_BYTES: dict[str, bytes] = {}


def tie_break(key: int, ties: Sequence[ReplicaState]) -> ReplicaState:
    """Among equally good replicas: the fewest requests, then the highest rendezvous weight
    for ``key`` (deterministic, and spread evenly over keys)."""
    least = min(r.num_requests for r in ties)
    left = [r for r in ties if r.num_requests == least]
    if len(left) == 1:
        return left[0]
    by_id = {r.replica_id: r for r in left}
    return by_id[rendezvous_top(key, list(by_id), 1)[0]]


class RingCache:
    """The ring of the current healthy replica set, rebuilt only when the set changes."""

    __slots__ = ("_ids", "_ring", "vnodes")

    def __init__(self, vnodes: int) -> None:
        self.vnodes = vnodes
        self._ids: tuple[ReplicaId, ...] | None = None
        self._ring = HashRing((), vnodes)

    def ring(self, replicas: Sequence[ReplicaState]) -> HashRing:
        ids = tuple(r.replica_id for r in replicas)
        if ids != self._ids:
            if self._ids is None or set(ids) != set(self._ring.replicas):
                self._ring = HashRing(ids, self.vnodes)
            self._ids = ids
        return self._ring


def bounded_choice(
    ring: HashRing, key: int, replicas: Sequence[ReplicaState], epsilon: float
) -> tuple[ReplicaState, int]:
    """The first replica clockwise from ``key`` under the bounded-load cap; also returns how
    many replicas were skipped as full. ``replicas`` are the ring's (healthy) replicas."""
    cap = load_cap(replicas, epsilon)
    by_id = {r.replica_id: r for r in replicas}
    for skipped, rid in enumerate(ring.walk(key)):
        r = by_id[rid]
        if r.num_requests + 1 <= cap:
            return r, skipped
    raise AssertionError("bounded-load caps always leave room")  # sum of caps > total load


class ConsistentHash(BasePolicy):
    """``chash``: bounded-load consistent hashing keyed on the first ``key_blocks`` blocks."""

    name = "chash"

    def __init__(
        self,
        ctx: RoutingContext,
        epsilon: float = 0.25,
        key_blocks: int = 16,
        vnodes: int = 160,
    ) -> None:
        super().__init__(ctx)
        self.epsilon = check_epsilon(epsilon)
        if key_blocks < 1:
            raise ConfigError(f"key_blocks must be >= 1, got {key_blocks}")
        self.key_blocks = int(key_blocks)
        self.rings = RingCache(int(vnodes))

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        cands = self.healthy(replicas)
        r, skipped = bounded_choice(
            self.rings.ring(cands), prefix_key(request, self.key_blocks), cands, self.epsilon
        )
        return RouteDecision(
            r.replica_id,
            self.name,
            "hash" if skipped == 0 else "overload",
            queue_tokens=r.queued_prefill_tokens,
        )
