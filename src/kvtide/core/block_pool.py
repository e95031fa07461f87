"""A fixed pool of KV blocks with reference counts: O(1) allocate and free per call.

Blocks are handed out and returned in runs held in ``array('i')``: allocating or freeing k
blocks costs one memcpy, not k Python steps. That matters because a replay frees hundreds of
blocks per request. Only blocks with more than one reference are tracked individually.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from kvtide.errors import UsageError


def block_array(ids: Iterable[int] = ()) -> array[int]:
    return array("i", ids)


class BlockPool:
    """Physical block ids ``0..num_blocks-1``.

    ``try_allocate`` gives each block one reference, ``incref`` adds one, ``free`` drops one;
    a block returns to the pool when its last reference goes. ``try_allocate`` returns ``None``
    when it cannot satisfy the whole request: nothing is half-allocated. The totals count block
    churn (allocations and frees since creation).
    """

    __slots__ = (
        "_extra_refs",
        "_free",
        "num_allocations_total",
        "num_blocks",
        "num_frees_total",
        "num_withdrawn",
    )

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise UsageError("num_blocks must be >= 0")
        if num_blocks >= 2**31:
            raise UsageError("a pool holds fewer than 2**31 blocks")
        self.num_blocks = num_blocks
        # A stack: the most recently freed block is reused first (warm in any real allocator).
        self._free = block_array(range(num_blocks - 1, -1, -1))
        self._extra_refs: dict[int, int] = {}
        self.num_allocations_total = 0
        self.num_frees_total = 0
        self.num_withdrawn = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free) - self.num_withdrawn

    @property
    def num_usable(self) -> int:
        """Blocks the pool can hand out: all of them but those withdrawn."""
        return self.num_blocks - self.num_withdrawn

    def withdraw(self, n: int) -> int:
        """Takes up to ``n`` free blocks out of service for good (the pool shrinks, as when an
        engine is given less KV memory); returns how many. Ids stay as they were."""
        k = max(0, min(n, len(self._free)))
        if k:
            del self._free[-k:]
            self.num_withdrawn += k
        return k

    def try_allocate(self, n: int) -> array[int] | None:
        free = self._free
        if n > len(free) or n < 0:
            return None
        if n == 0:
            return block_array()
        taken = free[-n:]
        del free[-n:]
        self.num_allocations_total += n
        return taken

    def incref(self, block_ids: Iterable[int]) -> None:
        extra = self._extra_refs
        for b in block_ids:
            extra[b] = extra.get(b, 0) + 1

    def free(self, block_ids: array[int] | list[int]) -> None:
        """Drops one reference from each block; blocks losing their last return to the pool."""
        extra = self._extra_refs
        if extra:
            released = block_array()
            for b in block_ids:
                r = extra.get(b)
                if r is None:
                    released.append(b)
                elif r == 1:
                    del extra[b]
                else:
                    extra[b] = r - 1
            block_ids = released
        self._free.extend(block_ids if isinstance(block_ids, array) else block_array(block_ids))
        self.num_frees_total += len(block_ids)
        if len(self._free) > self.num_blocks:
            raise UsageError("a block was freed more often than it was allocated")

    def ref_count(self, block_id: int) -> int:
        """References held on ``block_id`` (O(free blocks): for tests and debugging)."""
        if block_id in self._free:
            return 0
        return 1 + self._extra_refs.get(block_id, 0)

    def check(self) -> None:
        """Raises AssertionError if the pool's invariants do not hold (tests, debugging)."""
        assert len(set(self._free)) == len(self._free), "a free block is listed twice"
        assert all(0 <= b < self.num_blocks for b in self._free)
        assert not set(self._extra_refs) & set(self._free), "a shared block is free"
        assert all(r > 0 for r in self._extra_refs.values())
