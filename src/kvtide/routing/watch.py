"""``EvictionWatch``: predicted prefixes the engine evicted while the request waited for it.

A router predicts a hit from the index at dispatch, but vLLM and SGLang take no reference on
a waiting request's cached blocks: they are touched only when the scheduler admits the request.
Under KV pressure the requests admitted before it write new blocks, and the engine's LRU may
evict the very prefix the router chose the replica for. The engine then reports fewer cached
tokens than predicted although the index was right when it answered; an index health that
reads that as a wrong index falls back to hashing exactly when the cache is scarcest
(docs/gateways.md, run 16: 20 requests of one live chat run on the fallback).

The watch tells the two apart from the engine's own events. At dispatch the router watches the
predicted prefix's last block on the chosen replica; the index calls ``removed`` for every
block an engine evicts from its device tier. Radix and paged caches evict a chain's leaves
first, so if any predicted block went before the request ran, its last one went first: the
watch need not look at the others. The router settles the watch at the first token (by then
the request holds its blocks, so a later eviction is not the queue's doing) and hands the
answer to ``IndexHealth.report``, which keeps such a shortfall out of the precision that
decides trust and counts it on its own (``evicted_queued_tokens``). A lost removal event is
not an excuse (nothing marks the watch), nor is an engine restart (``AllBlocksCleared`` clears
the replica without removals), so a wrong index is still found.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtide.types import BlockHash, ReplicaId


class EvictionWatch:
    """Watched (replica, block) pairs, each with the requests (any hashable token) waiting on
    it; ``settle`` says whether the block was evicted while the request waited."""

    __slots__ = ("_evicted", "_watched", "_where")

    def __init__(self) -> None:
        # replica -> watched block -> tokens waiting on it
        self._watched: dict[ReplicaId, dict[int, list[object]]] = {}
        self._where: dict[object, tuple[ReplicaId, int]] = {}
        self._evicted: set[object] = set()

    def __len__(self) -> int:
        """Requests watched and not yet settled."""
        return len(self._where) + len(self._evicted)

    def watch(self, token: object, replica: ReplicaId, block: BlockHash) -> None:
        """From now until ``settle(token)``, note whether ``replica`` evicts ``block``."""
        self.settle(token)  # a token watched twice keeps only its latest watch
        key = int(block)
        blocks = self._watched.get(replica)
        if blocks is None:
            blocks = self._watched[replica] = {}
        tokens = blocks.get(key)
        if tokens is None:
            blocks[key] = [token]
        else:
            tokens.append(token)
        self._where[token] = (replica, key)

    def removed(self, replica: ReplicaId, blocks: Sequence[BlockHash]) -> None:
        """The index applied ``replica``'s eviction of ``blocks`` from its device tier."""
        watched = self._watched.get(replica)
        if not watched or watched.keys().isdisjoint(blocks):
            return
        for block in blocks:
            tokens = watched.pop(int(block), None)
            if tokens is None:
                continue
            for token in tokens:
                del self._where[token]
                self._evicted.add(token)
        if not watched:
            del self._watched[replica]

    def settle(self, token: object) -> bool:
        """Stops watching ``token``; whether its block was evicted since ``watch``."""
        if token in self._evicted:
            self._evicted.discard(token)
            return True
        where = self._where.pop(token, None)
        if where is None:
            return False
        replica, key = where
        blocks = self._watched[replica]
        tokens = blocks[key]
        tokens.remove(token)
        if not tokens:
            del blocks[key]
            if not blocks:
                del self._watched[replica]
        return False
