"""The fleet simulator: the real cache, engine and routing code on a ManualClock.

``run(Scenario(...))`` replays a workload through a simulated fleet and returns a
``RunResult``; ``kvtide simulate`` is its command line.
"""

from kvtide.sim.fleet import Fleet, FleetConfig, Outage
from kvtide.sim.metrics import Percentiles, RunSummary
from kvtide.sim.scenario import PreparedWorkload, RunResult, Scenario, prepare, run

__all__ = [
    "Fleet",
    "FleetConfig",
    "Outage",
    "Percentiles",
    "PreparedWorkload",
    "RunResult",
    "RunSummary",
    "Scenario",
    "prepare",
    "run",
]
