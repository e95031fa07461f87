"""``gateway.shared``'s writes to Redis in pieces: each under its own deadline, none larger
than ``_CHUNK_BLOCKS`` blocks unless one event is, the events in order."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from kvtide.core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvtide.gateway.shared import _CHUNK_BLOCKS, _chunks
from kvtide.types import BlockHash


def _event(kind: int, n: int) -> KVEvent:
    hashes = tuple(BlockHash(i) for i in range(n))
    if kind == 0:
        return AllBlocksCleared()
    return BlockStored(hashes, None, None, 16) if kind == 1 else BlockRemoved(hashes)


def _size(e: KVEvent) -> int:
    return 0 if isinstance(e, AllBlocksCleared) else len(e.block_hashes)


@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 2 * _CHUNK_BLOCKS)).map(lambda kn: _event(*kn)),
        max_size=30,
    )
)
def test_pieces_keep_the_order_and_stay_within_the_bound(events: list[KVEvent]) -> None:
    pieces = list(_chunks(events))
    assert [e for piece in pieces for e in piece] == events
    assert all(piece for piece in pieces)
    for piece in pieces:
        assert sum(map(_size, piece)) <= _CHUNK_BLOCKS or len(piece) == 1
    # a piece is cut only where the next event would pass the bound
    for a, b in itertools.pairwise(pieces):
        assert sum(map(_size, a)) + _size(b[0]) > _CHUNK_BLOCKS
