"""Calibration: recovering known coefficients, CSV errors by line, the calibration file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvtide.costs.calibration import (
    Calibration,
    PrefillSample,
    calibrate,
    fit_prefill,
    fit_transfer,
    load_calibration,
    parse_prefill_csv,
    read_prefill_csv,
)
from kvtide.costs.cost_model import Coefficients, CostModel
from kvtide.costs.specs import gpu_preset, model_preset
from kvtide.errors import ConfigError, TraceFormatError

TRUE = Coefficients(prefill_efficiency=0.62, attention_coefficient=1.7, iteration_overhead_s=0.004)


def synthetic_rows(noise: float, seed: int = 7) -> list[PrefillSample]:
    truth = CostModel(model_preset("llama-3-8b"), gpu_preset("h200"), coefficients=TRUE)
    rng = np.random.default_rng(seed)
    rows = []
    for new in (128, 512, 1024, 2048, 4096, 8192):
        for cached in (0, 1024, 8192, 32768):
            seconds = truth.prefill_time(new, cached) * (1 + rng.normal(0, noise))
            rows.append(PrefillSample(new, cached, seconds))
    return rows


def start() -> CostModel:
    return CostModel(model_preset("llama-3-8b"), gpu_preset("h200"))


def test_calibrate_recovers_known_coefficients_from_noisy_rows() -> None:
    fit = fit_prefill(start(), synthetic_rows(noise=0.02))
    c = fit.coefficients
    assert c.prefill_efficiency == pytest.approx(0.62, rel=0.05)
    assert c.attention_coefficient == pytest.approx(1.7, rel=0.10)
    assert c.iteration_overhead_s == pytest.approx(0.004, rel=0.10)
    assert fit.error.num_rows == 24
    assert 0.005 < fit.error.mape < 0.03  # about the 2% noise
    assert fit.error.max_error < 0.08


def test_calibrate_is_exact_without_noise() -> None:
    fit = fit_prefill(start(), synthetic_rows(noise=0.0))
    assert fit.coefficients.prefill_efficiency == pytest.approx(0.62, rel=1e-9)
    assert fit.coefficients.attention_coefficient == pytest.approx(1.7, rel=1e-9)
    assert fit.coefficients.iteration_overhead_s == pytest.approx(0.004, rel=1e-9)
    assert fit.error.max_error < 1e-9


def test_calibrate_keeps_terms_non_negative() -> None:
    # Times that shrink with context would need a negative attention term: it is dropped.
    rows = [PrefillSample(n, p, 1e-4 * n - 1e-9 * p) for n in (100, 200, 400) for p in (0, 1000)]
    fit = fit_prefill(start(), rows)
    assert fit.coefficients.attention_coefficient >= 0
    assert fit.coefficients.iteration_overhead_s >= 0


def test_calibrate_needs_rows_that_separate_the_terms() -> None:
    with pytest.raises(ConfigError, match="at least 3 rows"):
        fit_prefill(start(), [PrefillSample(10, 0, 1.0)])
    with pytest.raises(ConfigError, match="must vary new_tokens"):
        fit_prefill(start(), [PrefillSample(4096, 0, 1.0)] * 5)
    with pytest.raises(ConfigError, match="at least 3 compute-bound rows, got 0"):
        fit_prefill(start(), [PrefillSample(n, 0, 1e-3) for n in (1, 2, 4)])


def test_memory_bound_rows_are_reported_but_not_fitted() -> None:
    truth = CostModel(model_preset("llama-3-8b"), gpu_preset("h200"), coefficients=TRUE)
    small = [PrefillSample(n, 0, truth.prefill_time(n, 0)) for n in (1, 4, 16)]
    assert all(
        truth.prefill_memory_time(r.new_tokens, 0) > truth.prefill_compute_time(r.new_tokens, 0)
        for r in small
    )
    fit = fit_prefill(start(), synthetic_rows(noise=0.0) + small)
    assert fit.coefficients.prefill_efficiency == pytest.approx(0.62, rel=1e-9)
    assert fit.error.num_rows == 27
    assert fit.error.max_error < 1e-9


def test_fit_transfer_recovers_latency_and_rate() -> None:
    rows = [(size, 5e-6 + size / 50e9) for size in (4096, 65536, 1 << 20, 1 << 24)]
    fit = fit_transfer(rows)
    assert fit.latency_s == pytest.approx(5e-6, rel=1e-6)
    assert fit.bytes_per_s == pytest.approx(50e9, rel=1e-6)
    with pytest.raises(ConfigError, match="at least 2 sizes"):
        fit_transfer([(4096, 1e-5)])


CSV = """new_tokens,cached_tokens,seconds
# a comment
512,0,0.05

