"""Where an engine may fetch prompt blocks it does not hold: other replicas' caches, a global
KV pool (Mooncake's store). The engine asks at admission; the default source has nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kvtide.core.hashing import BlockHashes


@dataclass(frozen=True, slots=True)
class Fetch:
    """``num_blocks`` blocks right after the local prefix, arriving after ``seconds``."""

    num_blocks: int = 0
    seconds: float = 0.0


NO_FETCH = Fetch()


class PrefixSource(Protocol):
    def fetch(self, hashes: BlockHashes, local_blocks: int) -> Fetch:
        """What can be brought in beyond the first ``local_blocks`` blocks of ``hashes``."""
        ...


class NoSource:
    __slots__ = ()

    def fetch(self, hashes: BlockHashes, local_blocks: int) -> Fetch:
        return NO_FETCH
