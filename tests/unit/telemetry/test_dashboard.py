"""The shipped Grafana dashboard: generated from the declarations, every metric on a panel."""

from __future__ import annotations

import json
from pathlib import Path

from kvtide.telemetry import metrics as m
from kvtide.telemetry.dashboard import dashboard, render

SHIPPED = Path(__file__).resolve().parents[3] / "dashboards" / "kvtide.json"


def test_shipped_dashboard_is_the_generated_one() -> None:
    assert SHIPPED.read_text() == render()


def test_every_metric_is_on_a_panel() -> None:
    exprs = " ".join(t["expr"] for p in dashboard()["panels"] for t in p["targets"])
    for metric in m.ALL:
        assert metric.name in exprs, metric.name
    ids = [p["id"] for p in json.loads(render())["panels"]]
    assert len(set(ids)) == len(ids)
