"""RouteRequest: what a router knows about a request when it chooses a replica."""

from __future__ import annotations

from dataclasses import dataclass

from kvtide.core.cache import check_prompt_tokens
from kvtide.core.hashing import BlockHashes, as_block_hashes
from kvtide.errors import UsageError
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

    def __post_init__(self) -> None:
        if not isinstance(self.block_hashes, BlockHashes):
            # A library caller may hand in any sequence of ints; policies need the packed form.
            object.__setattr__(self, "block_hashes", as_block_hashes(self.block_hashes))
        if not self.block_tokens >= 1:
            raise UsageError(f"RouteRequest block_tokens must be >= 1, got {self.block_tokens!r}")
        if not self.output_tokens >= 0:
            raise UsageError(f"RouteRequest output_tokens must be >= 0, got {self.output_tokens!r}")
        check_prompt_tokens(len(self.block_hashes), self.block_tokens, self.prompt_tokens)

    @property
    def num_blocks(self) -> int:
        return len(self.block_hashes)
