"""The early-warning detector, and the Prometheus rules held to it by promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kvtide.cli import main
from kvtide.telemetry import DetectorConfig, EarlyWarning, MemoryRecorder, Sample
from kvtide.telemetry import metrics as m
from kvtide.telemetry.rules import _samples, _scenarios

PROMTOOL = shutil.which("promtool")
CONFIG = DetectorConfig()


def run(name: str) -> EarlyWarning:
    scenario = next(s for s in _scenarios(CONFIG) if s.name == name)
    detector = EarlyWarning(CONFIG, MemoryRecorder(), log=False)
    for sample in _samples(scenario, CONFIG):
        detector.update(sample)
    return detector


def test_a_rising_regret_ratio_with_steady_arrivals_flags_an_undersized_pool() -> None:
    d = run("undersized")
    assert [a.name for a in d.history] == ["pool_undersized"]
    alert = d.history[0]
    change_s = 2 * CONFIG.slow_s
    # The condition holds from the first evaluation whose fast window shows the rise.
    assert change_s < alert.time_s <= change_s + CONFIG.fast_s + CONFIG.for_s
    assert "of the prefill work over the last 300s, up from 2.0%" in alert.reason
    # In the fast window: 50 cold tokens per step against 100, then 500, evicted ones.
    assert 50 / 550 < alert.values["cold_share"] < 50 / 150
    rec = d.recorder
    assert isinstance(rec, MemoryRecorder)
    assert rec.value(m.ALERT_FIRED, ("pool_undersized",)) == 1


def test_a_cold_start_is_told_apart_and_never_called_undersized() -> None:
    d = run("cold_start")
    assert [a.name for a in d.history] == ["cold_start"]
    assert "first uses" in d.history[0].reason
    assert not d.active  # it clears once the pool is warm


def test_a_steady_pool_raises_nothing() -> None:
    assert run("steady").history == []


def test_fragmentation_is_not_an_undersized_pool() -> None:
    d = run("fragmented")
    assert [a.name for a in d.history] == ["fragmentation"]
    assert "outside the prefix cache" in d.history[0].reason


def test_samples_must_come_in_order() -> None:
    d = EarlyWarning(log=False)
    d.update(Sample(10.0, 0, 0, 0, 0, 0, 0, 0, 1))
    with pytest.raises(ValueError):
        d.update(Sample(10.0, 0, 0, 0, 0, 0, 0, 0, 1))


def test_kvtide_alerts_rejects_bad_windows_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["alerts", "--out", str(tmp_path / "r.yml"), "--fast-s", "9999"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fast-s" in err[0]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian's prometheus) not installed")
def test_rules_pass_promtool_check_and_its_unit_tests(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    rules, tests = tmp_path / "rules.yml", tmp_path / "rules_test.yml"
    assert main(["alerts", "--out", str(rules), "--tests", str(tests)]) == 0
    for cmd in (["check", "rules", str(rules)], ["test", "rules", str(tests)]):
        proc = subprocess.run(
            [PROMTOOL, *cmd], capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    text = tests.read_text()
    for alert in ("KvtideCachePoolUndersized", "KvtideCacheColdStart", "KvtideCacheFragmentation"):
        assert f"alertname: {alert}\n    exp_alerts" in text, alert  # each one fires somewhere


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian's prometheus) not installed")
def test_promtool_fails_rules_that_disagree_with_the_detector(tmp_path: Path) -> None:
    """The unit tests can fail: rules with a looser threshold fire where the detector does not."""
    assert PROMTOOL is not None
    rules, tests = tmp_path / "rules.yml", tmp_path / "rules_test.yml"
    assert main(["alerts", "--out", str(rules), "--tests", str(tests)]) == 0
    assert main(["alerts", "--out", str(rules), "--max-cold-share", "0.05"]) == 0
    proc = subprocess.run(
        [PROMTOOL, "test", "rules", str(tests)], capture_output=True, timeout=120, check=False
    )
    assert proc.returncode != 0


def test_engine_telemetry_evaluates_once_per_interval_and_exposes_alerts() -> None:
    from kvtide.clock import ManualClock
    from kvtide.core.cache import CacheConfig, KVCache
    from kvtide.telemetry import EngineTelemetry, PrometheusRecorder

    clock = ManualClock()
    cache = KVCache(CacheConfig(capacity_blocks=64, block_tokens=16), clock)
    rec = PrometheusRecorder()
    tel = EngineTelemetry(rec, cache, clock, config=DetectorConfig())
    fired = []
    for i in range(40):  # first uses only: a cold start
        cache.access([1000 + i], 16)
        fired += tel.tick()
        clock.advance(10.0)
    assert [a.name for a in fired] == ["cold_start"]
    assert len(tel.detector.signals) == 13  # 14 evaluations 30 s apart; the first has no window
    assert b'kvtide_alert_active_ratio{alert="cold_start"} 1.0' in rec.exposition()
