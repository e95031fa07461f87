"""BlockTable: scalar and vectorised paths agree, tombstones and rebuilds keep every key."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.routing.table import SMALL_BATCH, BlockTable


def _keys(rng: random.Random, n: int) -> list[int]:
    return [rng.getrandbits(64) for _ in range(n)]


def test_small_and_large_batches_store_the_same_masks() -> None:
    rng = random.Random(1)
    keys = _keys(rng, 500)
    small, large = BlockTable(), BlockTable()
    for i in range(0, 500, SMALL_BATCH - 1):
        small.add(keys[i : i + SMALL_BATCH - 1], bit=3, tier=0)
    large.add(keys, bit=3, tier=0)
    for k in keys:
        assert small.mask_at(k) == large.mask_at(k) == 1 << 3
    assert small.num_blocks == large.num_blocks == 500


def test_masks_accumulate_per_replica_and_tier() -> None:
    t = BlockTable()
    t.add([10, 11], bit=0, tier=0)
    t.add([11], bit=5, tier=0)
    t.add([11, 12], bit=2, tier=1)
    assert t.tier_masks(11) == (0b100001, 0b100, 0)
    assert t.mask_at(11, max_tier=0) == 0b100001
    assert t.mask_at(11, max_tier=2) == 0b100101
    assert t.mask_at(12) == 0 and t.mask_at(12, max_tier=1) == 0b100
    assert t.mask_at(99) == 0


def test_remove_frees_a_key_only_when_no_replica_holds_it() -> None:
    t = BlockTable()
    t.add([1, 2, 3], bit=0, tier=0)
    t.add([2], bit=1, tier=0)
    assert t.remove([1, 2], bit=0, tier=0) == 1  # key 1 went empty, key 2 is still held
    assert t.num_blocks == 2
    assert t.mask_at(1) == 0 and t.mask_at(2) == 0b10 and t.mask_at(3) == 1


def test_tombstones_do_not_hide_keys_behind_them_and_rebuilds_keep_everything() -> None:
    rng = random.Random(2)
    t = BlockTable(capacity_blocks=100)
    alive: dict[int, int] = {}
    for step in range(72):
        batch = _keys(rng, rng.choice([3, 40, 200]))
        bit = step % 70
        t.add(batch, bit=bit, tier=0)
        for k in batch:
            alive[k] = alive.get(k, 0) | 1 << bit
        victims = rng.sample(sorted(alive), len(alive) // 3)
        for k in victims:
            t.remove([k], bit=alive[k].bit_length() - 1, tier=0)
            alive[k] &= ~(1 << (alive[k].bit_length() - 1))
            if not alive[k]:
                del alive[k]
    assert t.num_blocks == len(alive)
    for k, mask in alive.items():
        assert t.mask_at(k) == mask
    assert t.num_words == 2  # bit 69 needed a second word


def test_clear_bit_drops_one_replica_everywhere() -> None:
    t = BlockTable()
    t.add(np.arange(1, 1000, dtype=np.uint64), bit=0, tier=0)
    t.add(np.arange(500, 1500, dtype=np.uint64), bit=1, tier=0)
    assert t.clear_bit(0) == 499  # keys 1..499 were only on replica 0
    assert t.mask_at(10) == 0 and t.mask_at(600) == 0b10
    assert t.num_blocks == 1000


def test_memory_is_bounded_per_block_with_single_holders() -> None:
    t = BlockTable()
    rng = random.Random(3)
    for bit in range(64):
        t.add(_keys(rng, 1000), bit=bit, tier=0)
    assert t.num_entries() == 64_000
    assert t.nbytes / t.num_entries() <= 64


# Keys from a small universe, half of them sharing their low bits (one long probe chain), a few
# replicas (bit 65 in a second word) and tiers, so that keys go empty and are stored again over
# tombstones; batches on both sides of SMALL_BATCH and of the vectorised probing's hand-over to
# the scalar loop.
_UNIVERSE = _keys(random.Random(4), 120) + [(i << 20) | 5 for i in range(1, 121)]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.sampled_from([1, 7, SMALL_BATCH - 1, SMALL_BATCH, 40, 63, 64, 65, 130, 240]),
            st.integers(0, 2**32),
            st.sampled_from([0, 1, 65]),
            st.integers(0, 1),
        ),
        max_size=40,
    )
)
def test_agrees_with_a_dict_under_any_adds_and_removes(
    ops: list[tuple[bool, int, int, int, int]],
) -> None:
    t = BlockTable()
    ref: dict[int, list[int]] = {}
    for is_add, size, seed, bit, tier in ops:
        keys = random.Random(seed).sample(_UNIVERSE, size)
        before = {k for k, masks in ref.items() if any(masks)}
        if is_add:
            for k in keys:
                ref.setdefault(k, [0, 0, 0])[tier] |= 1 << bit
            assert t.add(keys, bit=bit, tier=tier) == len(set(keys) - before)
        else:
            for k in keys:
                if k in ref:
                    ref[k][tier] &= ~(1 << bit)
            after = {k for k, masks in ref.items() if any(masks)}
            assert t.remove(keys, bit=bit, tier=tier) == len(before - after)
        live = {k for k, masks in ref.items() if any(masks)}
        assert t.num_blocks == len(live)
        # slots in use (live keys and tombstones) are counted exactly: the rebuild trigger
        assert t._num_used == int(np.count_nonzero(t._kv != 0))
    for k in _UNIVERSE:
        assert t.tier_masks(k) == tuple(ref.get(k, [0, 0, 0]))
    for bit in (0, 1, 65):  # what a resync writes: each replica's keys, per tier
        for tier in range(3):
            held = {k for k, masks in ref.items() if masks[tier] >> bit & 1}
            assert sorted(t.keys_with(bit, tier)) == sorted(held)
