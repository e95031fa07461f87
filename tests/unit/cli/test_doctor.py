"""`kvtide doctor` on each source, built from real parts: a PrometheusRecorder's exposition of
a cache driven through known misses, a KV event log in vLLM's wire shape, a simulator JSON, a
gateway's access log written by its own ``AccessLog``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.cli import _doctor_sources as sources
from kvtide.cli import main
from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.gateway.access_log import AccessLog, Exchange
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
        (["doctor", "--access-log", "BAD"], "BAD"),
        (["doctor", "--access-log", "EMPTY"], "EMPTY"),
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
    named = str(bad) if named == "BAD" else str(empty) if named == "EMPTY" else named
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err


# (status, replica, route, prompt, predicted cached, reported cached or None, ttft ms or None)
Row = tuple[int, str, str, int, int, int | None, float | None]


def _access_log(path: Path, rows: list[Row]) -> Path:
    """The lines the gateway's own writer makes of these requests."""

    async def write() -> None:
        log = AccessLog(str(path))
        for i, (status, replica, route, prompt, predicted, cached, ttft) in enumerate(rows):
            ex = Exchange("chat", 1_764_892_741.0 + i, 10.0 * i, request_id=f"gw-{i}")
            ex.tenant, ex.model, ex.stream = "acme", "m", ttft is not None
            if status == 200:
                ex.prompt_tokens, ex.replica, ex.route = prompt, replica, route
                ex.predicted_cached_tokens, ex.cached_tokens, ex.attempts = predicted, cached, 1
                if ttft is not None:
                    ex.first_token_s = 10.0 * i + ttft / 1e3
            if route == "retried":
                ex.failures.append("connect")
            log.record(ex, status, None if status == 200 else "rate_limit_exceeded", 10.0 * i + 1)
        await log.close()

    asyncio.run(write())
    return path


def test_doctor_on_an_access_log_names_the_predicted_hits_the_engines_did_not_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows: list[Row] = [
        (200, "a:1", "affinity", 1000, 800, 800, 40.0),  # served as predicted
        (200, "a:1", "affinity", 1000, 800, 200, 90.0),  # 600 predicted, not served
        (200, "b:1", "cold", 1000, 0, 0, 120.0),
        (200, "b:1", "hot", 1000, 0, 400, None),  # a hit nobody predicted: no shortfall
        (200, "b:1", "affinity", 500, 500, None, 30.0),  # no usage reported: left out
        (429, "", "", 0, 0, None, None),
    ]
    path = _access_log(tmp_path / "access.jsonl", rows)
    assert main(["doctor", "--access-log", str(path)]) == 0
    out = capsys.readouterr().out
    assert "hit ratio now: 35.0% of 4,000 prompt tokens" in out  # (800+200+0+400) / 4000
    assert "could be: not known from this source" in out
    assert "limit 1: predicted hits not served (15.0% of prompt tokens): 600 tokens" in out
    assert "6 requests: 5 x 200, 1 x 429" in out
    assert "1 answered requests without the engine's cached_tokens" in out
    assert "replicas: a:1 50% of requests, 50.0% cached; b:1 50% of requests, 20.0% cached" in out
    assert "TTFT of 3 streamed answers: p50 90 ms, p99 120 ms" in out


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([200, 200, 200, 503]),
            st.sampled_from(["a:1", "b:1", "c:1"]),
            st.sampled_from(["affinity", "hot", "cold", "retried"]),
            st.integers(1, 4096),
            st.integers(0, 4096),
            st.one_of(st.none(), st.integers(0, 4096)),
            st.one_of(st.none(), st.floats(0.1, 5000.0)),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_an_access_logs_totals_are_the_sums_of_its_lines(rows: list[Row]) -> None:
    """Differential: the source against a plain sum over the requests it was made from."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        o = sources.from_access_log(_access_log(Path(tmp) / "a.jsonl", rows))
    served = [r for r in rows if r[0] == 200 and r[5] is not None]
    assert o.prompt_tokens == sum(r[3] for r in served)
    assert o.hit_tokens == sum(r[5] or 0 for r in served)
    assert o.unserved_predicted_tokens == sum(max(r[4] - (r[5] or 0), 0) for r in served)
    assert o.instances == max(len({r[1] for r in served}), 1)
    assert not o.miss_causes


def test_an_access_log_with_its_workload_replays_at_the_capacity_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows: list[Row] = [(200, "a:1", "affinity", 1000, 0, 500, 10.0)] * 4
    path = str(_access_log(tmp_path / "access.jsonl", rows))
    argv = ["doctor", "--access-log", path, "--workload", "builtin:chat", "--requests", "50"]
    assert main([*argv, "--capacity-tokens", "32768"]) == 0
    out = capsys.readouterr().out
    assert "device pool 2,048 blocks" in out and "optimum at this size (32,768 tokens" in out
    assert "could be: " in out and "not known" not in out  # the replay's miss causes
    assert main(argv) == 0
    assert "the replay guessed a tenth of the workload's footprint" in capsys.readouterr().out


def test_with_a_replay_the_predicted_hits_not_served_stay_named_under_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The replay's evicted misses make the capacity limit; what the access log observed (the
    router's predictions the engines did not serve) is still said under it."""
    rows: list[Row] = [(200, "a:1", "affinity", 1000, 800, 200, 10.0)] * 4
    path = str(_access_log(tmp_path / "access.jsonl", rows))
    argv = ["doctor", "--access-log", path, "--workload", "builtin:chat", "--requests", "200"]
    assert main([*argv, "--capacity-tokens", "4096"]) == 0
    out = capsys.readouterr().out
    assert "limit 1: capacity" in out
    assert "observed: 2,400 tokens the router predicted cached were computed" in out


def test_an_access_log_names_a_gateway_that_tokenizes_otherwise_than_the_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Requests the gateway tokenized (its count) that the engine counted differently: its
    hashes cannot match the engine's blocks. Text mode's estimates are not compared."""

    async def write(path: Path) -> None:
        log = AccessLog(str(path))
        for i, (tokenized, engine) in enumerate([(True, 1000), (True, 1003), (False, 990)]):
            ex = Exchange("chat", 1_764_892_741.0 + i, float(i), request_id=f"gw-{i}")
            ex.prompt_tokens, ex.tokenized, ex.engine_prompt_tokens = 1000, tokenized, engine
            ex.replica, ex.route, ex.predicted_cached_tokens, ex.cached_tokens = "a:1", "hot", 0, 0
            log.record(ex, 200, None, i + 0.5)
        await log.close()

    path = tmp_path / "access.jsonl"
    asyncio.run(write(path))
    assert main(["doctor", "--access-log", str(path)]) == 0
    out = capsys.readouterr().out
    assert "limit 1: prefix identity (33.4% of prompt tokens): 1 of 2 requests" in out
