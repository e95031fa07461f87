"""Alibaba Bailian (USENIX ATC'25) jsonl traces: per-block content ids, one per 16-token block.

A row: ``chat_id``, ``parent_chat_id`` (-1 for a first turn), ``timestamp`` (float s),
``input_length``, ``output_length``, ``type``, ``turn`` and ``hash_ids``. An id hashes its
block's content alone (it is NOT chained and may repeat inside a request): requests keep
them as ``block_ids`` and the cache side chains them (``core.hashing.hash_block_ids``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

from kvtide.types import Request
from kvtide.workloads.rows import check_arrival, iter_jsonl

BLOCK_TOKENS: Final = 16
KEYS: Final = frozenset({"chat_id", "timestamp", "input_length", "hash_ids"})
_NO_PARENT: Final = -1


def read_bailian(path: Path) -> Iterator[Request]:
    """Yields one request per row.

    ``request_id`` is the chat id; ``session_id`` is the root chat id, found by following
    parent links through the rows read so far (a parent the file does not hold, as in an
    excerpt, is taken as the root). ``extra`` keeps ``chat_id``, ``parent_chat_id``,
    ``type`` and ``turn``.
    """
    chat_to_root: dict[int, int] = {}
    previous_s = 0.0
    for row in iter_jsonl(path):
        arrival_s = row.get_seconds("timestamp")
        check_arrival(row, arrival_s, previous_s)
        previous_s = arrival_s
        chat_id = row.get_int("chat_id")
        parent_id = row.get_int("parent_chat_id", default=_NO_PARENT, minimum=_NO_PARENT)
        root_id = chat_id if parent_id == _NO_PARENT else chat_to_root.get(parent_id, parent_id)
        chat_to_root[chat_id] = root_id
        prompt_tokens = row.get_int("input_length", minimum=1)
        block_ids = row.get_block_ids("hash_ids", prompt_tokens, BLOCK_TOKENS)
        yield Request(
            request_id=str(chat_id),
            arrival_s=arrival_s,
            prompt_tokens=prompt_tokens,
            output_tokens=row.get_int("output_length"),
            block_tokens=BLOCK_TOKENS,
            block_ids=block_ids,
            session_id=str(root_id),
            extra={
                "chat_id": chat_id,
                "parent_chat_id": parent_id,
                "type": row.get_str("type"),
                "turn": row.get_int("turn", minimum=1) if row.has("turn") else None,
            },
        )
