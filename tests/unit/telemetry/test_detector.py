"""The early-warning detector, and the Prometheus rules held to it by promtool."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from kvtide.cli import main
from kvtide.telemetry import DetectorConfig, EarlyWarning, MemoryRecorder, Sample
from kvtide.telemetry import metrics as m
from kvtide.telemetry.detector import Signals, run_detector
from kvtide.telemetry.rules import Scenario, Step, _samples, _scenarios

PROMTOOL = shutil.which("promtool")
CONFIG = DetectorConfig()


def run(name: str, config: DetectorConfig = CONFIG) -> EarlyWarning:
    scenario = next(s for s in _scenarios(config) if s.name == name)
    detector = EarlyWarning(config, MemoryRecorder(), log=False)
    for sample in _samples(scenario, config):
        detector.update(sample)
    return detector


def test_a_rising_regret_ratio_with_steady_arrivals_flags_an_undersized_pool() -> None:
    d = run("undersized")
    assert [a.name for a in d.history] == ["pool_undersized"]
    alert = d.history[0]
    change_s = 2 * CONFIG.slow_s
    # The condition holds from the first evaluation whose fast window shows the rise.
    assert change_s < alert.time_s <= change_s + CONFIG.fast_s + CONFIG.for_s
    assert f"of the prefill work over the last {CONFIG.fast_s:.0f}s, up from 2.0%" in alert.reason
    # In the fast window: 50 cold tokens per step against 100, then 500, evicted ones.
    assert 50 / 550 < alert.values["cold_share"] < 50 / 150
    rec = d.recorder
    assert isinstance(rec, MemoryRecorder)
    assert rec.value(m.ALERT_FIRED, ("pool_undersized",)) == 1


def test_an_alert_holds_on_its_clearing_threshold_hysteresis() -> None:
    """The regret ratio climbs fast, then slowly: 2-3 points over its baseline, under the
    firing threshold and over the clearing one. With hysteresis the alert stays one episode."""
    d = run("wavering")
    assert [a.name for a in d.history] == ["pool_undersized"]
    held = [
        g
        for g in d.signals
        if d.history[0].time_s < g.time_s
        and CONFIG.clear_regret_rise <= g.regret_fast - g.regret_slow < CONFIG.min_regret_rise
    ]
    assert len(held) >= 8
    assert "pool_undersized" in d.active  # still firing at the end
    no_hysteresis = DetectorConfig(clear_regret_rise=CONFIG.min_regret_rise)
    assert not run("wavering", no_hysteresis).active  # it would have cleared


def test_rising_prompt_tokens_with_steady_arrivals_are_not_an_undersized_pool() -> None:
    """Longer prompts at the same request rate grow the working set: more regret is then the
    load's doing, and the load is not steady (the prompt-token rate is checked too)."""
    base = next(s for s in _scenarios(CONFIG) if s.name == "undersized")
    warm_at = int(2 * CONFIG.slow_s / CONFIG.interval_s)

    def longer(i: int) -> Step:
        lookups, prompt, *rest = base.step(i)
        return (lookups, prompt * (1.5 if i >= warm_at else 1.0), *rest)  # type: ignore[return-value]

    samples = _samples(Scenario("longer", base.steps, longer), CONFIG)
    assert run_detector(samples, CONFIG).history == []
    loose = DetectorConfig(steady_tolerance=0.6)  # lets a +50 % prompt-token rate pass
    assert [a.name for a in run_detector(samples, loose).history] == ["pool_undersized"]


def test_no_reason_prints_nan_when_a_window_has_no_prefill_work() -> None:
    """At a cold start the fast window is not covered yet (and an idle window has no prompt
    tokens): the undefined shares read "n/a", not "nan%"."""
    d = EarlyWarning(log=False)
    g = Signals.empty(300.0)
    g = dataclasses.replace(g, arrivals_fast=1.0, cold_share=1.0)
    reasons = d.conditions(g)
    assert reasons["cold_start"] is not None
    assert "nan" not in reasons["cold_start"] and "n/a of the prefill work" in reasons["cold_start"]
    fired = run("cold_start").history
    assert fired and all("nan" not in a.reason for a in fired)


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


