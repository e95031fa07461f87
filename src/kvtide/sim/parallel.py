"""Runs several scenarios side by side in worker processes, reporting progress as they go.

Results come back in the order of the scenarios, whatever order the workers finish in, so the
output of a parallel run is identical to a sequential one.
"""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from kvtide.sim.scenario import RunResult, Scenario, run

Progress = Callable[[int, float], None]
"""Called with (scenario position, fraction done)."""

_progress_queue: Any = None


def _init_worker(progress_queue: Any) -> None:
    global _progress_queue
    _progress_queue = progress_queue


def _run_one(position: int, scenario: Scenario) -> RunResult:
    last = [-1.0]

    def report(fraction: float) -> None:
        if _progress_queue is not None and fraction - last[0] >= 0.01:
            last[0] = fraction
            _progress_queue.put((position, fraction))

    return run(scenario, progress=report)


def run_many(
    scenarios: Sequence[Scenario], jobs: int = 2, progress: Progress | None = None
) -> list[RunResult]:
    """Runs ``scenarios`` on up to ``jobs`` processes (in this one when ``jobs`` is 1)."""
    if jobs <= 1 or len(scenarios) <= 1:
        results = []
        for i, scenario in enumerate(scenarios):
            hook = (lambda f, i=i: progress(i, f)) if progress is not None else None
            results.append(run(scenario, progress=hook))
        return results
    ctx = multiprocessing.get_context("spawn")
    updates = ctx.Queue()
    with ProcessPoolExecutor(
        max_workers=min(jobs, len(scenarios)),
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(updates,),
    ) as pool:
        futures: list[Future[RunResult]] = [
            pool.submit(_run_one, i, s) for i, s in enumerate(scenarios)
        ]
        while not all(f.done() for f in futures):
            try:
                position, fraction = updates.get(timeout=0.1)
            except queue.Empty:
                continue
            if progress is not None:
                progress(position, fraction)
        results = [f.result() for f in futures]
    if progress is not None:
        for i in range(len(scenarios)):
            progress(i, 1.0)
    return results
