"""A doorkeeper: the hashes of keys seen once, so a cache admits a key on its second sighting
and one-off keys pass through without pushing out shared ones."""

from __future__ import annotations

from collections.abc import Hashable


class Doorkeeper:
    """``seen_before(key)``: whether ``key`` came by since the set was last cleared (it is
    cleared when ``max_keys`` hashes are held: a bound, not a recency order); it is
    remembered either way. A key's hash only is kept (a string's is cached on it, computed
    for the caller's own lookup already)."""

    __slots__ = ("_seen", "max_keys")

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self._seen: set[int] = set()

    def seen_before(self, key: Hashable) -> bool:
        h = hash(key)
        if h in self._seen:
            return True
        if len(self._seen) >= self.max_keys:
            self._seen.clear()
        self._seen.add(h)
        return False

    def __len__(self) -> int:
        return len(self._seen)
