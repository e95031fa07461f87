"""Admission filters: which blocks a lower tier (host, disk) accepts when they are written down.

About 3/4 of the blocks of a conversation trace are never reused, so writing every block evicted
from the GPU into host memory spends link bandwidth and host capacity on blocks that never pay
back. A filter counts how often each block was requested (``record``) and answers ``admit``.
``seen-twice`` is TinyLFU's frequency sketch with a threshold (Einziger et al., "TinyLFU",
ACM ToS 2017): a count-min sketch whose counters are halved every ``sample_blocks`` records,
so old popularity fades.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np
import numpy.typing as npt

from kvtide.core.hashing import BlockHashes
from kvtide.errors import ConfigError
from kvtide.registry import build_named

BoolArray = npt.NDArray[np.bool_]


class AdmissionFilter(Protocol):
    name: str

    def record(self, hashes: BlockHashes) -> None:
        """One request looked up these blocks (its full-block hashes, in prefix order)."""

    def admitted_prefix(self, hashes: BlockHashes) -> int:
        """How many leading blocks of ``hashes`` (a run in prefix order) to write down: up to
        and including the last block admitted (the blocks before it are its ancestors, which
        a prefix-closed tier needs anyway)."""


class AdmitAll:
    """No filter: every block is written down."""

    name = "none"

    def __init__(self, capacity_blocks: int) -> None:
        del capacity_blocks

    def record(self, hashes: BlockHashes) -> None:
        pass

    def admitted_prefix(self, hashes: BlockHashes) -> int:
        return len(hashes)


# Odd 64-bit multipliers, one per sketch row (multiply-shift hashing, Dietzfelbinger et al.);
# block hashes are already uniform, the rows only need to disagree with each other.
_ROW_MULTIPLIERS = (
    0x9E3779B97F4A7C15,
    0xC2B2AE3D27D4EB4F,
    0x165667B19E3779F9,
    0xD6E8FEB86659FD93,
)
_COUNTER_MAX = 15  # 4-bit counters, as TinyLFU: beyond 15 the exact count does not matter


class SeenCount:
    """Admits a block once it has been requested ``threshold`` times (2: "seen twice").

    Counts live in a count-min sketch of 4 rows of ``width`` one-byte counters, so an estimate
    may exceed the true count (a block admitted early). Every ``sample_blocks`` records
    (default 10 x capacity, TinyLFU's sample size) all counters are halved. The default width,
    the next power of two >= 4 x ``sample_blocks``, keeps a block seen once from passing as
    seen twice with probability about 4^-4 even when every record of a sample is a distinct
    block (40 bytes of sketch per block of capacity). Two blocks of one request that share a
    counter add one between them (about n^2 / 2 width per row for n blocks: rare).
    """

    def __init__(
        self,
        capacity_blocks: int,
        *,
        threshold: int = 2,
        width: int | None = None,
        sample_blocks: int | None = None,
    ) -> None:
        if threshold < 1 or threshold > _COUNTER_MAX:
            raise ConfigError(f"admission threshold must lie in [1, {_COUNTER_MAX}]")
        if capacity_blocks <= 0:
            raise ConfigError("an admission filter needs a positive capacity")
        self.sample_blocks = sample_blocks or 10 * capacity_blocks
        if self.sample_blocks <= 0:
            raise ConfigError("admission sample size must be positive")
        width = width or 4 * self.sample_blocks
        bits = max(6, (width - 1).bit_length())
        self.width = 1 << bits
        self.threshold = threshold
        self.name = "seen-twice" if threshold == 2 else f"seen-{threshold}"
        rows = len(_ROW_MULTIPLIERS)
        # One flat table: row r's counters sit at [r * width, (r + 1) * width).
        self._table = np.zeros(rows * self.width, dtype=np.uint8)
        self._mults = np.array(_ROW_MULTIPLIERS, dtype=np.uint64)[:, None]
        self._offsets = (np.arange(rows, dtype=np.uint64) << np.uint64(bits))[:, None]
        self._shift = np.uint64(64 - bits)
        self._since_reset = 0
        self.num_resets = 0

    def _cells(self, hashes: BlockHashes) -> npt.NDArray[np.uint64]:
        keys = np.frombuffer(hashes.raw, dtype="<u8")
        cells: npt.NDArray[np.uint64] = ((keys * self._mults) >> self._shift) + self._offsets
        return cells

    def record(self, hashes: BlockHashes) -> None:
        if not len(hashes):
            return
        cells = self._cells(hashes).ravel()
        counts = self._table[cells]
        np.minimum(counts, _COUNTER_MAX - 1, out=counts)
        counts += 1
        self._table[cells] = counts
        self._since_reset += len(hashes)
        if self._since_reset >= self.sample_blocks:
            self._table >>= 1
            self._since_reset = 0
            self.num_resets += 1

    def estimate(self, hashes: BlockHashes) -> npt.NDArray[np.uint8]:
        """Estimated request counts of ``hashes`` (count-min: the least of the rows)."""
        counts: npt.NDArray[np.uint8] = self._table[self._cells(hashes)].min(axis=0)
        return counts

    def admit(self, hashes: BlockHashes) -> BoolArray:
        """For each block: has it been requested ``threshold`` times?"""
        return self.estimate(hashes) >= self.threshold

    def admitted_prefix(self, hashes: BlockHashes) -> int:
        admitted = np.flatnonzero(self.admit(hashes))
        return int(admitted[-1]) + 1 if len(admitted) else 0


AdmissionFactory = Callable[..., AdmissionFilter]
ADMISSION_FILTERS: dict[str, AdmissionFactory] = {
    "none": AdmitAll,
    "seen-twice": lambda capacity_blocks, **options: SeenCount(
        capacity_blocks, **{"threshold": 2, **options}
    ),
}


def make_admission(
    name: str, capacity_blocks: int, options: Mapping[str, object] | None = None
) -> AdmissionFilter:
    """Builds the filter registered as ``name`` for lower tiers of ``capacity_blocks`` blocks."""
    return build_named(
        "admission filter", ADMISSION_FILTERS, name, capacity_blocks, options=options
    )