1024,2048,0.11
"""


def test_csv_rows_parse() -> None:
    rows = parse_prefill_csv(CSV.splitlines(keepends=True), "rows.csv")
    assert rows == [PrefillSample(512, 0, 0.05), PrefillSample(1024, 2048, 0.11)]


def test_csv_columns_may_come_in_any_order_with_extras() -> None:
    text = "seconds,gpu,new_tokens,cached_tokens\n0.5,h200,100,0\n"
    assert parse_prefill_csv(text.splitlines(), "x.csv") == [PrefillSample(100, 0, 0.5)]


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("new_tokens,cached_tokens,seconds\n512,0,0.05\n1024,x,0.1\n", 3, "cached_tokens 'x'"),
        ("new_tokens,cached_tokens,seconds\n512,0\n", 2, "expected 3 fields"),
        ("new_tokens,cached_tokens,seconds\n0,0,0.1\n", 2, "new_tokens must be >= 1"),
        ("new_tokens,cached_tokens,seconds\n5,0,-1\n", 2, "seconds must be positive"),
        ("new_tokens,cached_tokens,seconds\n5,0,nan\n", 2, "seconds must be positive"),
        ("new_tokens,seconds\n5,0.1\n", 1, "header lacks column 'cached_tokens'"),
        ("", 1, "empty file"),
    ],
)
def test_bad_csv_lines_are_named(text: str, line: int, problem: str) -> None:
    with pytest.raises(TraceFormatError) as error:
        parse_prefill_csv(text.splitlines(keepends=True), "rows.csv")
    assert error.value.line == line
    assert problem in error.value.problem
    assert str(error.value).startswith(f"rows.csv:{line}: ")


def test_reading_a_missing_csv_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        read_prefill_csv(tmp_path / "absent.csv")
    path = tmp_path / "rows.csv"
    path.write_text(CSV)
    assert len(read_prefill_csv(path)) == 2


def test_calibration_file_round_trips_and_loads_into_a_cost_model(tmp_path: Path) -> None:
    calibration = Calibration(TRUE, "llama-3-8b", "h200", 1, {"prefill_mape": 0.01})
    path = tmp_path / "calibration.json"
    path.write_text(calibration.to_json())
    loaded = load_calibration(path)
    assert loaded == calibration
    cost = CostModel(
        model_preset("llama-3-8b"), gpu_preset("h200"), coefficients=loaded.coefficients
    )
    assert cost.coefficients.prefill_efficiency == 0.62


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not valid JSON"),
        ('{"kvtide_calibration": 2}', "not a kvtide calibration file"),
        ('{"kvtide_calibration": 1, "model": "m", "gpu": "g"}', "'coefficients' must be"),
        (
            '{"kvtide_calibration": 1, "model": "m", "gpu": "g", "coefficients": {"x": 1}}',
            "unknown coefficient 'x'",
        ),
        (
            '{"kvtide_calibration": 1, "model": "m", "gpu": "g", "tp": 0, "coefficients": {}}',
            "'tp' must be",
        ),
    ],
)
def test_bad_calibration_files_are_config_errors(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "calibration.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=problem):
        load_calibration(path)


def test_calibrate_returns_a_calibrated_cost_model() -> None:
    cost, fit = calibrate(start(), synthetic_rows(noise=0.0))
    assert cost.coefficients == fit.coefficients
    assert cost.coefficients.prefill_efficiency == pytest.approx(0.62, rel=1e-9)
    assert cost.model == start().model
