"""The shipped Grafana dashboard: generated from the declarations, every metric on a panel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtide.telemetry import metrics as m
from kvtide.telemetry.dashboard import dashboard, main, render

SHIPPED = Path(__file__).resolve().parents[3] / "dashboards" / "kvtide.json"


def test_shipped_dashboard_is_the_generated_one() -> None:
    assert SHIPPED.read_text() == render()


def test_every_metric_is_on_a_panel() -> None:
    exprs = " ".join(t["expr"] for p in dashboard()["panels"] for t in p["targets"])
    for metric in m.ALL:
        assert metric.name in exprs, metric.name
    ids = [p["id"] for p in json.loads(render())["panels"]]
    assert len(set(ids)) == len(ids)


def test_the_generator_takes_help_as_help_not_as_the_file_to_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["--help"]) == 0 and "usage:" in capsys.readouterr().out
    assert main(["--out"]) == 2 and "usage:" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert main(["board.json"]) == 0
    assert (tmp_path / "board.json").read_text() == render()
