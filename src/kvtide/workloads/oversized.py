"""Requests longer than a whole KV pool: found, named by trace line, and skipped, the same way
by every command that replays a workload (`kvtide replay` and `kvtide simulate` both call
``OversizedRequests``), so that one long request neither stops a run after minutes nor
silently bends its numbers."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtide.display import plural
from kvtide.types import Request
from kvtide.workloads.workload import Workload

MAX_NAMED = 5
"""Requests named one by one in the report; the rest are counted."""


@dataclass(slots=True)
class OversizedRequests:
    """Keeps the requests that fit a pool of ``pool_tokens`` tokens in ``block_tokens``-token
    blocks. A request needs its prompt's blocks, plus room for one decoded token at least
    (and its whole output) when ``with_output``: an engine holds both; a cache replay holds
    only the prompt."""

    pool_tokens: int
    block_tokens: int
    with_output: bool
    pool_name: str
    """What the pool is called in the report, e.g. ``--gpu-cache-tokens 8,192``."""
    skipped: list[tuple[int, int]] = field(default_factory=list)
    """(position in the workload, tokens needed) of each skipped request."""

    def needed_tokens(self, request: Request) -> int:
        tokens = request.prompt_tokens
        if self.with_output:
            tokens += max(1, request.output_tokens)
        return -(-tokens // self.block_tokens) * self.block_tokens

    def keep(self, position: int, request: Request) -> bool:
        """Whether the request at ``position`` (0-based) fits; records it if not."""
        need = self.needed_tokens(request)
        if need <= self.pool_tokens:
            return True
        self.skipped.append((position, need))
        return False

    def report(self, workload: Workload) -> list[str]:
        """One line per skipped request (the first ``MAX_NAMED``), then a count of the rest."""
        if not self.skipped:
            return []
        named = self.skipped[:MAX_NAMED]
        where = workload.where(position for position, _ in named)
        lines = [
            f"{where[position]}: needs {need:,} tokens of KV, more than the whole "
            f"{self.pool_name}; skipped"
            for position, need in named
        ]
        rest = len(self.skipped) - len(named)
        if rest:
            lines.append(
                f"{workload.name}: {plural(rest, 'more request')} skipped for the same reason"
            )
        return lines
