"""RouteRequest: what a router knows about a request when it chooses a replica."""

from __future__ import annotations

from dataclasses import dataclass

from kvtide.core.hashing import BlockHashes
from kvtide.routing.index import PrefixMatch


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """A request as the router sees it: its full-block hashes and its size.

    ``block_hashes`` are kvtide's chained hashes at the engines' block size (full blocks only,
    salted by the cache side's namespace). ``prefix_match`` lets a caller that queried a remote
    index asynchronously (the gateway, with Redis) hand the answer in, so that ``choose``
    never does I/O; policies that need a match and find none here query their own index.
    """

    block_hashes: BlockHashes
    prompt_tokens: int
    block_tokens: int
    request_id: str = ""
    tenant: str = "default"
    session_id: str | None = None
    output_tokens: int = 0
    prefix_match: PrefixMatch | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.block_hashes)
