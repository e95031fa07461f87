"""Mooncake (FAST'25) jsonl traces: prefix-chained block ids, one per 512-token block.

A row: ``timestamp`` (integer ms), ``input_length``, ``output_length`` (tokens) and
``hash_ids``, where equal ids at equal positions mean an equal prefix up to that block and
the last block is partial, so ``len(hash_ids) == ceil(input_length / 512)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

from kvtide.types import Request
from kvtide.workloads.rows import check_arrival, iter_jsonl

BLOCK_TOKENS: Final = 512
KEYS: Final = frozenset({"timestamp", "input_length", "output_length", "hash_ids"})


def read_mooncake(path: Path) -> Iterator[Request]:
    """Yields one request per row; ``request_id`` is the row's index from 0."""
    previous_s = 0.0
    for index, row in enumerate(iter_jsonl(path)):
        arrival_s = row.get_seconds("timestamp", scale=1e-3)
        check_arrival(row, arrival_s, previous_s)
        previous_s = arrival_s
        prompt_tokens = row.get_int("input_length", minimum=1)
        block_ids = row.get_block_ids("hash_ids", prompt_tokens, BLOCK_TOKENS)
        yield Request(
            request_id=str(index),
            arrival_s=arrival_s,
            prompt_tokens=prompt_tokens,
            output_tokens=row.get_int("output_length"),
            block_tokens=BLOCK_TOKENS,
            block_ids=block_ids,
        )
