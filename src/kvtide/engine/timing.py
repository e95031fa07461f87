"""Iteration time of one engine step from the cost model: prefill chunks, a decode batch, context.

The engine never invents a time of its own: every number comes from the cost model's
``prefill_time`` and ``decode_step_time``. A run of decode-only iterations is summed in closed
form (each step reads one more token of KV per sequence, so step times form an arithmetic series
within one roofline regime), which lets the simulator advance hundreds of steps in one event.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class StepCost(Protocol):
    """The part of ``kvtide.core.cost_model.CostModel`` an engine needs (seconds)."""

    def prefill_time(self, new_tokens: int, cached_tokens: int = 0) -> float: ...

    def decode_step_time(self, batch: int, context_tokens: int) -> float: ...


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """``num_steps`` iterations whose times grow linearly: step i takes
    ``first_step_s + i * step_growth_s`` (i from 0)."""

    num_steps: int
    first_step_s: float
    step_growth_s: float = 0.0

    def elapsed_s(self, steps: int) -> float:
        """Seconds from the start of the run to the end of its ``steps``-th step."""
        return steps * self.first_step_s + self.step_growth_s * steps * (steps - 1) / 2

    @property
    def duration_s(self) -> float:
        return self.elapsed_s(self.num_steps)

    def steps_by(self, elapsed_s: float) -> int:
        """Steps finished once the step in flight at ``elapsed_s`` has finished: the boundary
        at which an engine notices something that happened at ``elapsed_s`` (at least 1)."""
        if elapsed_s <= 0.0:
            return 1
        a, b = self.step_growth_s / 2, self.first_step_s - self.step_growth_s / 2
        if a > 0.0:
            j = (-b + math.sqrt(b * b + 4 * a * elapsed_s)) / (2 * a)
        elif b > 0.0:
            j = elapsed_s / b
        else:
            return self.num_steps  # steps that take no time are all done at once
        steps = max(1, math.ceil(j - 1e-9))
        # The closed form can land one off through rounding; settle it exactly.
        while steps > 1 and self.elapsed_s(steps - 1) >= elapsed_s:
            steps -= 1
        while steps < self.num_steps and self.elapsed_s(steps) < elapsed_s:
            steps += 1
        return min(steps, self.num_steps)


class IterationTimer:
    """Seconds per engine iteration, built from a cost model.

    A mixed iteration (prefill chunks plus decodes) is compute-bound: its decode tokens cost what
    one-token prefills at their context cost, and the weights are read once, so the iteration
    takes the larger of that compute time and the decode batch's own memory-bound step time,
    plus one fixed iteration overhead.
    """

    __slots__ = ("_cost", "overhead_s")

    def __init__(self, cost: StepCost, overhead_s: float) -> None:
        self._cost = cost
        self.overhead_s = overhead_s

    @classmethod
    def from_cost_model(cls, cost: StepCost) -> IterationTimer:
        coefficients = getattr(cost, "coefficients", None)
        overhead = getattr(coefficients, "iteration_overhead_s", 0.0)
        return cls(cost, float(overhead))

    def prefill_s(self, new_tokens: int, cached_tokens: int) -> float:
        """Compute seconds of one prefill chunk, without the iteration overhead."""
        if new_tokens <= 0:
            return 0.0
        return self._cost.prefill_time(new_tokens, cached_tokens) - self.overhead_s

    def iteration_s(
        self, prefill: Sequence[tuple[int, int]], decode_batch: int, decode_context_tokens: int
    ) -> float:
        """One iteration: ``prefill`` chunks as (new, cached) tokens, and ``decode_batch``
        sequences decoding over ``decode_context_tokens`` tokens of context in total."""
        ovh = self.overhead_s
        compute = 0.0
        for new, cached in prefill:
            compute += self.prefill_s(new, cached)
        if decode_batch <= 0:
            return ovh + compute
        context = decode_context_tokens // decode_batch
        memory = self._cost.decode_step_time(decode_batch, context) - ovh
        if not prefill:
            return ovh + memory
        compute += decode_batch * self.prefill_s(1, context)
        return ovh + max(compute, memory)

    def decode_run(self, batch: int, context_tokens: int, max_steps: int) -> DecodeRun:
        """Up to ``max_steps`` decode-only iterations of ``batch`` sequences starting at
        ``context_tokens`` tokens of context in total; shortened until the step times are
        linear (one roofline regime), so the closed-form sums are exact."""
        per_seq = context_tokens // batch
        first = self._cost.decode_step_time(batch, per_seq)
        steps = max(1, max_steps)
        while steps > 1:
            last = self._cost.decode_step_time(batch, per_seq + steps - 1)
            mid_i = (steps - 1) // 2
            mid = self._cost.decode_step_time(batch, per_seq + mid_i)
            growth = (last - first) / (steps - 1)
            if abs(first + growth * mid_i - mid) <= 1e-9 + 1e-7 * first:
                return DecodeRun(steps, first, growth)
            steps //= 2
        return DecodeRun(1, first)
