"""Runs scenarios as Ray tasks on an existing cluster (the ``kvtide[ray]`` extra): the only
module that imports ray."""

from __future__ import annotations

from collections.abc import Sequence

import ray

from kvtide.sim.scenario import RunResult, Scenario, run


def _run(scenario: Scenario) -> RunResult:
    return run(scenario)


def run_on_ray(scenarios: Sequence[Scenario], address: str | None = None) -> list[RunResult]:
    """Results in the order of ``scenarios``; ``address`` of the cluster (``auto`` finds a
    local one; ``None`` starts a throwaway local Ray)."""
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    task = ray.remote(_run)
    return list(ray.get([task.remote(s) for s in scenarios]))
