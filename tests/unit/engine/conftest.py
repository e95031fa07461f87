"""A cost model with round numbers, and a driver that runs one engine to completion."""

from __future__ import annotations

import numpy as np
import pytest

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.hashing import BlockHashes, hash_tokens
from kvtide.engine.scheduler import EngineConfig, RequestRecord, Scheduler
from kvtide.engine.timing import IterationTimer
from kvtide.types import Request

BLOCK = 4


class FlatCost:
    """Prefill: 1 ms of compute per new token, no memory time; decode: 10 ms per step; no
    overhead."""

    def prefill_compute_time(self, new_tokens: int, cached_tokens: int) -> float:
        return 0.001 * new_tokens

    def prefill_memory_time(self, new_tokens: int, cached_tokens: int) -> float:
        return 0.0

    def decode_step_time(self, batch: int, context_tokens: int) -> float:
        return 0.010


def make_engine(clock: ManualClock, capacity_blocks: int = 64, **engine: object) -> Scheduler:
    cache = KVCache(CacheConfig(capacity_blocks, BLOCK, record_events=True, ghost_blocks=0), clock)
    config = EngineConfig(**engine)  # type: ignore[arg-type]
    return Scheduler(config, cache, IterationTimer(FlatCost(), 0.0), clock)


def request(
    rid: str, tokens: list[int], output: int, arrival_s: float = 0.0
) -> tuple[Request, BlockHashes]:
    ids = np.asarray(tokens, dtype=np.int32)
    req = Request(rid, arrival_s, len(tokens), output, BLOCK, token_ids=ids)
    return req, hash_tokens(ids, BLOCK, seed=7)


def drive(engine: Scheduler, clock: ManualClock) -> list[RequestRecord]:
    """Runs iterations back to back until the engine is idle."""
    records: list[RequestRecord] = []
    while engine.has_work:
        batch = engine.schedule()
        assert batch is not None, "an engine with work must be able to run something"
        clock.set(batch.end_s())
        records.extend(engine.complete(batch))
    return records


@pytest.fixture
def engine_clock() -> ManualClock:
    return ManualClock()
