"""Iteration times from a cost model, and decode runs summed in closed form."""

from __future__ import annotations

import pytest

from kvtide.engine.timing import DecodeRun, IterationTimer


class RooflineCost:
    """Prefill: 1 ms of compute per token; memory: 10 ms of weights + 1 µs per KV token.
    Decode step: memory-bound, except compute-bound below 64 tokens of context."""

    def prefill_compute_time(self, new_tokens: int, cached_tokens: int) -> float:
        return 0.001 * new_tokens

    def prefill_memory_time(self, new_tokens: int, cached_tokens: int) -> float:
        return 0.010 + 1e-6 * (new_tokens + cached_tokens)

    def decode_step_time(self, batch: int, context_tokens: int) -> float:
        memory = 0.010 + 1e-6 * batch * context_tokens
        compute = 0.0005 * batch if context_tokens < 64 else 0.0
        return 0.002 + max(memory, compute)


def test_a_decode_run_sums_growing_steps_exactly() -> None:
    run = DecodeRun(4, 0.010, 0.001)
    assert run.elapsed_s(4) == pytest.approx(0.010 + 0.011 + 0.012 + 0.013)
    assert run.duration_s == run.elapsed_s(4)
    assert run.steps_by(0.0) == 1
    assert run.steps_by(0.0105) == 2  # inside step 2: it completes first
    assert run.steps_by(0.021) == 2  # exactly at a boundary
    assert run.steps_by(1.0) == 4


def test_steps_by_holds_on_flat_runs() -> None:
    run = DecodeRun(10, 0.01)
    assert [run.steps_by(t) for t in (0.001, 0.01, 0.0100001, 0.095)] == [1, 1, 2, 10]


def test_an_iteration_is_a_roofline_over_all_its_tokens() -> None:
    timer = IterationTimer(RooflineCost(), 0.002)
    assert timer.iteration_s([(100, 0), (50, 10)], 0, 0) == pytest.approx(0.002 + 0.150)
    assert timer.iteration_s([], 4, 4000) == pytest.approx(0.002 + 0.010 + 0.004)
    # compute: 100 ms of prefill plus 4 decode tokens beats reading weights and 4,100 KV tokens
    assert timer.iteration_s([(100, 0)], 4, 4000) == pytest.approx(0.002 + 0.104)
    # 5 tokens: one read of the weights and of 10,005 KV tokens beats 5 ms of compute
    assert timer.iteration_s([(1, 10_000)], 4, 4) == pytest.approx(0.002 + 0.010 + 0.010005)


def test_a_decode_run_stops_short_of_a_roofline_kink() -> None:
    timer = IterationTimer(RooflineCost(), 0.002)
    linear = timer.decode_run(2, 2 * 100, 50)
    assert linear.num_steps == 50
    assert linear.step_growth_s == pytest.approx(2e-6)
    kinked = timer.decode_run(40, 40 * 40, 64)  # compute-bound until 64 tokens of context
    assert kinked.num_steps < 24
    assert kinked.duration_s == pytest.approx(
        sum(RooflineCost().decode_step_time(40, 40 + i) for i in range(kinked.num_steps))
    )
