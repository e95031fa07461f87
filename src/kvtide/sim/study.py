"""The coordinator study: a centralized global index against local hashing and approximate
state, under uniform and skewed traffic, fresh, stale, and with the coordinator down.

Each design is a router plus the condition of its state. The global-index designs (``precise``
and ``cost``, both fed by the engines' KV events) run fresh, stale (event lag and loss), and
with the coordinator down for the middle third of the run (its index lost, events dropped, the
router left with an empty index, and each replica resynced from a snapshot once events flow
again). ``chash`` keeps no state; ``approx`` keeps only what the router itself routed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvtide.sim.scenario import RunResult, Scenario, prepare

DEFAULT_TRAFFIC: dict[str, str] = {
    # eight equally busy tenants, each with its own system prompts: popularity is flat
    "uniform": "builtin:tenants:tenants=8,skew=0,burst_sessions=0",
    # the same tenants, Zipf(1.5) popular, the smallest one bursting half way through
    "skewed": "builtin:tenants:tenants=8,skew=1.5,burst_sessions=120",
}


@dataclass(frozen=True, slots=True)
class Design:
    name: str
    router: str
    state: str
    """"fresh", "stale", "coordinator down", or "none" / "own" for designs with no shared
    state."""
    event_delay_s: float = 0.0
    event_loss: float = 0.0
    coordinator_down: bool = False


def designs(lag_s: float, loss: float) -> list[Design]:
    stale = f"stale ({lag_s:g} s lag, {loss:.0%} loss)"
    return [
        Design("global index: precise", "precise", "fresh"),
        Design("global index: precise", "precise", stale, lag_s, loss),
        Design("global index: precise", "precise", "coordinator down", coordinator_down=True),
        Design("global index: cost", "cost", "fresh"),
        Design("global index: cost", "cost", stale, lag_s, loss),
        Design("global index: cost", "cost", "coordinator down", coordinator_down=True),
        Design("local hashing: chash", "chash", "none"),
        Design("approximate: approx", "approx", "router's own"),
    ]


@dataclass(frozen=True, slots=True)
class StudyPoint:
    traffic: str
    design: Design
    scenario: Scenario


def study_points(
    base: Scenario, traffic: dict[str, str], lag_s: float, loss: float
) -> list[StudyPoint]:
    """Every (traffic, design) scenario; the outage covers the middle third of each run."""
    points = []
    for label, workload in traffic.items():
        scenario = base.with_(workload=workload)
        span_s = float(prepare(scenario).description["span_s"])  # type: ignore[arg-type]
        for design in designs(lag_s, loss):
            outage = (span_s / 3, 2 * span_s / 3) if design.coordinator_down else None
            points.append(
                StudyPoint(
                    label,
                    design,
                    scenario.with_(
                        router=design.router,
                        event_delay_s=design.event_delay_s,
                        event_loss=design.event_loss,
                        coordinator_outage=outage,
                    ),
                )
            )
    return points


def study_rows(
    points: Sequence[StudyPoint], results: Sequence[RunResult]
) -> list[dict[str, object]]:
    """One row per point, with its losses against the fresh ``precise`` index of its traffic."""
    reference: dict[str, RunResult] = {}
    for point, result in zip(points, results, strict=True):
        if point.design.router == "precise" and point.design.state == "fresh":
            reference[point.traffic] = result
    rows = []
    for point, result in zip(points, results, strict=True):
        s = result.summary
        ref = reference.get(point.traffic)
        d = result.diagnostics
        rows.append(
            {
                "traffic": point.traffic,
                "design": point.design.name,
                "router": point.design.router,
                "state": point.design.state,
                "hit_ratio": s.hit_ratio,
                "ttft_p50_s": s.ttft_s.p50,
                "ttft_p99_s": s.ttft_s.p99,
                "load_imbalance": s.load_imbalance,
                "hit_ratio_loss_points": (
                    100 * (ref.summary.hit_ratio - s.hit_ratio) if ref is not None else None
                ),
                "ttft_p99_change": (
                    s.ttft_s.p99 / ref.summary.ttft_s.p99 - 1
                    if ref is not None and ref.summary.ttft_s.p99 > 0
                    else None
                ),
                "index_precision": d.get("index_precision"),
                "event_batches_lost": d.get("event_batches_lost", 0)
                + d.get("event_batches_lost_in_outage", 0),
                "resyncs": d.get("resyncs"),
            }
        )
    return rows
