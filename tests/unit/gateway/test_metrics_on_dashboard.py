"""The shipped dashboard's gateway panels plot families `kvtide serve` declares, under the
names it declares them (telemetry names them as strings: it does not import the gateway)."""

from __future__ import annotations

from kvtide.gateway.metrics import GatewayMetrics
from kvtide.telemetry.dashboard import GATEWAY_METRICS, dashboard


def test_every_gateway_family_on_the_dashboard_is_declared_by_the_gateway() -> None:
    declared = {family.name for family in GatewayMetrics().registry.collect()}
    # prometheus_client drops a counter's _total from the family name
    declared |= {f"{name}_total" for name in declared}
    exprs = " ".join(t["expr"] for p in dashboard()["panels"] for t in p["targets"])
    for name in GATEWAY_METRICS:
        assert name in declared, name
        assert name in exprs, name
