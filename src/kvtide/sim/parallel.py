"""Runs several scenarios side by side in worker processes, reporting progress as they go.

Results come back in the order of the scenarios, whatever order the workers finish in, so the
output of a parallel run is identical to a sequential one.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
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
    # The workers start with SIGINT blocked (a spawned process keeps its parent's signal
    # mask): a terminal's Ctrl-C goes to the whole process group, and each worker printed a
    # KeyboardInterrupt traceback of its own. The parent, whose Ctrl-C waits while blocked
    # and arrives once the workers are started, stops them instead.
    pool: ProcessPoolExecutor | None = None
    try:
        with _sigint_blocked():
            pool = ProcessPoolExecutor(
                max_workers=min(jobs, len(scenarios)),
                mp_context=ctx,
                initializer=_init_worker,
                initargs=(updates,),
            )
            futures: list[Future[RunResult]] = [
                pool.submit(_run_one, i, s) for i, s in enumerate(scenarios)
            ]
        # (a Ctrl-C that waited while blocked arrives here)
        while not all(f.done() for f in futures):
            try:
                position, fraction = updates.get(timeout=0.1)
            except queue.Empty:
                continue
            if progress is not None:
                progress(position, fraction)
        results = [f.result() for f in futures]
    except BaseException:  # Ctrl-C, or a worker's error: no worker outlives the run
        for child in multiprocessing.active_children():
            child.terminate()
        if pool is not None:
            pool.shutdown(cancel_futures=True)  # its manager thread sees them end, and ends
        raise
    pool.shutdown()
    if progress is not None:
        for i in range(len(scenarios)):
            progress(i, 1.0)
    return results


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread while the block starts processes, which keep it
    blocked, and held off in this process: the kernel may hand a Ctrl-C to another thread
    (a progress display's), whose Python handler would raise it here mid-spawn, leaving a
    worker half started (its own traceback). One that arrives meanwhile is raised when the
    block ends. From the main thread only (the only one that may set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt
