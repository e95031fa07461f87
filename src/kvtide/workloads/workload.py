"""Workload: a named, re-iterable stream of requests in arrival order."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvtide.errors import ConfigError
from kvtide.types import Request

MAX_REQUESTS = 2**62
"""A request count past any trace (``itertools.islice`` refuses more than ``sys.maxsize``)."""


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests in arrival order, produced afresh (and identically) by each iteration.

    ``block_tokens`` is the workload's native block size: every request carries it, and a
    consumer that caches at another size re-blocks (``core.hashing.expand_block_ids`` for
    block ids; token ids re-block for free). ``time_scale`` multiplies every inter-arrival
    gap (2.0 runs twice as slow); ``limit`` keeps the first ``limit`` requests.
    A workload pickles (its source is a module function or a bound method with its
    arguments), so parallel workers can each iterate it. ``format`` says where the requests come
    from (``mooncake``, ``bailian``, ``tokens``,
    ``azure``, ``builtin``); ``description`` is a JSON-ready summary for reports.
    """

    name: str
    format: str
    block_tokens: int
    source: Callable[[], Iterator[Request]] = field(repr=False)
    params: Mapping[str, object] = field(default_factory=dict)
    limit: int | None = None
    time_scale: float = 1.0
    path: Path | None = None
    """The trace file, for ``where``; ``None`` for built-ins and requests in memory."""

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ConfigError(f"block size must be at least 1 token, got {self.block_tokens}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"request limit must be at least 1, got {self.limit}")
        if self.limit is not None and self.limit > MAX_REQUESTS:
            raise ConfigError(f"request limit must be at most 2**62, got {self.limit}")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0.0):
            raise ConfigError(f"time scale must be a positive number, got {self.time_scale}")

    @classmethod
    def of(cls, name: str, requests: Sequence[Request], *, block_tokens: int = 16) -> Workload:
        """A workload over requests already in memory (tests, small experiments)."""
        return cls(name, "memory", block_tokens, source=functools.partial(iter, tuple(requests)))

    @property
    def description(self) -> dict[str, object]:
        return {
            "name": self.name,
            "format": self.format,
            "block_tokens": self.block_tokens,
            "params": dict(self.params),
            "limit": self.limit,
            "time_scale": self.time_scale,
        }

    def where(self, positions: Iterable[int]) -> dict[int, str]:
        """Where the requests at ``positions`` (0-based, in iteration order) come from:
        ``path:line`` (1-based, as the readers report errors) for a trace, ``request N``
        (1-based) otherwise. Reads the file again: meant for the few requests a message names."""
        wanted = sorted(set(positions))
        if self.path is None or not wanted:
            return {i: f"request {i + 1}" for i in wanted}
        lines = _data_lines(self.path, self.format == "azure", wanted[-1] + 1)
        return {
            i: f"{self.path}:{lines[i]}" if i < len(lines) else f"request {i + 1}" for i in wanted
        }

    def __iter__(self) -> Iterator[Request]:
        requests = self.source()
        if self.limit is not None:
            requests = itertools.islice(requests, self.limit)
        if self.time_scale != 1.0:
            requests = _scale_gaps(requests, self.time_scale)
        return requests


def _data_lines(path: Path, has_header: bool, count: int) -> list[int]:
    """1-based numbers of the first ``count`` data lines: the non-blank lines that each give
    one request (after the header of a CSV), as every reader counts them."""
    out: list[int] = []
    with path.open("rb") as file:
        for number, line in enumerate(file, start=1):
            if (has_header and number == 1) or not line.strip():
                continue
            out.append(number)
            if len(out) == count:
                break
    return out


def _scale_gaps(requests: Iterator[Request], time_scale: float) -> Iterator[Request]:
    first_s: float | None = None
    for request in requests:
        if first_s is None:
            first_s = request.arrival_s
        arrival_s = first_s + (request.arrival_s - first_s) * time_scale
        yield dataclasses.replace(request, arrival_s=arrival_s)
