"""BlockTable: an open-addressing hash table from block hash to replica bitmasks, per tier.

Why not a dict: a CPython dict entry plus its 64-bit int key costs 70-110 bytes, and most blocks
live on one replica, so an index of dicts would spend ~100 bytes per (block, replica) entry.
Here a slot is 8 bytes of key plus 8 bytes of mask per tier in use, in typed arrays. A rebuild
leaves the live keys at 0.2-0.4 of the slots (a power of two), and new keys and tombstones
fill them to 0.6 before the next: 27-80 bytes per block with device masks only. The load is
kept lower than a scalar table's because a prompt is a batch of keys probed together, mostly
new under steady churn (engines storing and evicting): at 0.25-0.5 live and 0.7 in all,
applying the engines' events took 686-729 µs a request against 536-544
(``bench/index_churn.py`` on the Mooncake trace, two runs each).

Layout: linear probing over ``array('Q')`` keys (stored xor a constant so that the two reserved
values, EMPTY = 0 and TOMBSTONE = 1, never stand for a real hash in practice); one mask word per
64 replicas per tier. Single lookups are Python loops over the arrays (~0.2 µs); batches go
through numpy views of the same memory while many keys are still probing, then the last few
one at a time. Deleted keys leave tombstones: a new key takes the first one on its probe path
(a lookup passes over it, live or dead, so no chain breaks), and a rebuild clears those left."""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]

_XOR = 0x5BD1E9955BD1E995  # any constant works; real hashes equal to it or to it ^ 1 alias
_EMPTY = 0
_TOMB = 1
_MAX_LOAD = 0.6  # slots in use (live + tombstones) before a rebuild
_REBUILT_LOAD = 0.4  # the most live keys a rebuild leaves, as a share of its slots
_MIN_SLOTS = 1024
NUM_TIERS = 3
SMALL_BATCH = 128
"""Below this many keys a batch goes one key at a time: numpy's per-call overhead (~5 µs a
round, a dozen rounds) costs more. An add and a remove of 64 keys (a 1k-token prompt's
blocks, what an engine stores for one request) on a table of 120k: 64 µs one at a time, 92
through numpy; 128 keys: 164 and 161; 256: 216 and 210. Raised from 24 in run 26 of
docs/gateways.md (``bench/index_churn.py`` on the Mooncake trace, whose batches are larger:
within its noise)."""
_STRAGGLERS = 64
"""Keys still probing below which a batch finishes one key at a time: a numpy round costs
~5 µs whatever its size, a scalar probe step ~0.1 µs."""


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 1).bit_length()


