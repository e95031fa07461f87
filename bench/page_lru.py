"""A plain-Python page-level LRU prefix cache: the obviously correct reference for cache_ops.

Stdlib only (it also runs under the peer venv's python). A page is 16 tokens (``page_tokens``);
its identity is a hash chained over its tokens and its whole prefix. One request:

- hit = the longest run of cached pages from the start, but never the page holding the
  prompt's last token: like vLLM (``get_computed_blocks`` caps the hit at ``num_tokens - 1``)
  and SGLang (``Req._compute_max_prefix_len`` = ``input_len - 1``), the last token is always
  recomputed, so a prompt whose length is a multiple of 16 can hit at most ``n - 1`` of its
  ``n`` full pages;
- then every full page of the prompt is stored or touched, deepest first, so the first page
  ends most recently used and, like vLLM's reverse-order free, a request's tail is evicted
  before its head;
- then the least recently used pages are evicted until ``capacity_pages`` remain.

A partial last page is never cached.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def chain_page_hashes(tokens: Sequence[int], page_tokens: int) -> list[int]:
    """Python ``hash`` of (parent hash, page tokens), chained; full pages only."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - page_tokens + 1, page_tokens):
        parent = hash((parent, tuple(tokens[start : start + page_tokens])))
        hashes.append(parent)
    return hashes


class PageLRU:
    def __init__(self, capacity_pages: int, page_tokens: int = 16) -> None:
        if capacity_pages <= 0:
            raise ValueError("capacity_pages must be positive")
        self.capacity_pages = capacity_pages
        self.page_tokens = page_tokens
        self.pages: OrderedDict[int, None] = OrderedDict()
        self.num_evicted = 0

    def request(self, tokens: Sequence[int]) -> int:
        """Replays one request; returns its hit tokens."""
        hashes = chain_page_hashes(tokens, self.page_tokens)
        return self.request_hashes(hashes, len(tokens))

    def request_hashes(self, hashes: Sequence[int], num_tokens: int) -> int:
        pages = self.pages
        limit = min(len(hashes), (num_tokens - 1) // self.page_tokens)
        hit = 0
        while hit < limit and hashes[hit] in pages:
            hit += 1
        for h in reversed(hashes):
            pages[h] = None
            pages.move_to_end(h)
        while len(pages) > self.capacity_pages:
            pages.popitem(last=False)
            self.num_evicted += 1
        return hit * self.page_tokens


class VLLMPoolLRU:
    """vLLM v1's BlockPool replayed as a page cache, to explain its hit counts exactly.

    It differs from PageLRU in one way only that changes hits: when every full page of a prompt
    that is an exact multiple of 16 tokens is cached, vLLM recomputes the last page into a new
    block and caches it as a second copy of the same hash; the old copy keeps its place in the
    LRU queue and holds a block until it is evicted, so fewer distinct pages fit. The model:
    a free queue of ``capacity_pages`` slots (reused from the front), hit pages taken out of it,
    new blocks popped from its front (evicting whatever hash they held), and on release the
    request's blocks in reverse order: unhashed ones (the partial last block) to the front,
    hashed ones to the back (``BlockPool.free_blocks``).
    """

    def __init__(self, capacity_pages: int, page_tokens: int = 16) -> None:
        if capacity_pages <= 0:
            raise ValueError("capacity_pages must be positive")
        self.page_tokens = page_tokens
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(capacity_pages))
        self.slot_hash: list[int | None] = [None] * capacity_pages
        self.cached: dict[int, list[int]] = {}  # hash -> slots holding it, oldest first

    def request(self, tokens: Sequence[int]) -> int:
        return self.request_hashes(chain_page_hashes(tokens, self.page_tokens), len(tokens))

    def request_hashes(self, hashes: Sequence[int], num_tokens: int) -> int:
        limit = min(len(hashes), (num_tokens - 1) // self.page_tokens)
        held: list[int] = []
        while len(held) < limit and hashes[len(held)] in self.cached:
            held.append(self.cached[hashes[len(held)]][0])
        hit = len(held)
        for slot in held:
            del self.free[slot]
        num_blocks = -(-num_tokens // self.page_tokens)
        for page in range(hit, num_blocks):
            slot, _ = self.free.popitem(last=False)
            old = self.slot_hash[slot]
            if old is not None:
                self.cached[old].remove(slot)
                if not self.cached[old]:
                    del self.cached[old]
            new = hashes[page] if page < len(hashes) else None
            self.slot_hash[slot] = new
            if new is not None:
                self.cached.setdefault(new, []).append(slot)
            held.append(slot)
        released = held[::-1]
        for slot in released:
            if self.slot_hash[slot] is not None:
                self.free[slot] = None
        for slot in reversed([s for s in released if self.slot_hash[s] is None]):
            self.free[slot] = None
            self.free.move_to_end(slot, last=False)
        return hit * self.page_tokens
