"""The simulator's telemetry: ticks, pool shrinks, miss causes and alerts on a small fleet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtide.errors import ConfigError
from kvtide.sim.scenario import Scenario, prepare, run
from kvtide.sim.telemetry import PoolShrink
from kvtide.telemetry import DetectorConfig
from kvtide.telemetry import metrics as m
from kvtide.workloads.builtins import Chat

SCENARIO = Scenario(
    workload="builtin:chat:duration_s=240,sessions=60",
    replicas=2,
    gpu_cache_tokens=16_384,
    router="round_robin",
)
CONFIG = DetectorConfig(fast_s=20.0, slow_s=60.0, interval_s=5.0, for_s=10.0)


def test_a_shrink_takes_the_pool_away_step_by_step() -> None:
    prepared = prepare(SCENARIO)
    shrink = PoolShrink(start_s=60.0, every_s=20.0, step_fraction=0.1, steps=3)
    steady = run(SCENARIO, prepared, detector=CONFIG).telemetry
    shrunk = run(SCENARIO, prepared, detector=CONFIG, shrink=shrink).telemetry
    assert steady is not None and shrunk is not None
    full = 2 * (16_384 // 16)
    assert set(steady.capacity_blocks) == {full}
    assert shrunk.capacity_blocks[0] == full
    assert shrunk.capacity_blocks[-1] == 2 * (1024 - 3 * round(0.1 * 1024))
    assert shrunk.capacity_blocks == sorted(shrunk.capacity_blocks, reverse=True)
    ticks = [b - a for a, b in zip(steady.times_s, steady.times_s[1:], strict=False)]
    assert ticks == pytest.approx([CONFIG.interval_s] * len(ticks))
    # A smaller pool loses reuse to eviction: more evicted-then-wanted tokens.
    assert sum(shrunk.miss_tokens_per_s["evicted"]) > sum(steady.miss_tokens_per_s["evicted"])
    assert steady.histograms[m.BLOCK_LIFETIME.name].count > 0
    assert steady.histograms[m.BLOCK_REUSE_GAP.name].count > 0


def test_telemetry_does_not_change_what_the_fleet_does() -> None:
    a = run(SCENARIO, detector=CONFIG)
    b = run(SCENARIO, detector=DetectorConfig())
    assert a.summary == b.summary


def test_a_fresh_fleet_reports_its_cold_start_and_nothing_else_while_it_fills() -> None:
    result = run(SCENARIO, detector=CONFIG).telemetry
    assert result is not None
    assert [a.name for a in result.alerts][:1] == ["cold_start"]
    evicting = result.evictions_per_s["device"]
    first_eviction_s = next(t for t, e in zip(result.times_s, evicting, strict=True) if e > 0)
    for alert in result.alerts[1:]:
        # Nothing but the cold start until the pool has been evicting for a whole baseline.
        assert alert.time_s >= first_eviction_s + CONFIG.slow_s, alert


def test_a_shrink_must_leave_part_of_the_pool() -> None:
    with pytest.raises(ConfigError):
        PoolShrink(start_s=0.0, every_s=10.0, step_fraction=0.5, steps=2)


def _chat_trace(path: Path, output_factor: float, change_s: float) -> None:
    """The built-in chat as a token trace whose outputs grow ``output_factor`` times from
    ``change_s`` on: the same arrivals and prompts, longer generation."""
    with path.open("w") as out:
        for r in Chat(sessions=400, duration_s=1200).generate(0, 16):
            factor = output_factor if r.arrival_s >= change_s else 1.0
            row = {
                "timestamp": r.arrival_s,
                "token_ids": r.token_ids.tolist() if r.token_ids is not None else [],
                "output_length": round(r.output_tokens * factor),
            }
            out.write(json.dumps(row) + "\n")


@pytest.mark.parametrize("output_factor", [1.0, 4.0])
def test_fragmentation_fires_on_a_simulated_run_whose_generation_grows(
    tmp_path: Path, output_factor: float
) -> None:
    """A real simulated series, not a synthetic one: outputs 4x longer from 700 s with the
    same arrivals, and the blocks running requests hold outside the prefix cache (generated
    tokens, room reserved ahead for them) grow past a tenth of the pool."""
    trace = tmp_path / "chat.jsonl"
    _chat_trace(trace, output_factor, 700.0)
    scenario = Scenario(
        workload=str(trace),
        replicas=2,
        model="llama-3-70b",
        tp=2,
        # room for the steady run (no alarm at all), so that what the longer generation
        # takes from the cache is the only change
        gpu_cache_tokens=200_000,
        router="cost",
        block_tokens=16,
    )
    config = DetectorConfig(fast_s=120.0, slow_s=300.0, interval_s=15.0, for_s=30.0)
    tel = run(scenario, prepare(scenario), detector=config).telemetry
    assert tel is not None
    start = tel.times_s[0] - config.interval_s
    fragmentation = [a for a in tel.alerts if a.name == "fragmentation"]
    # told apart from an undersized pool: that alert never fires, in either run
    assert not [a for a in tel.alerts if a.name == "pool_undersized"], tel.alerts
    if output_factor == 1.0:
        assert fragmentation == []
        return
    assert fragmentation, [a.name for a in tel.alerts]
    alert = fragmentation[0]
    # the fast window against the slow one, held for_s, seen at interval_s granularity
    bound = config.slow_s + 2 * config.for_s + config.interval_s
    assert 700 < alert.time_s - start <= 700 + bound
    assert alert.values["private_fast"] >= config.private_factor * alert.values["private_slow"]


def test_a_shrink_below_the_longest_request_is_refused_before_the_run() -> None:
    """Eight steps of 10 % leave 20 % of the pool, less than chat's longest request needs:
    one clear error up front, not an engine's CapacityError mid-run."""
    prepared = prepare(SCENARIO)
    shrink = PoolShrink(start_s=60.0, every_s=20.0, step_fraction=0.1, steps=8)
    with pytest.raises(ConfigError, match=r"pool shrink: 8 steps of 0\.1 leave"):
        run(SCENARIO, prepared, detector=CONFIG, shrink=shrink)