class BlockTable:
    """Block hash -> (tier -> replica bitmask). Replicas are bit numbers 0..64·words-1."""

    __slots__ = (
        "_cap",
        "_dev",
        "_keys",
        "_kv",
        "_mask",
        "_masks",
        "_mv",
        "_num_live",
        "_num_used",
        "num_words",
    )

    def __init__(self, capacity_blocks: int = _MIN_SLOTS, num_words: int = 1) -> None:
        cap = _pow2_at_least(max(_MIN_SLOTS, int(capacity_blocks / _REBUILT_LOAD)))
        self.num_words = num_words
        self._alloc(cap)

    # --- storage -------------------------------------------------------------------------

    def _alloc(self, cap: int) -> None:
        self._cap = cap
        self._mask = cap - 1
        self._keys = array("Q", bytes(8 * cap))
        self._kv: U64 = np.frombuffer(self._keys, dtype=np.uint64)
        # _masks[tier] is None until a block of that tier arrives, else one array per word
        self._masks: list[list[array[int]] | None] = [None] * NUM_TIERS
        self._mv: list[list[U64] | None] = [None] * NUM_TIERS
        self._dev = self._tier_words(0)[0]  # device tier, replicas 0-63: the usual lookup
        self._num_live = 0
        self._num_used = 0

    def _tier_words(self, tier: int) -> list[array[int]]:
        words = self._masks[tier]
        if words is None:
            words = [array("Q", bytes(8 * self._cap)) for _ in range(self.num_words)]
            self._masks[tier] = words
            self._mv[tier] = [np.frombuffer(w, dtype=np.uint64) for w in words]
        return words

    @property
    def nbytes(self) -> int:
        """Bytes held by the key and mask arrays."""
        total = len(self._keys) * 8
        for words in self._masks:
            if words is not None:
                total += sum(len(w) * 8 for w in words)
        return total

    @property
    def num_blocks(self) -> int:
        """Distinct block hashes held by at least one replica in some tier."""
        return self._num_live

    @property
    def tiers_in_use(self) -> tuple[int, ...]:
        return tuple(t for t in range(NUM_TIERS) if self._masks[t] is not None)

    def num_entries(self) -> int:
        """(block, replica, tier) triples held; O(slots), for reports."""
        total = 0
        for views in self._mv:
            if views is not None:
                total += sum(int(np.bitwise_count(v).sum()) for v in views)
        return total

    def bits_per_replica(self, tier: int) -> dict[int, int]:
        """Blocks held per replica bit in ``tier``; O(slots · replicas / 64), for reports."""
        views = self._mv[tier]
        out: dict[int, int] = {}
        if views is None:
            return out
        for w, v in enumerate(views):
            for b in range(64):
                n = int(np.count_nonzero(v & np.uint64(1 << b)))
                if n:
                    out[64 * w + b] = n
        return out

    def keys_with(self, bit: int, tier: int) -> list[int]:
        """The block hashes replica ``bit`` holds in ``tier``; O(slots), for a resync."""
        views = self._mv[tier]
        w, b = divmod(bit, 64)
        if views is None or w >= len(views):
            return []
        held = np.flatnonzero(views[w] & np.uint64(1 << b))
        keys = self._kv[held]
        out: list[int] = (keys[keys > _TOMB] ^ np.uint64(_XOR)).tolist()
        return out

    def grow_words(self, num_words: int) -> None:
        """Makes room for replica bits below ``64 · num_words``."""
        if num_words <= self.num_words:
            return
        for tier in range(NUM_TIERS):
            words = self._masks[tier]
            views = self._mv[tier]
            if words is None or views is None:
                continue
            for _ in range(num_words - self.num_words):
                w = array("Q", bytes(8 * self._cap))
                words.append(w)
                views.append(np.frombuffer(w, dtype=np.uint64))
        self.num_words = num_words

    # --- single keys -----------------------------------------------------------------------

    def slot(self, h: int) -> int:
        """The slot holding ``h``, or -1."""
        k = h ^ _XOR
        keys = self._keys
        m = self._mask
        i = k & m
        while True:
            x = keys[i]
            if x == k:
                return i
            if x == _EMPTY:
                return -1
            i = (i + 1) & m

    def mask_at(self, h: int, max_tier: int = 0) -> int:
        """Replicas holding ``h`` in a tier ``<= max_tier``, as a bitmask (0 when absent)."""
        k = h ^ _XOR
        keys = self._keys
        m = self._mask
        i = k & m
        while True:  # slot(), inlined: this is the router's hottest loop
            x = keys[i]
            if x == k:
                break
            if x == _EMPTY:
                return 0
            i = (i + 1) & m
        if max_tier == 0 and self.num_words == 1:
            return self._dev[i]
        masks = self._masks
        out = 0
        for tier in range(max_tier + 1):
            words = masks[tier]
            if words is None:
                continue
            out |= words[0][i]
            for w in range(1, len(words)):
                out |= words[w][i] << (64 * w)
        return out

    def tier_masks(self, h: int) -> tuple[int, ...]:
        """Per tier, the replicas holding ``h``."""
        i = self.slot(h)
        out = []
        for tier in range(NUM_TIERS):
            words = self._masks[tier]
            m = 0
            if words is not None and i >= 0:
                for w, arr in enumerate(words):
                    m |= arr[i] << (64 * w)
            out.append(m)
        return tuple(out)

    # --- batches ---------------------------------------------------------------------------

    def add(self, hashes: Iterable[int] | U64, bit: int, tier: int) -> int:
        """Marks replica ``bit`` as holding each hash in ``tier``; returns the new key count."""
        keys = _as_keys(hashes)
        if len(keys) == 0:
            return 0
        self.grow_words((bit >> 6) + 1)
        if len(keys) < SMALL_BATCH:
            return self._add_scalar(keys.tolist(), bit, tier)
        keys = np.unique(keys)
        slots = self._find(keys)
        missing = slots < 0
        num_new = int(missing.sum())
        if num_new:
            if self._num_used + num_new > _MAX_LOAD * self._cap:
                self._rebuild(self._num_live + num_new)
                slots = self._find(keys)
                missing = slots < 0
            slots[missing] = self._claim(keys[missing])
            self._num_live += num_new
        word = self._tier_words(tier)
        views = self._mv[tier]
        assert views is not None and word is not None
        v = views[bit >> 6]
        v[slots] |= np.uint64(1 << (bit & 63))
        return num_new

    def _add_scalar(self, keys: list[int], bit: int, tier: int) -> int:
        words = self._tier_words(tier)
        arr = words[bit >> 6]
        b = 1 << (bit & 63)
        table = self._keys
        new = 0
        for k in keys:
            m = self._mask
            i = k & m
            tomb = -1
            while True:
                x = table[i]
                if x == k:
                    break
                if x == _TOMB:
                    if tomb < 0:
                        tomb = i
                elif x == _EMPTY:
                    if tomb >= 0:  # absent: it takes the first dead slot on its path
                        i = tomb
                    elif self._num_used + 1 > _MAX_LOAD * self._cap:
                        self._rebuild(self._num_live + 1)
                        table = self._keys
                        arr = self._tier_words(tier)[bit >> 6]
                        m = self._mask
                        i = k & m
                        continue
                    else:
                        self._num_used += 1
                    table[i] = k
                    self._num_live += 1
                    new += 1
                    break
                i = (i + 1) & m
            arr[i] |= b
        return new

    def remove(self, hashes: Iterable[int] | U64, bit: int, tier: int) -> int:
        """Clears replica ``bit`` from each hash in ``tier``; returns how many keys went empty."""
        keys = _as_keys(hashes)
        views = self._mv[tier]
        if len(keys) == 0 or views is None or bit >> 6 >= self.num_words:
            return 0
        if len(keys) < SMALL_BATCH:
            freed = 0
            words = self._masks[tier]
            assert words is not None
            arr = words[bit >> 6]
            clear = ~(1 << (bit & 63)) & 0xFFFFFFFFFFFFFFFF
            table = self._keys
            m = self._mask
            for k in keys.tolist():  # slot(), inlined: the keys are xored already
                i = k & m
                while (x := table[i]) != k:
                    if x == _EMPTY:
                        break
                    i = (i + 1) & m
                else:
                    arr[i] &= clear
                    if not arr[i]:  # this replica's word empty: maybe every word is
                        freed += self._maybe_free(i)
            return freed
        slots = self._find(np.unique(keys))
        slots = slots[slots >= 0]
        v = views[bit >> 6]
        v[slots] &= ~np.uint64(1 << (bit & 63))
        return self._free_empty(slots)

    def clear_bit(self, bit: int) -> int:
        """Removes replica ``bit`` everywhere, O(slots); returns how many keys went empty."""
        touched: list[npt.NDArray[np.intp]] = []
        if bit >> 6 >= self.num_words:
            return 0
        b = np.uint64(1 << (bit & 63))
        for views in self._mv:
            if views is None:
                continue
            v = views[bit >> 6]
            hit = np.flatnonzero(v & b)
            v[hit] &= ~b
            touched.append(hit)
        if not touched:
            return 0
        return self._free_empty(np.unique(np.concatenate(touched)))

    def clear(self) -> None:
        self._alloc(_MIN_SLOTS)

    # --- internals -------------------------------------------------------------------------

    def _is_empty_mask(self, i: int) -> bool:
        for words in self._masks:
            if words is not None:
                for arr in words:
                    if arr[i]:
                        return False
        return True

    def _maybe_free(self, i: int) -> int:
        if self._is_empty_mask(i):
            self._keys[i] = _TOMB
            self._num_live -= 1
            return 1
        return 0

    def _free_empty(self, slots: npt.NDArray[np.intp]) -> int:
        if len(slots) == 0:
            return 0
        nonzero = np.zeros(len(slots), dtype=bool)
        for views in self._mv:
            if views is not None:
                for v in views:
                    nonzero |= v[slots] != 0
        dead = slots[~nonzero]
        dead = dead[self._kv[dead] > _TOMB]
        self._kv[dead] = _TOMB
        self._num_live -= len(dead)
        return len(dead)

    def _find(self, keys: U64) -> npt.NDArray[np.int64]:
        """Slots of ``keys`` (already xored), -1 where absent: vectorised linear probing while
        many keys are still probing, then the few left one at a time. All-numpy, a batch
        waited for its longest probe: at 0.5-0.7 load, 14 slots at the median for a 156-key
        prompt and up to 74, one numpy round each (``_STRAGGLERS``)."""
        kv = self._kv
        mask = self._mask
        out = np.full(len(keys), -1, dtype=np.int64)
        idx = np.arange(len(keys))
        slots = (keys & np.uint64(mask)).astype(np.int64)
        probe_keys = keys
        while idx.size >= _STRAGGLERS:
            k = kv[slots]
            hit = k == probe_keys
            out[idx[hit]] = slots[hit]
            go = ~hit & (k != _EMPTY)
            idx = idx[go]
            probe_keys = probe_keys[go]
            slots = (slots[go] + 1) & mask
        table = self._keys
        # slot(), continued from where the rounds stopped (restarting each key from its home
        # slot through slot() measured ~5% slower in bench/index_churn.py)
        for j, key, i in zip(idx.tolist(), probe_keys.tolist(), slots.tolist(), strict=True):
            while True:
                x = table[i]
                if x == key:
                    out[j] = i
                    break
                if x == _EMPTY:
                    break
                i = (i + 1) & mask
        return out

    def _claim(self, keys: U64) -> npt.NDArray[np.int64]:
        """Inserts distinct ``keys`` known to be absent, each in the first empty or dead slot
        on its probe path; returns their slots. Vectorised while many keys are still looking,
        then one at a time (as ``_find``)."""
        kv = self._kv
        mask = self._mask
        out = np.empty(len(keys), dtype=np.int64)
        idx = np.arange(len(keys))
        slots = (keys & np.uint64(mask)).astype(np.int64)
        empties = 0
        while idx.size >= _STRAGGLERS:
            free = np.flatnonzero(kv[slots] <= _TOMB)
            done = np.zeros(len(idx), dtype=bool)
            if free.size:
                _, first = np.unique(slots[free], return_index=True)
                win = free[first]
                empties += int(np.count_nonzero(kv[slots[win]] == _EMPTY))
                kv[slots[win]] = keys[idx[win]]
                out[idx[win]] = slots[win]
                done[win] = True
            keep = ~done
            idx = idx[keep]
            slots = (slots[keep] + 1) & mask
        table = self._keys
        for j, i in zip(idx.tolist(), slots.tolist(), strict=True):
            while table[i] > _TOMB:
                i = (i + 1) & mask
            empties += table[i] == _EMPTY
            table[i] = int(keys[j])
            out[j] = i
        self._num_used += empties
        return out

    def _rebuild(self, need_live: int) -> None:
        """Re-inserts live keys into a table sized for ``need_live`` keys at load 0.5."""
        live = np.flatnonzero(self._kv > _TOMB)
        keys = self._kv[live].copy()
        old = [None if v is None else [w[live].copy() for w in v] for v in self._mv]
        self._alloc(_pow2_at_least(max(_MIN_SLOTS, int(need_live / _REBUILT_LOAD))))
        slots = self._claim(keys)
        self._num_live = self._num_used = len(keys)
        for tier, words in enumerate(old):
            if words is None:
                continue
            self._tier_words(tier)
            views = self._mv[tier]
            assert views is not None
            for w, vals in enumerate(words):
                views[w][slots] = vals


def _as_keys(hashes: Iterable[int] | U64) -> U64:
    if isinstance(hashes, np.ndarray):
        arr = hashes.astype(np.uint64, copy=False)
    elif isinstance(hashes, bytes | bytearray | memoryview):
        arr = np.frombuffer(hashes, dtype="<u8").astype(np.uint64, copy=False)
    else:
        arr = np.fromiter(hashes, dtype=np.uint64)
    return arr ^ np.uint64(_XOR)
