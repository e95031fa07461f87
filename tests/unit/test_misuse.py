"""Calls against the API's contract raise a KvtideError subclass that says what was wrong.

Each case is one a library user meets: a double unlock, a request hashed at another block
size than its router's, negative or NaN counts, hashes or token ids of the wrong kind.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable

import numpy as np
import pytest

from kvtide import (
    BlockHashes,
    CacheConfig,
    ConfigError,
    CostModel,
    KVCache,
    KvtideError,
    ManualClock,
    Namespace,
    ReplicaId,
    ReplicaState,
    Request,
    Router,
    RouteRequest,
    RoutingContext,
    Tier,
    TieredCache,
    TieredCacheConfig,
    TierSpec,
    UsageError,
    gpu_preset,
    hash_block_ids,
    hash_tokens,
    make_policy,
    model_preset,
)

SEED = Namespace(model="m").seed


def _cache(capacity: int = 8, block_tokens: int = 4) -> KVCache:
    return KVCache(CacheConfig(capacity, block_tokens=block_tokens), ManualClock())


def _hashes(*ids: int) -> BlockHashes:
    return hash_block_ids(list(ids), SEED)


def test_usage_errors_are_kvtide_errors_and_value_errors() -> None:
    assert issubclass(UsageError, KvtideError)
    assert issubclass(UsageError, ValueError)


# --- locks -------------------------------------------------------------------------------------


def test_a_double_unlock_is_a_usage_error_and_leaves_other_locks_alone() -> None:
    cache = _cache()
    h = _hashes(1, 2)
    a = cache.access(h, 8, lock=True)
    b = cache.access(h, 8, lock=True)
    cache.unlock(a.handle)
    cache.unlock(b.handle)
    with pytest.raises(UsageError, match="double unlock"):
        cache.unlock(a.handle)
    # Nothing moved: both locks released exactly once, so the blocks are evictable again.
    assert cache.evict(2) == 2


def test_a_double_unlock_fails_before_touching_a_shared_ancestor() -> None:
    cache = _cache()
    long = cache.access(_hashes(1, 2, 3), 12, lock=True)
    short = cache.access(_hashes(1, 2), 8, lock=True)  # splits the path, locks the head
    cache.unlock(short.handle)
    with pytest.raises(UsageError, match="double unlock"):
        cache.unlock(short.handle)
    assert cache.evict(3) == 0  # the long request still holds all three blocks
    cache.unlock(long.handle)
    assert cache.evict(3) == 3


def test_unlocking_or_locking_an_evicted_handle_is_a_usage_error() -> None:
    cache = _cache()
    acc = cache.access(_hashes(1, 2), 8, lock=True)
    cache.unlock(acc.handle)
    assert cache.evict(2) == 2
    with pytest.raises(UsageError, match="evicted"):
        cache.unlock(acc.handle)
    with pytest.raises(UsageError, match="evicted"):
        cache.lock(acc.handle)


def test_a_double_unlock_on_a_tiered_cache_is_a_usage_error() -> None:
    tiers = TieredCache(
        TieredCacheConfig(TierSpec(4), host=TierSpec(4), block_tokens=4), ManualClock()
    )
    acc = tiers.access(_hashes(1), 4, lock=True)
    assert acc.is_locked
    tiers.unlock(acc.handle)
    with pytest.raises(UsageError, match="double unlock"):
        tiers.unlock(acc.handle)


# --- what access(lock=True) reports -----------------------------------------------------------


def test_access_says_when_locked_blocks_left_no_room() -> None:
    cache = _cache(capacity=4)
    held = cache.access(_hashes(1, 2, 3, 4), 16, lock=True)
    assert (held.new_blocks, held.refused_blocks, held.is_locked) == (4, 0, True)
    other = cache.access(_hashes(9, 8), 8, lock=True)
    assert (other.new_blocks, other.refused_blocks, other.is_locked) == (0, 2, False)
    assert other.cached_blocks == 0
    cache.unlock(other.handle)  # holding nothing, releasing nothing is harmless
    cache.unlock(held.handle)


def test_access_stores_what_fits_and_counts_the_rest_as_refused() -> None:
    cache = _cache(capacity=4)
    held = cache.access(_hashes(1, 2, 3), 12, lock=True)
    part = cache.access(_hashes(9, 8, 7), 12, lock=True)
    assert (part.new_blocks, part.refused_blocks, part.is_locked) == (1, 2, True)
    assert part.cached_blocks == 1
    cache.unlock(part.handle)
    cache.unlock(held.handle)


def test_without_insert_or_lock_nothing_is_refused_or_held() -> None:
    cache = _cache()
    peek = cache.access(_hashes(1, 2), 8, insert=False, lock=True)
    assert (peek.new_blocks, peek.refused_blocks, peek.is_locked) == (0, 0, False)
    plain = cache.access(_hashes(1, 2), 8)
    assert (plain.new_blocks, plain.refused_blocks, plain.is_locked) == (2, 0, False)


def test_a_tiered_access_carries_the_refusal() -> None:
    tiers = TieredCache(
        TieredCacheConfig(TierSpec(2), host=TierSpec(4), block_tokens=4), ManualClock()
    )
    held = tiers.access(_hashes(1, 2), 8, lock=True)
    other = tiers.access(_hashes(5, 6), 8, lock=True)
    assert (other.new_blocks, other.refused_blocks, other.is_locked) == (0, 2, False)
    tiers.unlock(held.handle)


# --- counts -------------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt_tokens", [-1, 7, math.nan])
def test_access_needs_as_many_tokens_as_its_full_blocks(prompt_tokens: float) -> None:
    with pytest.raises(UsageError, match="prompt_tokens="):
        _cache().access(_hashes(1, 2), prompt_tokens)  # type: ignore[arg-type]
    tiers = TieredCache(TieredCacheConfig(TierSpec(4), block_tokens=4), ManualClock())
    with pytest.raises(UsageError, match="prompt_tokens="):
        tiers.access(_hashes(1, 2), prompt_tokens)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prompt_tokens": -1},
        {"output_tokens": -5},
        {"block_tokens": 0},
        {"arrival_s": math.nan},
        {"arrival_s": math.inf},
    ],
)
def test_a_request_with_impossible_sizes_or_time_is_a_usage_error(kwargs: dict[str, float]) -> None:
    base: dict[str, object] = {
        "request_id": "r1",
        "arrival_s": 0.0,
        "prompt_tokens": 32,
        "output_tokens": 8,
        "block_tokens": 16,
    }
    with pytest.raises(UsageError, match="'r1'"):
        Request(**{**base, **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((_hashes(1, 2), -1, 16), "prompt_tokens=-1"),
        ((_hashes(1, 2), 20, 16), "at least 32"),
        ((_hashes(1), 16, 0), "block_tokens"),
    ],
)
def test_a_route_request_with_impossible_sizes_is_a_usage_error(
    args: tuple[BlockHashes, int, int], match: str
) -> None:
    with pytest.raises(UsageError, match=match):
        RouteRequest(*args)


def test_a_route_request_takes_plain_int_hashes() -> None:
    req = RouteRequest([int(h) for h in _hashes(1, 2)], 32, 16)  # type: ignore[arg-type]
    assert isinstance(req.block_hashes, BlockHashes)
    assert req.block_hashes == _hashes(1, 2)


def test_a_router_refuses_a_request_at_another_block_size() -> None:
    ctx = RoutingContext(clock=ManualClock(), block_tokens=16)
    router = Router(make_policy("round_robin", ctx), [ReplicaState("a"), ReplicaState("b")])
    tokens = list(range(64))
    with pytest.raises(UsageError, match=r"32-token blocks.*works at 16"):
        router.route(RouteRequest(hash_tokens(tokens, 32, SEED), 64, 32, request_id="q"))
    assert router.replicas[ReplicaId("a")].num_requests == 0  # nothing was booked
    assert router.route(RouteRequest(hash_tokens(tokens, 16, SEED), 64, 16)).replica == "a"


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.prefill_time(-1),
        lambda c: c.prefill_time(10, math.nan),
        lambda c: c.decode_step_time(0, 10),
        lambda c: c.kv_bytes(-3),
        lambda c: c.decide_onboard(-16, Tier.HOST),
        lambda c: c.decide_onboard(16, Tier.HOST, block_tokens=0),
    ],
)
def test_the_cost_model_refuses_negative_counts(call: Callable[[CostModel], object]) -> None:
    with pytest.raises(UsageError, match=r"must|>="):
        call(CostModel(model_preset("llama-3-8b"), gpu_preset("h100")))


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.advance(-1.0),
        lambda c: c.advance(math.nan),
        lambda c: c.advance(math.inf),
        lambda c: c.set(4.0),
        lambda c: c.set(math.nan),
    ],
)
def test_a_manual_clock_cannot_go_backwards_or_leave_the_finite_numbers(
    call: Callable[[ManualClock], object],
) -> None:
    clock = ManualClock(5.0)
    with pytest.raises(UsageError, match="ManualClock"):
        call(clock)
    assert clock.now() == 5.0


@pytest.mark.parametrize(
    "kwargs", [{"capacity_blocks": "10"}, {"capacity_blocks": 1.5}, {"block_tokens": True}]
)
def test_cache_config_sizes_are_integers(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="must be an integer"):
        CacheConfig(**{"capacity_blocks": 8, **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [["a"], [-1], [2**64]])
def test_block_hashes_must_be_64_bit_unsigned_ints(bad: list[object]) -> None:
    with pytest.raises(UsageError, match="block hashes must be integers"):
        _cache().access(bad, 4)  # type: ignore[arg-type]


def test_namespace_fields_have_their_types() -> None:
    with pytest.raises(UsageError, match="tenant_salt is bytes"):
        Namespace(tenant_salt="secret")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="strings"):
        Namespace(model=7)  # type: ignore[arg-type]


# --- hash_tokens takes what its docstring says -------------------------------------------------

TOKENS = [5, 0, 17, 3, 99, 2, 2, 8, 1, 0, 4, 6]  # three blocks of 4


@pytest.mark.parametrize(
    "as_input",
    [
        list,
        tuple,
        lambda t: array("i", t),
        lambda t: array("l", t),
        lambda t: array("q", t),
        lambda t: array("H", t),
        lambda t: array("B", t),
        lambda t: np.asarray(t, dtype=np.int8),
        lambda t: np.asarray(t, dtype=np.int16),
        lambda t: np.asarray(t, dtype=np.int32),
        lambda t: np.asarray(t, dtype=np.uint8),
        lambda t: np.asarray(t, dtype=np.uint16),
        lambda t: np.asarray(t, dtype=np.uint32),
        lambda t: np.asarray(t, dtype=np.uint64),
        lambda t: np.repeat(np.asarray(t, dtype=np.int64), 2)[::2],  # a strided view
        lambda t: [np.int64(x) for x in t],
    ],
)
def test_hash_tokens_accepts_every_integer_sequence(
    as_input: Callable[[list[int]], object],
) -> None:
    want = hash_tokens(np.asarray(TOKENS, dtype=np.int64), 4, SEED)
    assert len(want) == 3
    assert hash_tokens(as_input(TOKENS), 4, SEED) == want  # type: ignore[arg-type]
    tailed = as_input([*TOKENS, 7, 7])  # a partial tail block is not hashed
    assert hash_tokens(tailed, 4, SEED) == want  # type: ignore[arg-type]


def test_hash_tokens_accepts_a_range_and_empty_inputs() -> None:
    assert hash_tokens(range(8), 4, SEED) == hash_tokens(list(range(8)), 4, SEED)
    empties: list[object] = [[], (), np.array([]), array("i")]
    for empty in empties:
        assert len(hash_tokens(empty, 4, SEED)) == 0  # type: ignore[arg-type]


def test_hash_tokens_continues_a_chain_from_a_parent() -> None:
    whole = hash_tokens(TOKENS, 4, SEED)
    tail = hash_tokens(TOKENS[4:], 4, SEED, parent=whole[0])
    assert list(tail) == list(whole[1:])


@pytest.mark.parametrize(
    ("tokens", "match"),
    [
        ([1.0] * 8, "integers, got an array of float64"),
        (np.ones(8), "integers, got an array of float64"),
        ([True] * 8, "integers, got an array of bool"),
        ("abcdefgh", "not str"),
        (b"abcdefgh", "not bytes"),
        ((t for t in range(8)), "generator or scalar"),
        (np.ones((2, 4), dtype=np.int64), "2-D array"),
        ([3, 1, -2, 4, 0, 0, 0, 0], ">= 0, got -2"),
        (np.asarray([3, 1, -2, 4], dtype=np.int32), ">= 0, got -2"),
        ([2**70] * 4, "integers, got an array of object"),
    ],
)
def test_hash_tokens_refuses_what_is_not_token_ids(tokens: object, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        hash_tokens(tokens, 4, SEED)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("block_tokens", "seed", "match"),
    [
        (0, SEED, "block_tokens"),
        (2.5, SEED, "block_tokens"),
        (True, SEED, "block_tokens"),
        (4, Namespace(), r"pass namespace\.seed"),
        (4, "seed", "seed must be an integer"),
        (4, -1, r"seed must lie in \[0, 2\*\*64\)"),
        (4, 1 << 64, r"seed must lie in \[0, 2\*\*64\)"),
    ],
)
def test_hash_tokens_refuses_a_bad_block_size_or_seed(
    block_tokens: object, seed: object, match: str
) -> None:
    with pytest.raises(UsageError, match=match):
        hash_tokens(TOKENS, block_tokens, seed)  # type: ignore[arg-type]


def test_hash_block_ids_refuses_negative_or_float_ids() -> None:
    with pytest.raises(UsageError, match=">= 0"):
        hash_block_ids([1, -1], SEED)
    with pytest.raises(UsageError, match="float"):
        hash_block_ids([1.5], SEED)  # type: ignore[list-item]


@pytest.mark.parametrize("ttl_s", [0.0, -1.0, math.nan])
def test_a_pin_needs_a_positive_ttl(ttl_s: float) -> None:
    cache = _cache()
    acc = cache.access(_hashes(1), 4)
    with pytest.raises(ConfigError, match="pin TTL must be positive"):
        cache.pin(acc.handle, ttl_s)
    assert cache.pinned_blocks == 0
