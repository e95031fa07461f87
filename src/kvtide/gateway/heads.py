"""Prompts routed on their head: what a follow-up sharing the head needs of them.

Block hashes are chained and engines match prefixes from block 0, so where no replica holds
(nor is expected to hold) a prompt's block k, none holds any block after it. A prompt whose
held prefix ends within its first blocks (``BasePolicy.cold_head_blocks``: those the policy
reads to route it, its routing key's) is routed on them alone, and the gateway tokenizes and
hashes only that head (``PromptHasher``'s ``head_blocks``). For a one-off 2k-token prompt the
rest was most of the gateway's CPU for the request (docs/gateways.md, run 24).

The rest has one more use: the router's provisional entries, which tell a follow-up sharing
the prompt (the same document again, the conversation's next turn) where it went before the
engine's events land. So each head is kept here under the hash of its last block, and the
first request whose prompt reaches that block (it holds the whole head, so it may share more)
has the rest tokenized and the router's entries grown to it (``Router.blocks_known``) before
it is routed: its match, and so its route, is what it would have been had the head's prompt
been hashed whole. A follow-up that parts from the prompt inside the head finds the head's
blocks, all it could match. Entries go once used, oldest first past ``max_entries``, and
stale ones cost nothing: the rest of a request the router no longer holds entries for (it
ended, and its events landed or its hold passed) is not tokenized.

What differs from hashing every prompt whole: a head's ``prompt_tokens`` is an estimate (the
head's tokens a character times the text's characters; the engine's ``usage`` settles the
tenant's charge), and the router keys the request's whole prompt by the head's last block
(``cost``: two identical prompts in flight where the first went as a head are not counted as
one hot prompt).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable

from kvtide.core.hashing import BlockHashes
from kvtide.gateway.prompts import Prompt
from kvtide.routing import RouteRequest
from kvtide.types import BlockHash


class RoutedHeads:
    """Heads routed and not yet reached by a follow-up, by their last block's hash."""

    def __init__(
        self,
        blocks_known: Callable[[RouteRequest, Callable[[], BlockHashes]], None],
        max_entries: int = 1024,
        on_rest: Callable[[], None] = lambda: None,
    ) -> None:
        self.blocks_known = blocks_known
        self.on_rest = on_rest
        """Called for each head whose rest is tokenized (a metric)."""
        self.max_entries = max_entries
        self._heads: OrderedDict[BlockHash, tuple[RouteRequest, Prompt]] = OrderedDict()
        self._lengths: dict[int, int] = {}  # head length in blocks -> heads of that length
        self.completed = 0
        """Heads whose rest a follow-up had tokenized (the router still held the head's
        entries: else nothing is tokenized)."""

    def __len__(self) -> int:
        return len(self._heads)

    def add(self, route: RouteRequest, prompt: Prompt) -> None:
        """``route`` was built from the head ``prompt`` (``prompt.whole`` set)."""
        hashes = prompt.hashes
        if not hashes or prompt.whole is None:
            return
        key = hashes[len(hashes) - 1]
        if key in self._heads:
            self._forget(key)
        self._heads[key] = (route, prompt)
        n = len(hashes)
        self._lengths[n] = self._lengths.get(n, 0) + 1
        while len(self._heads) > self.max_entries:
            self._forget(next(iter(self._heads)))

    def reached(self, hashes: BlockHashes) -> None:
        """A whole prompt about to be routed: the heads it holds in full are hashed whole,
        and the router told."""
        if not self._heads:
            return
        for n in list(self._lengths):
            if len(hashes) >= n and (key := hashes[n - 1]) in self._heads:
                route, head = self._heads[key]
                self._forget(key)
                self.blocks_known(route, functools.partial(self._whole, head))

    def _whole(self, head: Prompt) -> BlockHashes:
        assert head.whole is not None
        self.completed += 1
        self.on_rest()
        return head.whole().hashes

    def _forget(self, key: BlockHash) -> None:
        _, prompt = self._heads.pop(key)
        n = len(prompt.hashes)
        left = self._lengths[n] - 1
        if left:
            self._lengths[n] = left
        else:
            del self._lengths[n]
