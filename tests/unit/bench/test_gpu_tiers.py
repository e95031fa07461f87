"""bench/gpu_tiers.py: its plain-Python parts without a GPU; a CPU smoke run with torch; the
real run on an NVIDIA GPU (marker gpu)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import gpu_tiers as gt  # bench/gpu_tiers.py: tests/conftest.py puts bench/ on sys.path
from kvtide.costs.calibration import PrefillSample, load_calibration
from kvtide.costs.cost_model import Coefficients, CostModel
from kvtide.costs.specs import gpu_preset, model_preset
from kvtide.types import Tier


def test_the_module_imports_without_torch() -> None:
    assert "torch" not in vars(gt)


def test_parse_args_defaults_and_quick(tmp_path: Path) -> None:
    config = gt.parse_args(["--out-dir", str(tmp_path)])
    assert config.device == "cuda" and config.shape == "llama-3-8b"
    assert config.prefixes == (1024, 2048, 4096, 8192, 16384, 32768)
    assert config.copy_sizes[0] == 4096 and config.copy_sizes[-1] == 256 << 20
    quick = gt.parse_args(["--out-dir", str(tmp_path), "--quick", "--prefixes", "24,40"])
    assert quick.prefixes == (24, 40) and quick.repeats == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["--device", "tpu"],
        ["--prefixes", "1k"],
        ["--prefixes", "8"],
        ["--layers", "0"],
        ["--repeats", "0"],
        ["--gpu", "b200"],
    ],
)
def test_parse_args_rejects_bad_flags(tmp_path: Path, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        gt.parse_args(["--out-dir", str(tmp_path), *argv])
    assert exit_.value.code == 2


def test_the_bench_spec_is_the_layers_alone() -> None:
    spec = gt.bench_model_spec("llama-3-8b", None)
    full = model_preset("llama-3-8b")
    assert spec.kv_bytes_per_token() == full.kv_bytes_per_token() == 131072
    assert spec.matmul_params == full.matmul_params
    assert spec.num_params == full.matmul_params + 2 * 4096  # two one-row "embeddings"
    assert gt.bench_model_spec("llama-3-8b", 4).num_layers == 4


def test_guess_gpu_from_device_names() -> None:
    assert gt.guess_gpu("NVIDIA H200") == "h200"
    assert gt.guess_gpu("NVIDIA H100 80GB HBM3") == "h100"
    assert gt.guess_gpu("NVIDIA A100-SXM4-80GB") == "a100"
    assert gt.guess_gpu("NVIDIA L40S") == "l40s"
    assert gt.guess_gpu("Tesla T4") is None


TRUE = Coefficients(
    prefill_efficiency=0.6,
    attention_coefficient=1.4,
    iteration_overhead_s=0.003,
    memory_efficiency=0.85,
    chunk_tokens=256,
)


def synthetic_measurements() -> tuple[Any, list[Any], list[PrefillSample]]:
    spec = gt.bench_model_spec("llama-3-8b", None)
    truth = CostModel(spec, gpu_preset("h200"), coefficients=TRUE)
    copies = [
        gt.CopyRow("pinned", "h2d", size, 3e-6 + size / 52e9) for size in (4096, 1 << 20, 1 << 26)
    ]
    copies.append(gt.CopyRow("pageable", "h2d", 1 << 20, 1e-4))
    config = gt.BenchConfig(out_dir=Path("unused"))
    points = [(n, p) for n in config.prefill_new for p in config.prefill_cached]
    points += [(n, 0) for n in config.memory_new]
    prefill = [PrefillSample(n, p, truth.prefill_time(n, p)) for n, p in points]
    return spec, copies, prefill


def test_calibrate_recovers_the_coefficients_behind_the_measurements() -> None:
    spec, copies, prefill = synthetic_measurements()
    gpu = gpu_preset("h200")
    calibration, stats = gt.calibrate(spec, gpu, copies, prefill, 256)
    c = calibration.coefficients
    assert c.prefill_efficiency == pytest.approx(0.6, rel=1e-6)
    assert c.attention_coefficient == pytest.approx(1.4, rel=1e-6)
    assert c.iteration_overhead_s == pytest.approx(0.003, rel=1e-6)
    assert c.memory_efficiency == pytest.approx(0.85, rel=1e-6)
    assert c.host_chunk_latency_s == pytest.approx(3e-6, rel=1e-6)
    assert c.host_link_efficiency == pytest.approx(52e9 / gpu.host_to_device_bytes_per_s)
    assert stats["prefill_max_error"] < 1e-6
    assert stats["memory_rows"] == 2
    assert calibration.model == "llama-3-8b-layers" and calibration.gpu == "h200"


def onboard_rows(cost: CostModel, error: float) -> list[Any]:
    rows = []
    for prefix in (1024, 8192):
        for plan, tokens in (("recompute", 0), ("reload", prefix), ("split", prefix - 256)):
            seconds = cost.onboard_time(prefix, tokens, 1, Tier.HOST) * (1 + error)
            rows.append(gt.OnboardRow(prefix, 1, plan, tokens, seconds))
        serial = cost.transfer_time(cost.kv_bytes(prefix), Tier.HOST) + cost.prefill_time(1, prefix)
        rows.append(gt.OnboardRow(prefix, 1, "reload_serial", prefix, serial))
    return rows


def test_prediction_rows_put_the_model_beside_each_measurement() -> None:
    spec = gt.bench_model_spec("llama-3-8b", None)
    calibrated = CostModel(spec, gpu_preset("h200"), coefficients=TRUE)
    default = CostModel(spec, gpu_preset("h200"))
    rows = gt.prediction_rows(calibrated, default, onboard_rows(calibrated, error=0.10))
    assert len(rows) == 8
    timed = [r for r in rows if r["plan"] != "reload_serial"]
    assert all(r["ratio"] == pytest.approx(1 / 1.10) for r in timed)
    assert all(r["within_band"] for r in rows)
    serial = [r for r in rows if r["plan"] == "reload_serial"]
    assert all(r["ratio"] == pytest.approx(1.0) for r in serial)
    assert rows[0]["predicted_default_s"] != rows[0]["predicted_s"]
    summary = gt.summary(rows)
    assert summary["within_band"] == 1.0
    off = gt.prediction_rows(calibrated, default, onboard_rows(calibrated, error=0.5))
    assert gt.summary(off)["within_band"] == pytest.approx(2 / 8)


def test_decision_rows_compare_the_pick_with_the_fastest_measured() -> None:
    spec = gt.bench_model_spec("llama-3-8b", None)
    cost = CostModel(spec, gpu_preset("h200"), coefficients=TRUE)
    rows = gt.decision_rows(cost, onboard_rows(cost, error=0.0), 16)
    assert [r["prefix_tokens"] for r in rows] == [1024, 8192]
    for row in rows:
        assert row["measured_fastest"] in {"recompute", "reload", "split"}
        assert row["pick_vs_fastest"] >= 1.0
        assert row["pick_vs_reload_always"] is not None


def test_planned_splits_are_block_aligned() -> None:
    spec = gt.bench_model_spec("llama-3-8b", None)
    cost = CostModel(spec, gpu_preset("h200"), coefficients=TRUE)
    splits = gt.planned_splits(cost, gt.BenchConfig(out_dir=Path("unused")))
    assert set(splits) == {1024, 2048, 4096, 8192, 16384, 32768}
    assert all(k % 16 == 0 and 0 <= k < prefix for prefix, k in splits.items())


def test_outputs_are_written_and_the_calibration_loads(tmp_path: Path) -> None:
    spec, copies, prefill = synthetic_measurements()
    calibration, _ = gt.calibrate(spec, gpu_preset("h200"), copies, prefill, 256)
    paths = gt.write_outputs(tmp_path / "out", {"accuracy": {}}, calibration)
    assert [p.name for p in paths] == ["gpu_tiers.json", "calibration.json"]
    assert json.loads(paths[0].read_text()) == {"accuracy": {}}
    loaded = load_calibration(paths[1])
    assert loaded == dataclasses.replace(calibration, fit=loaded.fit)
    CostModel(model_preset("llama-3-8b"), gpu_preset("h200"), coefficients=loaded.coefficients)


def test_format_table_aligns_columns() -> None:
    text = gt.format_table(("a", "bb"), [(1, 2.5), (1000, True)])
    assert text.splitlines() == ["    a   bb", "    1  2.5", "1,000  yes"]


def run_bench(tmp_path: Path, argv: list[str]) -> dict[str, Any]:
    assert gt.main(["--out-dir", str(tmp_path), *argv]) == 0
    report: dict[str, Any] = json.loads((tmp_path / "gpu_tiers.json").read_text())
    load_calibration(tmp_path / "calibration.json")
    return report


@pytest.mark.torch
@pytest.mark.slow  # importing torch and torch._dynamo takes seconds on shared cores
def test_cpu_smoke_run(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    argv = [
        "--device",
        "cpu",
        "--shape",
        "tiny",
        "--quick",
        "--prefixes",
        "24,40",
        "--repeats",
        "1",
    ]
    report = run_bench(tmp_path, argv)
    assert {r["plan"] for r in report["onboard"]} >= {"recompute", "reload"}
    assert len(report["decisions"]) == 2
    assert report["copies"] and report["prefill"]


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_run_end_to_end(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    report = run_bench(tmp_path, [])
    assert report["accuracy"]["within_band"] > 0
