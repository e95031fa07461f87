"""`kvtide doctor` on each source, built from real parts: a PrometheusRecorder's exposition of
a cache driven through known misses, a KV event log in vLLM's wire shape, a simulator JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtide.cli import main
from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.gateway.telemetry import GatewayTelemetry
from kvtide.routing.consistency import IndexHealth
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.telemetry.cache import CacheTelemetry
from kvtide.telemetry.recorders import PrometheusRecorder
from kvtide.types import ReplicaId


def _scrape(tmp_path: Path) -> Path:
    """A 4-block cache: one prefix, evicted by another, then wanted again."""
    clock = ManualClock()
    cache = KVCache(CacheConfig(capacity_blocks=4, block_tokens=4), clock)
    rec = PrometheusRecorder()
    tel = CacheTelemetry(rec, cache)
    for hashes in ([1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 3, 4]):
        clock.advance(1.0)
        cache.access(hashes, 16)
    tel.collect()
    path = tmp_path / "metrics.txt"
    path.write_bytes(rec.exposition())
    return path


def test_doctor_on_a_scrape_names_capacity_with_the_evicted_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", "--scrape", str(_scrape(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "hit ratio now: 0.0% of 48 prompt tokens" in out
    # 32 cold tokens of 48: an infinite cache would hit the last 16.
    assert "could be: 33.3% with an infinite cache" in out
    assert "limit 1: capacity (33.3% of prompt tokens)" in out and "16 tokens missed" in out


def test_doctor_on_engines_and_a_gateway_names_the_queue_evictions_within_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gateway's router families scraped beside the engine's cache counters: the evicted
    misses it had predicted as hits are named inside the capacity limit, not counted twice."""
    health = IndexHealth()
    health.report(ReplicaId("e0"), 16, 4, evicted_queued=True)
    gateway = GatewayTelemetry(health, GlobalPrefixIndex(), ManualClock())
    path = _scrape(tmp_path)
    path.write_bytes(path.read_bytes() + gateway.exposition())
    assert main(["doctor", "--scrape", str(path)]) == 0
    out = capsys.readouterr().out
    assert "limit 1: capacity (33.3% of prompt tokens)" in out and "16 tokens missed" in out
    assert "\n  of them, 12 were predicted hits evicted while queued at an engine\n" in out
    assert "or shorter engine queues" in out
    assert "limit 2" not in out


def test_doctor_on_an_event_log_counts_restores_and_gaps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stored = lambda hs: ["BlockStored", hs, None, [0] * 16, 16, None]  # noqa: E731
    lines = [
        {"seq": 0, "batch": [1.0, [stored([1, 2])]]},
        {"seq": 1, "batch": [2.0, [["BlockRemoved", [1, 2], None]]]},
        {"seq": 3, "batch": [3.0, [stored([1, 2, 3])]]},  # seq 2 lost
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["doctor", "--events", str(path)]) == 0
    out = capsys.readouterr().out
    assert "5 stores of 3 distinct blocks, 2 stored again" in out
    assert "event loss" in out and "1 KV event batches lost" in out


def test_doctor_on_a_simulation_sizes_the_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = tmp_path / "sim.json"
    argv = ["simulate", "--requests", "120", "--quiet", "--jobs", "1", "--replicas", "2"]
    assert (
        main(
            [
                *argv,
                "--router",
                "round_robin,precise",
                "--gpu-cache-tokens",
                "16Ki",
                "--json",
                str(sim),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["doctor", "--simulation", str(sim), "--target", "0.95"]) == 0
    out = capsys.readouterr().out
    assert "optimum at this size" in out and "pool size:" in out
    assert "simulated: 2 replicas x" in out or "no capacity up to" in out


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["doctor"], "--prometheus"),
        (["doctor", "--scrape", "/nonexistent/m.txt"], "--scrape"),
        (["doctor", "--prometheus", "ftp://x"], "--prometheus"),
        (["doctor", "--prometheus", "http://127.0.0.1:9"], "--prometheus"),
        (["doctor", "--events", "BAD"], "BAD"),
        (["doctor", "--simulation", "BAD"], "BAD"),
        (["doctor", "--scrape", "BAD"], "BAD"),
        (["doctor", "--scrape", "EMPTY"], "no kvtide_* metrics"),
    ],
)
def test_doctor_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text('{"seq": "x"}\nnot json at all {\n')
    empty = tmp_path / "empty.txt"
    empty.write_text("# HELP up x\n# TYPE up gauge\nup 1\n")
    argv = [str(bad) if a == "BAD" else str(empty) if a == "EMPTY" else a for a in argv]
    named = str(bad) if named == "BAD" else named
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err
