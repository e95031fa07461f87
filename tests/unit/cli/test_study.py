"""`kvtide study coordinator` in-process on tiny workloads."""

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