def test_private_blocks_growing_in_an_undersized_pool_are_not_called_fragmentation() -> None:
    """The pool turns undersized, then its private blocks grow (requests queue with their
    prompt room reserved): the growth meets the fragmentation condition, but the alert does
    not start while pool_undersized fires: one root cause, one alert."""
    d = run("undersized_then_private")
    assert [a.name for a in d.history] == ["pool_undersized"]
    late = d.signals[-1]
    assert late.private_fast >= CONFIG.private_factor * late.private_slow
    assert d.conditions(late)["fragmentation"] is not None  # it would, on its own


def test_blocks_leaving_sooner_with_lost_reuses_flag_an_undersized_pool() -> None:
    """Blocks leave the pool twice as fast for the same traffic (its residence, in prompt
    tokens, halves) while a few more evicted blocks are wanted again, too few for the regret
    threshold: the residence signal fires alone, and says so."""
    d = run("shorter_stay")
    assert [a.name for a in d.history] == ["pool_undersized"]
    alert = d.history[0]
    fast, slow = alert.values["residence_fast"], alert.values["residence_slow"]
    assert slow > fast
    said = f"a cached block stays while {fast:,.0f} prompt tokens arrive, {1 - fast / slow:.0%}"
    assert said in alert.reason
    assert alert.values["regret_fast"] - alert.values["regret_slow"] < CONFIG.min_regret_rise
    without = DetectorConfig(residence_drop=0.9, clear_residence_drop=0.9)
    assert run("shorter_stay", without).history == []


def test_blocks_leaving_sooner_without_lost_reuses_raise_nothing() -> None:
    """The same shorter stay in a pool none of whose evicted blocks is wanted again (reuses
    seconds apart, which any pool serves): no alert."""
    assert run("shorter_stay_harmless").history == []


def test_residence_is_per_prompt_token_so_more_traffic_is_not_a_shorter_stay() -> None:
    """Twice the arrivals evict twice the blocks per second from the same pool: per prompt
    token a block stays as long, so the residence signal does not fire."""
    g = EarlyWarning(log=False)
    for i in range(200):
        rate = 2.0 if i >= 120 else 1.0
        g.update(
            Sample(
                i * 30.0,
                i * 10 * rate,
                i * 10_000 * rate,
                0,
                i * 100,
                i * 20 * rate,
                900,
                800,
                1000,
                i * 5000 * rate,
            )
        )
    late = g.signals[-1]
    assert late.residence_fast == pytest.approx(late.residence_slow, rel=0.2)


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
@pytest.mark.parametrize(
    ("flag", "value", "scenario"),
    [
        ("--max-cold-share", "0.05", None),
        ("--clear-regret-rise", "0.03", "wavering"),
        ("--residence-drop", "0.6", "shorter_stay"),
    ],
)
def test_promtool_fails_rules_that_disagree_with_the_detector(
    tmp_path: Path, flag: str, value: str, scenario: str | None
) -> None:
    """The unit tests can fail: rules with a looser threshold fire where the detector does
    not; rules without hysteresis clear where the detector holds."""
    assert PROMTOOL is not None
    rules, tests = tmp_path / "rules.yml", tmp_path / "rules_test.yml"
    assert main(["alerts", "--out", str(rules), "--tests", str(tests)]) == 0
    assert main(["alerts", "--out", str(rules), flag, value]) == 0
    proc = subprocess.run(
        [PROMTOOL, "test", "rules", str(tests)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    if scenario is not None:
        assert f"name: {scenario}," in proc.stdout + proc.stderr


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
    assert "nan" not in fired[0].reason  # its fast window is not covered yet
    assert len(tel.detector.signals) == 13  # 14 evaluations 30 s apart; the first has no window
    assert b'kvtide_alert_active_ratio{alert="cold_start"} 1.0' in rec.exposition()
