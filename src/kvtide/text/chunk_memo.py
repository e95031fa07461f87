"""Token ids of long texts' chunks seen before, so a text that opens as earlier ones did is
tokenized only past what they share.

A gateway's conversation cache (``gateway.prompts.PrefixTokenCache``) reuses whole messages;
it does nothing for one long message that opens with the same text as others: a preamble
pasted into every user message, a RAG prompt's retrieved documents in one message, a
completions prompt's few-shot examples (the completions API has no messages at all). Such
text is cut into chunks at ``FastBpe.cut`` points, where the ids of each side encoded alone
are the whole text's, so a chunk's ids depend on its own text only and are the memo's value
for it.

The cuts are placed from the text's start: the first cut point at or after ``chunk_chars``,
the next one ``chunk_chars`` on, and so on. Two texts that share their first N characters are
cut at the same places up to about N, and there they hit the same entries. What follows the
last cut (the tail, shorter than a chunk and a word) is encoded and never kept: it is where
texts part. A chunk is kept on its second sighting (a doorkeeper of hashes remembers the
first), so one-off documents pass through without pushing out shared ones; entries are
bounded by the token ids they hold, least recently used out first.

What a miss costs: one ``tiktoken`` call per chunk instead of one for the text (~1.5 us
each), the cut search and a string hash per chunk. ``bench/gateway_cpu.py --unique-prompts``
measures it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from kvtide.text.doorkeeper import Doorkeeper

Ids = npt.NDArray[np.int32]

CHUNK_CHARS = 1024
"""About 250 tokens of English: a preamble shared over its first N characters is reused up to
N less one chunk."""


class ChunkMemo:
    """``encode(text)``: ``text``'s ids (no special tokens), through the memo."""

    def __init__(
        self,
        encode_part: Callable[[str], Ids | None],
        cut: Callable[[str, int], int | None],
        max_tokens: int = 1_000_000,
        chunk_chars: int = CHUNK_CHARS,
        max_seen: int = 65_536,
    ) -> None:
        if max_tokens < 0 or chunk_chars < 1:
            raise ValueError("max_tokens must be >= 0 and chunk_chars >= 1")
        self.encode_part = encode_part
        """A part's ids, encoded alone; None where the encoder cannot (the caller's fallback)."""
        self.cut = cut
        self.max_tokens = max_tokens
        self.chunk_chars = chunk_chars
        self._entries: OrderedDict[tuple[int, str], Ids] = OrderedDict()
        self.scope = 0
        """Entries answer lookups of the scope they were stored in (a server sets it per
        request: its tenant), so one client cannot learn what another sent."""
        self._doorkeeper = Doorkeeper(max_seen)
        self.tokens = 0
        """Token ids held now: never above ``max_tokens``."""
        self.hits = 0
        """Chunks answered from the memo."""
        self.misses = 0
        """Chunks encoded."""

    def encode(self, text: str) -> Ids | None:
        """The ids of ``text``, chunk by chunk; None where a part could not be encoded."""
        step = self.chunk_chars
        if len(text) < 2 * step:
            return self.encode_part(text)
        parts: list[Ids] = []
        start = 0
        while (end := self.cut(text, start + step)) is not None and end < len(text):
            ids = self.chunk(text[start:end])
            if ids is None:
                return None
            parts.append(ids)
            start = end
        tail = self.encode_part(text[start:])  # never empty: a cut lies inside the text
        if tail is None:
            return None
        if not parts:
            return tail
        parts.append(tail)
        return np.concatenate(parts)

    def chunk(self, chunk: str) -> Ids | None:
        """The ids of a part of a text that begins at its start or at a cut point and ends at
        a cut point (its ids alone are the whole text's there), through the memo."""
        entries = self._entries
        key = (self.scope, chunk)
        found = entries.get(key)
        if found is not None:
            entries.move_to_end(key)
            self.hits += 1
            return found
        self.misses += 1
        ids = self.encode_part(chunk)
        if ids is None:
            return None
        if not self._doorkeeper.seen_before(key):
            return ids
        if len(ids) <= self.max_tokens:
            ids.flags.writeable = False  # handed to every text that holds the chunk
            entries[key] = ids
            self.tokens += len(ids)
            while self.tokens > self.max_tokens:
                _, gone = entries.popitem(last=False)
                self.tokens -= len(gone)
        return ids

    def __len__(self) -> int:
        return len(self._entries)
