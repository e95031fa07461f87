"""One model, two clocks: a built-in workload through `kvtide simulate` (one replica) and through
`kvtide engine` at the same arrival times, over HTTP, give the same TTFTs and cached tokens.

The engine's own records (its clock) must match the simulator within 10% (p50) and 20% (p99);
the client-side TTFT adds the HTTP path's wall latency times the speedup, so it gets a looser
bound here (bench/two_clocks.py reports it at --speedup 1 and 10, docs/engine_server.md)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest
from engine_process import free_port, in_process_engine

from kvtide.engine.scheduler import RequestRecord
from kvtide.engine_server.server import ServerConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.two_clocks import Setup, drive, simulate, workload_requests

pytestmark = pytest.mark.slow
SPEEDUP = 10.0


def test_simulator_and_engine_agree_on_ttft_and_cached_tokens() -> None:
    setup = Setup(requests=120)
    sim = simulate(setup)
    requests = workload_requests(setup)
    records: list[RequestRecord] = []
    config = ServerConfig(
        port=free_port(),
        model=setup.model,
        gpu=setup.gpu,
        tp=setup.tp,
        kv_cache_tokens=setup.kv_cache_tokens,
        block_tokens=setup.block_tokens,
        eviction="lru",
        speedup=SPEEDUP,
        max_waiting=100_000,
        max_model_len=65_536,
    )
    with in_process_engine(config) as server:
        server.built.backend.on_record = records.append  # type: ignore[attr-defined]
        rows = asyncio.run(drive(f"http://127.0.0.1:{config.port}", requests, SPEEDUP))
    assert len(records) == len(rows) == setup.requests
    engine_ttft = np.array([r.first_token_s - r.arrival_s for r in records])
    client_ttft = np.array([r["ttft_s"] for r in rows])
    p50, p99 = np.quantile(engine_ttft, 0.5), np.quantile(engine_ttft, 0.99)
    assert abs(p50 / sim["ttft_p50_s"] - 1) <= 0.10
    assert abs(p99 / sim["ttft_p99_s"] - 1) <= 0.20
    cached = sum(r["cached_tokens"] for r in rows) / sum(r["prompt_tokens"] for r in rows)
    assert abs(cached - sim["cached_ratio"]) <= 0.01
    # the client shares this process's GIL with the server here: its TTFT is only sane
    assert np.all(client_ttft >= engine_ttft.min())
