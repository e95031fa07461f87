"""`kvtide study coordinator` and `kvtide study tiers` in-process on tiny workloads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtide.cli import main


def test_the_coordinator_study_compares_every_design(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "study.json"
    argv = [
        "study",
        "coordinator",
        "--uniform",
        "builtin:tenants:tenants=4,sessions=12,skew=0,burst_sessions=0",
        "--skewed",
        "builtin:tenants:tenants=4,sessions=12,skew=1.5,burst_sessions=6",
        "--replicas",
        "3",
        "--quiet",
        "--jobs",
        "1",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert len(rows) == 16
    assert {r["traffic"] for r in rows} == {"uniform", "skewed"}
    assert {r["router"] for r in rows} == {"precise", "cost", "chash", "approx"}
    fresh = [r for r in rows if r["router"] == "precise" and r["state"] == "fresh"]
    assert all(r["hit_ratio_loss_points"] == 0.0 for r in fresh)
    down = [r for r in rows if r["state"] == "coordinator down"]
    assert all(r["event_batches_lost"] > 0 for r in down)
    printed = capsys.readouterr().out
    assert "uniform traffic" in printed and "skewed traffic" in printed


def test_the_tier_study_runs_each_size_filtered_and_over_a_disk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tiers.json"
    argv = [
        "study",
        "tiers",
        "--workload",
        "builtin:chat:sessions=40,turns=4,duration_s=120,think_s=20",
        "--replicas",
        "2",
        "--gpu-cache-tokens",
        "8Ki",
        "--host-multiples",
        "0,4",
        "--disk-multiple",
        "16",
        "--quiet",
        "--jobs",
        "1",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    rows = {r["design"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == [
        "GPU only",
        "host 4×",
        "host 4× (seen-twice)",
        "host 4× + disk 16×",
        "host 4× + disk 16× (seen-twice)",
    ]
    gpu, host, filtered = rows["GPU only"], rows["host 4×"], rows["host 4× (seen-twice)"]
    assert gpu["host_tokens"] == 0 and gpu["host_writes_blocks"] == 0
    assert host["host_tokens"] == 4 * 8192 and host["host_writes_blocks"] > 0
    assert host["hit_ratio_by_tier"]["host"] > 0 and host["hit_ratio"] > gpu["hit_ratio"]
    assert filtered["admission"] == "seen-twice"
    assert 0 < filtered["filter_write_cut"] < 1
    assert filtered["host_writes_blocks"] < host["host_writes_blocks"]
    assert filtered["filter_hit_loss_points"] == pytest.approx(
        100 * (host["hit_ratio"] - filtered["hit_ratio"])
    )
    disk = rows["host 4× + disk 16× (seen-twice)"]
    assert disk["disk_tokens"] == 16 * 8192 and disk["disk_writes_blocks"] > 0
    assert host["filter_write_cut"] is None
    printed = capsys.readouterr().out
    assert "tier study" in printed and "fewer host writes" in printed


def test_the_tier_study_rejects_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["study", "tiers", "--host-multiples", "1,x", "--quiet"]) == 2
    assert main(["study", "tiers", "--host-multiples", "-1", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("kvtide: error:") for line in err)


def test_a_time_scale_replaces_the_commands_default_load() -> None:
    """`study coordinator` defaults to a load; a time scale the user gives takes its place,
    both given is the one-line error, and simulate's built-in default load gives way too."""
    from kvtide.cli import build_parser
    from kvtide.cli.simulate import scenario_from_args
    from kvtide.errors import ConfigError

    parser = build_parser()
    study = parser.parse_args(["study", "coordinator", "--time-scale", "2"])
    scenario = scenario_from_args(study.__class__(**{**vars(study), "workload": "builtin:chat"}))
    assert (scenario.load, scenario.time_scale) == (None, 2.0)
    both = parser.parse_args(["study", "coordinator", "--time-scale", "2", "--load", "0.5"])
    with pytest.raises(ConfigError, match="--load and --time-scale"):
        scenario_from_args(both.__class__(**{**vars(both), "workload": "builtin:chat"}))
    plain = parser.parse_args(["simulate", "--workload", "builtin:chat", "--time-scale", "1"])
    assert scenario_from_args(plain).load is None  # the pace the user asked for: the trace's
    default = parser.parse_args(["simulate", "--workload", "builtin:chat"])
    assert scenario_from_args(default).load is not None
