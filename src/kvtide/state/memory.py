"""MemoryIndexStore: the in-process index store, safe to share between threads.

The simulator uses ``GlobalPrefixIndex`` directly (one thread); a gateway that ingests events on
one thread and routes on another uses this wrapper, which serialises calls with a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from kvtide.core.events import KVEvent
from kvtide.routing.index import GlobalPrefixIndex, PrefixMatch
from kvtide.types import BlockHash, ReplicaId


class MemoryIndexStore:
    def __init__(self, index: GlobalPrefixIndex | None = None) -> None:
        self.index = index if index is not None else GlobalPrefixIndex()
        self._lock = threading.Lock()

    def apply(self, replica: ReplicaId, event: KVEvent) -> None:
        with self._lock:
            self.index.apply(replica, event)

    def apply_all(self, replica: ReplicaId, events: Iterable[KVEvent]) -> None:
        events = list(events)
        with self._lock:
            self.index.apply_all(replica, events)

    def clear_replica(self, replica: ReplicaId) -> None:
        with self._lock:
            self.index.clear_replica(replica)

    def match(self, hashes: Sequence[BlockHash], *, exact: bool = False) -> PrefixMatch:
        with self._lock:
            return self.index.match(hashes, exact=exact)

    def held_blocks(self, replica: ReplicaId) -> int:
        return self.index.held_blocks(replica)  # one dict read: no lock needed
