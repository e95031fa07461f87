"""bench/early_warning.py on a small fleet: three runs, the lead counted from the first tick
the shrinking run warns alone, and every steady alarm judged against the roomy run."""

from __future__ import annotations

import early_warning  # bench/early_warning.py: tests/conftest.py puts bench/ on sys.path
from kvtide.sim.scenario import Scenario
from kvtide.sim.telemetry import PoolShrink
from kvtide.telemetry import DetectorConfig


def test_measure_reports_lead_alarms_and_their_verdicts() -> None:
    scenario = Scenario(
        workload="builtin:chat:duration_s=600,sessions=150",
        replicas=2,
        gpu_cache_tokens=16_384,
        router="round_robin",
    )
    config = DetectorConfig(fast_s=20.0, slow_s=60.0, interval_s=5.0, for_s=10.0)
    shrink = PoolShrink(start_s=150.0, every_s=20.0, step_fraction=0.1, steps=4)
    row = early_warning.measure(scenario, shrink, config)
    steady_times = {t for _, t, _ in row["alarms_steady"]}
    assert {t for _, t in row["false_alarms_steady"]} <= steady_times
    if row["warned_s"] is not None:
        assert row["warned_s"] >= shrink.start_s
        if row["degraded_s"] is not None:
            assert row["lead_s"] == row["degraded_s"] - row["warned_s"]
    assert row["cold_start_alerts"]  # a fresh fleet starts cold
    assert row["false_alarms_before_shrink"] == []
