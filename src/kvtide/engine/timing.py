"""Iteration time of one engine step from the cost model: prefill chunks, a decode batch, context.

The engine never invents a time of its own: every number comes from the cost model's compute
and memory times (``prefill_compute_time``, ``prefill_memory_time``, ``decode_step_time``).
A run of decode-only iterations is summed in closed form (each step reads one more token of KV
per sequence, so step times form an arithmetic series within one roofline regime), which lets
the simulator advance hundreds of steps in one event.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class StepCost(Protocol):
    """The part of ``kvtide.costs.cost_model.CostModel`` an engine needs (seconds)."""

    def prefill_compute_time(self, new_tokens: int, cached_tokens: int) -> float:
        """FLOPs of ``new_tokens`` tokens after ``cached_tokens`` of context, in seconds."""
        ...

    def prefill_memory_time(self, new_tokens: int, cached_tokens: int) -> float:
        """Weights for ``new_tokens`` tokens plus ``cached_tokens + new_tokens`` tokens of KV,
        read once from HBM, in seconds."""
        ...

    def decode_step_time(self, batch: int, context_tokens: int) -> float:
        """One decode step of ``batch`` sequences of ``context_tokens`` each, overhead included."""
        ...


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

    One iteration is one forward pass over every token scheduled in it (prefill chunks and one
    token per decoding sequence), so it is a roofline over the whole batch: the larger of all
    tokens' FLOPs and one read of the weights plus every sequence's KV, plus one fixed
    iteration overhead. A lone chunk costs exactly the cost model's ``prefill_time``, a
    decode-only batch exactly its ``decode_step_time``.
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

    def iteration_s(
        self, prefill: Sequence[tuple[int, int]], decode_batch: int, decode_context_tokens: int
    ) -> float:
        """One iteration: ``prefill`` chunks as (new, cached) tokens, and ``decode_batch``
        sequences decoding over ``decode_context_tokens`` tokens of context in total (each
        step's new token included)."""
        cost = self._cost
        if not prefill:
            if decode_batch <= 0:
                return 0.0
            return cost.decode_step_time(decode_batch, decode_context_tokens // decode_batch)
        compute = 0.0
        tokens = kv = 0
        for new, cached in prefill:
            compute += cost.prefill_compute_time(new, cached)
            tokens += new
            kv += new + cached
        if decode_batch > 0:
            # Attention FLOPs are linear in the context, so the mean context prices them all.
            context = decode_context_tokens // decode_batch
            compute += decode_batch * cost.prefill_compute_time(1, max(context - 1, 0))
            tokens += decode_batch
            kv += decode_context_tokens
        memory = cost.prefill_memory_time(tokens, kv - tokens)
        return self.overhead_s + max(compute, memory)

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
