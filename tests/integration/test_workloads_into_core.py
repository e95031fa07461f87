"""Workload requests fed to the real cache core: an unbounded cache hits exactly what
``workloads.stats`` predicts, for token-level built-ins and for both kinds of trace block ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.hashing import request_block_hashes
from kvtide.workloads import Workload, open_workload, stats

SEED = 0x5EED


def _unbounded_hit_ratio(workload: Workload) -> float:
    requests = list(workload)
    capacity = sum(r.prompt_tokens // r.block_tokens for r in requests) + 1
    cache = KVCache(
        CacheConfig(capacity_blocks=capacity, block_tokens=workload.block_tokens), ManualClock()
    )
    for request in requests:
        hashes = request_block_hashes(request, workload.block_tokens, SEED)
        cache.access(hashes, request.prompt_tokens)
    return cache.stats().hit_ratio


def _write(path: Path, rows: list[dict[str, object]]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.mark.parametrize(
    "spec", ["builtin:mixed:scale=0.05,duration_s=120", "builtin:rag:requests=60"]
)
def test_builtins(spec: str) -> None:
    workload = open_workload(spec, block_tokens=16)

    assert _unbounded_hit_ratio(workload) == pytest.approx(
        stats(workload)["infinite_cache_hit_ratio"]
    )


def test_bailian_content_ids_are_chained_by_the_core(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {
            "chat_id": 1,
            "timestamp": 0.0,
            "input_length": 48,
            "output_length": 1,
            "hash_ids": [7, 7, 8],
        },
        {
            "chat_id": 2,
            "timestamp": 1.0,
            "input_length": 48,
            "output_length": 1,
            "hash_ids": [7, 8, 9],
        },
        {
            "chat_id": 3,
            "timestamp": 2.0,
            "input_length": 40,
            "output_length": 1,
            "hash_ids": [7, 7, 5],
        },
    ]
    workload = open_workload(_write(tmp_path / "b.jsonl", rows))

    # Request 2 hits block (7) only, request 3 hits (7) and (7, 7): 48 of 136 prompt tokens.
    assert _unbounded_hit_ratio(workload) == pytest.approx(48 / 136)
    assert stats(workload)["infinite_cache_hit_ratio"] == pytest.approx(48 / 136)


def test_mooncake_ids_at_their_native_block_size(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [0, 1, 2]},
        {"timestamp": 5, "input_length": 1500, "output_length": 1, "hash_ids": [0, 1, 3]},
    ]
    workload = open_workload(_write(tmp_path / "m.jsonl", rows))

    assert _unbounded_hit_ratio(workload) == pytest.approx(1024 / 2600)
    assert stats(workload)["infinite_cache_hit_ratio"] == pytest.approx(1024 / 2600)
