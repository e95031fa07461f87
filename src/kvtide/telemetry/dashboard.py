"""The Grafana dashboard of kvtide's metrics (``dashboards/kvtide.json`` is this, written out).

Each panel plots PromQL over the declared metrics only (no recording rules), filtered by the
``$instance`` variable, so it works on any Prometheus that scrapes kvtide's engines, gateway
or simulator. ``python -m kvtide.telemetry.dashboard FILE`` rewrites the shipped file.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from kvtide.telemetry import metrics as m

SEL = 'instance=~"$instance"'
# `kvtide serve`'s own families (kvtide.gateway.metrics declares them; telemetry does not
# import the gateway): tests/unit/gateway/test_metrics_on_dashboard.py checks the names
GATEWAY_REQUESTS = "kvtide_gateway_requests_total"
GATEWAY_FIRST_BYTE = "kvtide_gateway_first_byte_seconds"
GATEWAY_OVERHEAD = "kvtide_gateway_overhead_seconds"
GATEWAY_IN_FLIGHT = "kvtide_gateway_replica_in_flight"
GATEWAY_QUEUED = "kvtide_gateway_queued"
GATEWAY_TENANT_TOKENS = "kvtide_gateway_tenant_tokens_total"
GATEWAY_METRICS = (
    GATEWAY_REQUESTS,
    GATEWAY_FIRST_BYTE,
    GATEWAY_OVERHEAD,
    GATEWAY_IN_FLIGHT,
    GATEWAY_QUEUED,
    GATEWAY_TENANT_TOKENS,
)
DEVICE = 'tier="device"'
CACHED_KIND = 'kind="cached"'
PROMPT_KIND = 'kind="prompt"'
EVICTED = 'cause="evicted"'


def _q(metric: m.Metric | str, extra: str = "") -> str:
    inner = ", ".join(x for x in (extra, SEL) if x)
    return f"{_name(metric)}{{{inner}}}"


def _name(metric: m.Metric | str) -> str:
    return metric if isinstance(metric, str) else metric.name


def _quantiles(metric: m.Metric | str) -> list[tuple[str, str]]:
    bucket = f"{_name(metric)}_bucket{{{SEL}}}"
    return [
        (f"p{int(q * 100)}", f"histogram_quantile({q}, sum by (le) (rate({bucket}[5m])))")
        for q in (0.5, 0.9, 0.99)
    ]


PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    # (title, unit, [(legend, expr)])
    (
        "Hit ratio by tier",
        "percentunit",
        [
            (
                "{{tier}}",
                f"sum by (tier) (rate({_q(m.HIT_TOKENS)}[5m])) / ignoring(tier) group_left "
                f"sum(rate({_q(m.PROMPT_TOKENS)}[5m]))",
            )
        ],
    ),
    ("Lookups by tier", "reqps", [("{{tier}}", f"sum by (tier) (rate({_q(m.LOOKUPS)}[5m]))")]),
    (
        "Missed tokens by cause",
        "short",
        [("{{cause}}", f"sum by (cause) (rate({_q(m.MISS_TOKENS)}[5m]))")],
    ),
    (
        "Eviction velocity by tier (blocks/s)",
        "short",
        [("{{tier}}", f"sum by (tier) (rate({_q(m.EVICTED_BLOCKS)}[1m]))")],
    ),
    (
        "Block churn per prompt token",
        "short",
        [
            (
                "allocations",
                f"sum(rate({_q(m.ALLOCATED_BLOCKS)}[5m])) / sum(rate({_q(m.PROMPT_TOKENS)}[5m]))",
            ),
            (
                "frees",
                f"sum(rate({_q(m.FREED_BLOCKS)}[5m])) / sum(rate({_q(m.PROMPT_TOKENS)}[5m]))",
            ),
        ],
    ),
    ("Block lifetime", "s", _quantiles(m.BLOCK_LIFETIME)),
    ("Idle time before eviction", "s", _quantiles(m.BLOCK_IDLE)),
    ("Reuse gap", "s", _quantiles(m.BLOCK_REUSE_GAP)),
    (
        "Occupancy",
        "percentunit",
        [
            (
                "cached {{tier}}",
                f"sum by (tier) ({_q(m.CACHED_BLOCKS)}) / sum by (tier) ({_q(m.CAPACITY_BLOCKS)})",
            ),
            (
                "used (device)",
                f"sum({_q(m.USED_BLOCKS)}) / sum({_q(m.CAPACITY_BLOCKS, DEVICE)})",
            ),
            ("pinned", f"avg({_q(m.PINNED_RATIO)})"),
        ],
    ),
    (
        "Occupancy by tenant (blocks)",
        "short",
        [("{{tenant}}", f"sum by (tenant) ({_q(m.TENANT_CACHED_BLOCKS)})")],
    ),
    (
        "Hit ratio by tenant",
        "percentunit",
        [
            (
                "{{tenant}}",
                f"sum by (tenant) (rate({_q(m.TENANT_HIT_TOKENS)}[5m])) / sum by (tenant) "
                f"(rate({_q(m.TENANT_PROMPT_TOKENS)}[5m]))",
            )
        ],
    ),
    (
        "Early warning: evicted-then-wanted share of prompt tokens",
        "percentunit",
        [
            (
                "last 2m",
                f"sum(increase({_q(m.MISS_TOKENS, EVICTED)}[2m])) / "
                f"sum(increase({_q(m.PROMPT_TOKENS)}[2m]))",
            ),
            (
                "30m baseline",
                f"sum(increase({_q(m.MISS_TOKENS, EVICTED)}[30m] offset 2m)) / "
                f"sum(increase({_q(m.PROMPT_TOKENS)}[30m] offset 2m))",
            ),
        ],
    ),
    (
        "Early warning: residence (prompt tokens that arrive while a cached block stays)",
        "short",
        [
            (
                "last 5m",
                f"sum({_q(m.CACHED_BLOCKS, DEVICE)}) / (sum(rate({_q(m.EVICTED_BLOCKS, DEVICE)}"
                f"[5m])) / sum(rate({_q(m.PROMPT_TOKENS)}[5m])))",
            )
        ],
    ),
    (
        "Alerts",
        "short",
        [
            ("firing {{alert}}", f"max by (alert) ({_q(m.ALERT_ACTIVE)})"),
            ("raised {{alert}} /h", f"sum by (alert) (increase({_q(m.ALERT_FIRED)}[1h]))"),
        ],
    ),
    (
        "Router index staleness",
        "s",
        [("latest", f"max({_q(m.INDEX_LAG)})"), ("worst", f"max({_q(m.INDEX_MAX_LAG)})")],
    ),
    (
        "KV events lost and resyncs",
        "short",
        [
            ("batches lost/s", f"sum(rate({_q(m.EVENTS_LOST)}[5m]))"),
            ("resyncs/s", f"sum(rate({_q(m.RESYNCS)}[5m]))"),
        ],
    ),
    (
        "Routing regret",
        "short",
        [
            ("predicted tokens/s", f"sum(rate({_q(m.PREDICTED_TOKENS)}[5m]))"),
            ("reported tokens/s", f"sum(rate({_q(m.REPORTED_TOKENS)}[5m]))"),
            ("regret tokens/s", f"sum(rate({_q(m.REGRET_TOKENS)}[5m]))"),
            (
                "evicted while queued tokens/s",
                f"sum(rate({_q(m.EVICTED_QUEUED_TOKENS)}[5m]))",
            ),
        ],
    ),
    ("Prefix replication factor", "short", [("replicas", f"max({_q(m.REPLICATION)})")]),
    (
        "Engine prefill pace (over the routing model)",
        "short",
        [("pace", f"max({_q(m.PREFILL_PACE)})")],
    ),
    (
        "Gateway requests by status",
        "reqps",
        [("{{status}}", f"sum by (status) (rate({_q(GATEWAY_REQUESTS)}[5m]))")],
    ),
    ("Gateway time to first byte", "s", _quantiles(GATEWAY_FIRST_BYTE)),
    ("Gateway's own time (arrival to the engine)", "s", _quantiles(GATEWAY_OVERHEAD)),
    (
        "Gateway requests in flight and queued",
        "short",
        [
            ("{{replica}}", f"sum by (replica) ({_q(GATEWAY_IN_FLIGHT)})"),
            ("queued at the gateway", f"sum({_q(GATEWAY_QUEUED)})"),
        ],
    ),
    (
        "Engine prefix-cache hits by tenant (gateway)",
        "percentunit",
        [
            (
                "{{tenant}}",
                f"sum by (tenant) (rate({_q(GATEWAY_TENANT_TOKENS, CACHED_KIND)}[5m]))"
                f" / sum by (tenant) (rate({_q(GATEWAY_TENANT_TOKENS, PROMPT_KIND)}[5m]))",
            )
        ],
    ),
    (
        "Tokens by tenant (gateway)",
        "short",
        [
            (
                "{{tenant}} {{kind}}",
                f"sum by (tenant, kind) (rate({_q(GATEWAY_TENANT_TOKENS)}[5m]))",
            )
        ],
    ),
]


def dashboard() -> dict[str, Any]:
    panels = []
    for i, (title, unit, targets) in enumerate(PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [
                    {"refId": chr(ord("A") + j), "expr": expr, "legendFormat": legend}
                    for j, (legend, expr) in enumerate(targets)
                ],
            }
        )
    return {
        "title": "kvtide: KV cache",
        "uid": "kvtide-cache",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "tags": ["kvtide"],
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {
                    "name": "instance",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": f"label_values({m.PROMPT_TOKENS.name}, instance)",
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "current": {"text": "All", "value": "$__all"},
                },
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


USAGE = "usage: python -m kvtide.telemetry.dashboard FILE  (writes the Grafana dashboard JSON)"


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(argv) != 1 or argv[0].startswith("-"):  # a flag is never the file to write
        print(USAGE, file=sys.stderr)
        return 2
    with open(argv[0], "w", encoding="utf-8") as out:
        out.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
