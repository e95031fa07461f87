"""`kvtide cost` and `kvtide calibrate`, run in-process through kvtide.cli.main."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvtide.cli import main
from kvtide.cli.cost import PROMPT_TOKENS
from kvtide.costs.calibration import load_calibration
from kvtide.costs.cost_model import Coefficients, CostModel
from kvtide.costs.specs import gpu_preset, model_preset


def test_cost_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--model", "llama-3-70b", "--gpu", "h800"]) == 0
    out = capsys.readouterr().out
    assert "KV bytes per token   327,680 (320.0 KiB)" in out
    assert "prefill throughput" in out
    assert "131,072" in out and "recompute" in out


def test_cost_writes_json(tmp_path: Path) -> None:
    path = tmp_path / "cost.json"
    assert main(["cost", "--model", "llama-3-8b", "--gpu", "h100", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert report["kv_bytes_per_token"] == 131072
    assert report["prefill_tokens_per_s"] > 0
    assert [row["prompt_tokens"] for row in report["rows"]] == list(PROMPT_TOKENS)
    assert PROMPT_TOKENS[0] == 512 and PROMPT_TOKENS[-1] == 131072
    for row in report["rows"]:
        assert set(row) >= {
            "prompt_tokens",
            "recompute_s",
            "reload_host_s",
            "reload_disk_s",
            "decision",
        }
        assert row["decision"] in {"reload", "recompute", "split"}
        assert row["reload_disk_s"] > row["reload_host_s"] > 0
    recompute = [row["recompute_s"] for row in report["rows"]]
    assert recompute == sorted(recompute)


def test_cost_options_change_the_numbers(tmp_path: Path) -> None:
    base, loaded = tmp_path / "base.json", tmp_path / "loaded.json"
    common = ["cost", "--model", "llama-3-70b", "--gpu", "h800", "--tp", "8"]
    assert main([*common, "--json", str(base)]) == 0
    assert main([*common, "--dtype", "fp8", "--link-load", "0.5", "--json", str(loaded)]) == 0
    a, b = json.loads(base.read_text()), json.loads(loaded.read_text())
    assert b["kv_bytes_per_token"] == a["kv_bytes_per_token"] // 2
    assert b["link_load"] == 0.5 and b["tp"] == 8


def test_cost_reads_a_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "num_hidden_layers": 28,
                "hidden_size": 3584,
                "num_attention_heads": 28,
                "num_key_value_heads": 4,
                "intermediate_size": 18944,
                "vocab_size": 152064,
            }
        )
    )
    assert main(["cost", "--model", str(config), "--gpu", "a100"]) == 0
    assert "KV bytes per token   57,344" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cost", "--model", "llama-9", "--gpu", "h100"], "unknown model 'llama-9'; valid: "),
        (["cost", "--model", "llama-3-8b", "--gpu", "tpu"], "unknown gpu 'tpu'; valid: a100"),
        (["cost", "--model", "llama-3-8b", "--gpu", "h100", "--tp", "5"], "does not divide"),
        (["cost", "--model", "llama-3-8b", "--gpu", "h100", "--dtype", "fp4"], "KV dtype"),
        (
            ["cost", "--model", "llama-3-8b", "--gpu", "h100", "--link-load", "1"],
            "--link-load: must be less than 1",
        ),
        (
            ["cost", "--model", "llama-3-8b", "--gpu", "h100", "--tp", "x"],
            "--tp: not a whole number, got 'x'",
        ),
        (["cost", "--gpu", "h100"], "required: --model"),
        (["cost", "--model", "llama-3-8b", "--gpu", "h100", "--bogus"], "unrecognized"),
        (
            ["cost", "--model", "llama-3-8b", "--gpu", "h100", "--calibration", "/nonexistent"],
            "cannot read",
        ),
    ],
)
def test_bad_flags_print_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own errors exit through SystemExit
        code = int(exit_.code or 0)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def write_rows(path: Path) -> None:
    truth = CostModel(
        model_preset("llama-3-8b"),
        gpu_preset("h200"),
        coefficients=Coefficients(prefill_efficiency=0.6, iteration_overhead_s=0.003),
    )
    rng = np.random.default_rng(3)
    lines = ["new_tokens,cached_tokens,seconds"]
    for new in (256, 1024, 4096):
        for cached in (0, 4096, 16384):
            seconds = truth.prefill_time(new, cached) * (1 + rng.normal(0, 0.01))
            lines.append(f"{new},{cached},{seconds!r}")
    path.write_text("\n".join(lines) + "\n")


def test_calibrate_fits_prints_the_error_and_feeds_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows, out = tmp_path / "rows.csv", tmp_path / "calibration.json"
    write_rows(rows)
    argv = ["calibrate", str(rows), "--model", "llama-3-8b", "--gpu", "h200", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "fitted 9 rows" in printed and "fit error: MAPE" in printed
    calibration = load_calibration(out)
    assert calibration.coefficients.prefill_efficiency == pytest.approx(0.6, rel=0.05)
    assert calibration.fit["prefill_rows"] == 9
    report = tmp_path / "cost.json"
    argv = ["cost", "--model", "llama-3-8b", "--gpu", "h200", "--calibration", str(out)]
    assert main([*argv, "--json", str(report)]) == 0
    assert json.loads(report.read_text())["coefficients"]["prefill_efficiency"] == pytest.approx(
        calibration.coefficients.prefill_efficiency
    )


def test_calibration_from_another_gpu_is_noted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows, out = tmp_path / "rows.csv", tmp_path / "calibration.json"
    write_rows(rows)
    main(["calibrate", str(rows), "--model", "llama-3-8b", "--gpu", "h200", "--out", str(out)])
    capsys.readouterr()
    assert main(["cost", "--model", "llama-3-8b", "--gpu", "h100", "--calibration", str(out)]) == 0
    assert "calibration measured on h200, applied to h100" in capsys.readouterr().err


def test_calibrate_names_the_bad_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = tmp_path / "rows.csv"
    rows.write_text("new_tokens,cached_tokens,seconds\n100,0,0.1\n200,zero,0.2\n")
    argv = ["calibrate", str(rows), "--model", "llama-3-8b", "--gpu", "h200", "--out"]
    assert main([*argv, str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert err == f"kvtide: error: {rows}:3: cached_tokens 'zero' is not an integer\n"
    assert not (tmp_path / "c.json").exists()


def test_calibrate_requires_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "rows.csv", "--model", "llama-3-8b", "--gpu", "h200"]) == 2
    assert "--out" in capsys.readouterr().err
