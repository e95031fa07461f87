"""Token-id jsonl: one request a line with its prompt's token ids, so any block size works.

A row: ``token_ids`` (list of ints, required) and optionally ``timestamp`` (s; absent means
"with the previous request"), ``output_length`` (default 1: the first token, which TTFT
measures), ``tenant``, ``session_id``, ``priority`` (int) and ``request_id``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import numpy as np

from kvtide.types import Request, TenantId
from kvtide.workloads.rows import check_arrival, iter_jsonl

KEYS: Final = frozenset({"token_ids"})
DEFAULT_OUTPUT_TOKENS: Final = 1
_DEFAULT_TENANT: Final = "default"
_MAX_TOKEN_ID: Final = 2**31 - 1


def read_tokens(path: Path, *, block_tokens: int) -> Iterator[Request]:
    """Yields one request per row, each carrying ``block_tokens`` as its block size and its
    token ids as a read-only int32 array (what the core hashes without conversion)."""
    previous_s = 0.0
    for index, row in enumerate(iter_jsonl(path)):
        arrival_s = row.get_seconds("timestamp", default=previous_s)
        check_arrival(row, arrival_s, previous_s)
        previous_s = arrival_s
        ids = row.get_ints("token_ids")
        if not ids:
            raise row.error("field 'token_ids' is empty")
        if min(ids) < 0 or max(ids) > _MAX_TOKEN_ID:
            raise row.error(
                f"field 'token_ids' holds ids outside [0, 2**31): {min(ids)}..{max(ids)}"
            )
        token_ids = np.array(ids, dtype=np.int32)
        token_ids.flags.writeable = False
        yield Request(
            request_id=row.get_str("request_id") or str(index),
            arrival_s=arrival_s,
            prompt_tokens=len(token_ids),
            output_tokens=row.get_int("output_length", default=DEFAULT_OUTPUT_TOKENS),
            block_tokens=block_tokens,
            token_ids=token_ids,
            tenant=TenantId(row.get_str("tenant") or _DEFAULT_TENANT),
            session_id=row.get_str("session_id"),
            priority=row.get_int("priority", default=0, minimum=-(2**31)),
        )
