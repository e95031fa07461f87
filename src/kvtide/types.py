"""Identifiers and plain values shared by every layer; no logic beyond checking them."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NewType

import numpy as np
import numpy.typing as npt

from kvtide.errors import UsageError

BlockHash = NewType("BlockHash", int)
"""A chained block hash: covers one full block of tokens and its whole prefix, in a namespace."""

ReplicaId = NewType("ReplicaId", str)
TenantId = NewType("TenantId", str)


class Tier(enum.IntEnum):
    """Where a block's KV lives, fastest first."""

    DEVICE = 0
    HOST = 1
    DISK = 2


@dataclass(frozen=True, slots=True, eq=False)
class Request:
    """One inference request as a workload describes it, before any hashing.

    Prompt identity comes either as ``token_ids`` or as ``block_ids`` (one id per block of
    ``block_tokens`` tokens, the last block possibly partial); the cache chains ids itself, so
    ids may identify a whole prefix (Mooncake) or only one block's content (Bailian). Token ids
    are best given as an int32 numpy array: hashing then needs no conversion.
    The namespace salt is never part of a request: the cache side applies it.
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_tokens: int
    block_ids: tuple[int, ...] | None = None
    token_ids: tuple[int, ...] | npt.NDArray[np.int32] | None = None
    tenant: TenantId = TenantId("default")
    session_id: str | None = None
    priority: int = 0
    extra: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Checked once here so that no layer above meets a negative size or a NaN time.
        if not (self.prompt_tokens >= 0 and self.output_tokens >= 0 and self.block_tokens >= 1):
            raise UsageError(
                f"request {self.request_id!r}: prompt_tokens={self.prompt_tokens!r} and "
                f"output_tokens={self.output_tokens!r} must be >= 0, "
                f"block_tokens={self.block_tokens!r} >= 1"
            )
        if not math.isfinite(self.arrival_s):
            raise UsageError(
                f"request {self.request_id!r}: arrival_s must be finite, got {self.arrival_s!r}"
            )

    @property
    def num_full_blocks(self) -> int:
        return self.prompt_tokens // self.block_tokens
