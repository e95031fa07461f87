"""No silent ManualClock: every time-keeping object takes its clock explicitly.

A wall-clock caller that forgot the clock used to get a frozen ManualClock: pins that never
expire, TTLs that never pass. Now forgetting it is a TypeError and passing nonsense a
ConfigError; a WallClock-driven cache and router see time move.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from kvtide.clock import ManualClock, WallClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.hashing import BlockHashes
from kvtide.core.tiers import TieredCache, TieredCacheConfig, TierSpec
from kvtide.errors import ConfigError
from kvtide.routing import ReplicaState, RouteRequest, RoutingContext, make_policy
from kvtide.routing.affinity import Approx

TTL_S = 0.02


def _wait_past(clock: WallClock, t: float) -> None:
    # Bounded: a WallClock is monotonic, so this ends after about TTL_S of real time.
    deadline = time.monotonic() + 5.0
    while clock.now() <= t and time.monotonic() < deadline:
        time.sleep(TTL_S / 2)


@pytest.mark.parametrize(
    "build",
    [
        lambda: KVCache(CacheConfig(4)),  # type: ignore[call-arg]
        lambda: TieredCache(TieredCacheConfig(TierSpec(4))),  # type: ignore[call-arg]
        lambda: RoutingContext(),  # type: ignore[call-arg]
        lambda: make_policy("round_robin"),  # type: ignore[call-arg]
    ],
    ids=["KVCache", "TieredCache", "RoutingContext", "make_policy"],
)
def test_forgetting_the_clock_is_a_type_error(build: Callable[[], object]) -> None:
    with pytest.raises(TypeError, match=r"clock|ctx"):
        build()


@pytest.mark.parametrize(
    ("owner", "build"),
    [
        ("KVCache", lambda c: KVCache(CacheConfig(4), c)),
        ("TieredCache", lambda c: TieredCache(TieredCacheConfig(TierSpec(4)), c)),
        ("RoutingContext", lambda c: RoutingContext(clock=c)),
    ],
)
@pytest.mark.parametrize("bad", [None, 0.0, "wall"])
def test_a_clock_that_cannot_tell_time_is_a_config_error(
    owner: str, build: Callable[[object], object], bad: object
) -> None:
    with pytest.raises(ConfigError, match=f"{owner} needs a clock"):
        build(bad)


def test_a_wall_clock_cache_sees_its_pins_expire() -> None:
    clock = WallClock()
    cache = KVCache(CacheConfig(4, block_tokens=1), clock)
    acc = cache.access(BlockHashes.from_ints([1, 2]), 2)
    start = clock.now()
    assert cache.pin(acc.handle, TTL_S)
    assert cache.pinned_blocks == 2
    _wait_past(clock, start + TTL_S)
    assert cache.expire_pins() == 1
    assert cache.pinned_blocks == 0
    assert cache.stats().elapsed_s > 0


def test_a_wall_clock_tiered_cache_shares_its_clock_with_every_tier() -> None:
    clock = WallClock()
    tiers = TieredCache(TieredCacheConfig(TierSpec(4), host=TierSpec(4)), clock)
    assert all(c.clock is clock for c in tiers.caches.values())
    before = tiers.device.clock.now()
    _wait_past(clock, before)
    assert tiers.device.clock.now() > before


def test_a_wall_clock_router_forgets_its_shadow_entries_after_the_ttl() -> None:
    clock = WallClock()
    ctx = RoutingContext(clock=clock)
    policy = make_policy("approx", ctx, {"capacity_blocks": 100, "ttl_s": TTL_S})
    assert isinstance(policy, Approx)
    reps = [ReplicaState(f"r{i}", capacity_blocks=1000) for i in range(4)]
    req = RouteRequest(BlockHashes.from_ints([1, 2, 3]), 48, 16)
    first = policy.choose(req, reps)
    policy.on_dispatch(req, first)
    assert policy.choose(req, reps).reason == "affinity"
    start = clock.now()  # after the hit, which refreshed the entry
    _wait_past(clock, start + TTL_S)
    # expire() directly: the policy's own timer runs it at most once a second of clock time.
    assert policy.fleet.expire() == 3
    assert policy.choose(req, reps).reason == "cold"


def test_a_manual_clock_still_freezes_time_on_purpose() -> None:
    clock = ManualClock(5.0)
    cache = KVCache(CacheConfig(4, block_tokens=1), clock)
    acc = cache.access(BlockHashes.from_ints([1]), 1)
    assert cache.pin(acc.handle, 1.0)
    assert cache.expire_pins() == 0
    clock.advance(1.0)
    assert cache.expire_pins() == 1
