from __future__ import annotations

import pytest

from kvtide.core.block_pool import BlockPool


def test_allocate_all_or_nothing() -> None:
    pool = BlockPool(4)
    got = pool.try_allocate(3)
    assert got is not None and len(set(got)) == 3
    assert pool.try_allocate(2) is None
    assert pool.num_free == 1 and pool.num_used == 3


def test_free_returns_blocks_and_counts_churn() -> None:
    pool = BlockPool(4)
    a = pool.try_allocate(4)
    assert a is not None
    pool.free(a[:2])
    assert pool.num_free == 2
    assert pool.num_allocations_total == 4 and pool.num_frees_total == 2
    b = pool.try_allocate(2)
    assert b is not None and sorted(b) == sorted(a[:2])
    pool.check()


def test_shared_block_returns_only_with_its_last_reference() -> None:
    pool = BlockPool(2)
    a = pool.try_allocate(1)
    assert a is not None
    pool.incref(a)
    assert pool.ref_count(a[0]) == 2
    pool.free(a)
    assert pool.num_free == 1 and pool.ref_count(a[0]) == 1
    pool.free(a)
    assert pool.num_free == 2 and pool.ref_count(a[0]) == 0
    pool.check()


def test_double_free_is_an_error() -> None:
    pool = BlockPool(1)
    a = pool.try_allocate(1)
    assert a is not None
    pool.free(a)
    with pytest.raises(ValueError):
        pool.free(a)


def test_withdraw_takes_free_blocks_out_of_service() -> None:
    pool = BlockPool(4)
    taken = pool.try_allocate(3)
    assert taken is not None
    assert pool.withdraw(5) == 1  # only the free one
    assert (pool.num_usable, pool.num_free, pool.num_used) == (3, 0, 3)
    pool.free(taken)
    assert pool.withdraw(2) == 2
    assert (pool.num_usable, pool.num_free, pool.num_used) == (1, 1, 0)
    assert pool.try_allocate(2) is None
