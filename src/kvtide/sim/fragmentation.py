"""The fragmentation profile of a simulated run: ``telemetry.fragmentation`` snapshots of every
replica's pool, taken on the simulated clock and averaged over the run.

Averages are over snapshots (evenly spaced in simulated time), so a share is the share of the
pool's time spent that way, not of one instant.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from kvtide.costs.cost_model import CostModel
from kvtide.sim.fleet import Fleet
from kvtide.sim.loop import EventLoop
from kvtide.sim.scenario import PreparedWorkload, RunResult, Scenario, prepare, run
from kvtide.telemetry.fragmentation import (
    PoolSnapshot,
    block_copy_seconds,
    copy_cost_ratio,
    index_bytes,
    replication,
    snapshot,
)


@dataclass(frozen=True, slots=True)
class FragmentationReport:
    block_tokens: int
    snapshots: int
    capacity_blocks: float
    """Mean over snapshots and replicas, per replica."""
    used_share: float
    """Blocks cached or held by requests, of the capacity."""
    partial_waste_share: float
    """Unwritten slots of partly written last blocks, of the slots in use."""
    reserved_waste_share: float
    """Slots reserved ahead for generation and not written yet, of the slots in use."""
    duplicated_share: float
    """Blocks whose content another block of the same pool also holds, of the blocks in use.
    Zero by construction in this engine: a computed prompt block enters the cache when its
    chunk is scheduled, and a copy another request cached meanwhile is shared, not kept;
    generated tokens are never cached while their request runs."""
    shared_prefill_share: float
    """Prompt blocks computed while another request's copy entered the cache (the same
    uncached prefix prefilled by two requests at once), of the prompt blocks prefilled: the
    duplicates an engine that keeps both copies (vLLM v1's block pool) would hold for a
    while, here computed twice and held once."""
    free_runs_per_100_free: float
    """Runs of consecutive free ids per 100 free blocks (1 = one contiguous free region)."""
    largest_free_run_share: float
    """The largest free run, of the free blocks."""
    copy_blocks: int
    copy_runs: float
    """Runs a ``copy_blocks``-block allocation from the free list falls into, on average."""
    copy_cost_ratio: float
    """Host-tier copy seconds for those runs over one contiguous copy (the cost model)."""
    block_copy_s: float
    """One block copied alone to the host (the small-chunk ramp's floor per block)."""
    replication_factor: float
    """Mean replicas holding a cached block, at the end of the run."""
    replicated_share: float
    """Distinct cached blocks held by two or more replicas, at the end."""
    index_bytes_per_block: float
    """Prefix-index bytes in this process per cached block, at the end."""
    cached_blocks_end: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class FragmentationProbe:
    """Snapshots every replica every ``interval_s`` of simulated time from ``start_s``."""

    def __init__(
        self,
        fleet: Fleet,
        loop: EventLoop,
        start_s: float,
        interval_s: float,
        copy_blocks: int,
        model: CostModel,
    ) -> None:
        self.fleet = fleet
        self.loop = loop
        self.interval_s = interval_s
        self.copy_blocks = max(1, copy_blocks)
        self.model = model
        self._ticks: list[list[PoolSnapshot]] = []  # every replica's, per tick
        loop.at(start_s, self._tick)

    @property
    def snapshots(self) -> list[PoolSnapshot]:
        return [x for tick in self._ticks for x in tick]

    def _tick(self, _: object = None) -> None:
        self._ticks.append([snapshot(r.engine, self.copy_blocks) for r in self.fleet.replicas])
        # a run that outlasts its arrivals many times over (all of them at one instant: the
        # interval was then 5 ns, and a profile never ended) is sampled ever more sparsely,
        # and still evenly: at 4 x SNAPSHOTS ticks every other one goes and the interval
        # doubles, so the ticks kept stay on one grid and their count stays bounded
        next_s = self.interval_s
        if len(self._ticks) == 4 * SNAPSHOTS:
            self._ticks = self._ticks[::2]  # the last one dropped: the next is on the grid
            self.interval_s *= 2
        # The scenario's sampler and the fleet telemetry each keep one event on the loop while
        # anything else is left: more than those two means the run goes on.
        if len(self.loop) > 2:
            self.loop.at(self.loop.clock.now() + next_s, self._tick)

    def report(self) -> FragmentationReport:
        s = self.snapshots
        bt = self.fleet.replicas[0].cache.config.block_tokens
        caches = [r.cache for r in self.fleet.replicas if r.is_healthy]
        rep = replication(caches)
        cached_end = sum(c.num_cached_blocks for c in caches)
        index = sum(index_bytes(c) for c in caches)

        def mean(values: list[float]) -> float:
            return float(np.mean(values)) if values else 0.0

        used = [x.cached_blocks + x.private_blocks for x in s]
        shared = sum(r.engine.stats.shared_prefill_blocks for r in self.fleet.replicas)
        prefilled = sum(r.engine.stats.prefill_tokens for r in self.fleet.replicas) / bt
        slots = [max(1, u * bt) for u in used]
        copy_runs = mean([float(x.copy_runs) for x in s if x.copy_blocks])
        return FragmentationReport(
            block_tokens=bt,
            snapshots=len(s),
            capacity_blocks=mean([float(x.capacity_blocks) for x in s]),
            used_share=mean([u / max(1, x.capacity_blocks) for u, x in zip(used, s, strict=True)]),
            partial_waste_share=mean(
                [x.partial_waste_tokens / n for x, n in zip(s, slots, strict=True)]
            ),
            reserved_waste_share=mean(
                [x.reserved_waste_tokens / n for x, n in zip(s, slots, strict=True)]
            ),
            duplicated_share=mean(
                [x.duplicated_blocks / max(1, u) for x, u in zip(s, used, strict=True)]
            ),
            shared_prefill_share=shared / prefilled if prefilled else 0.0,
            free_runs_per_100_free=mean(
                [100 * x.free_runs / x.free_blocks for x in s if x.free_blocks]
            ),
            largest_free_run_share=mean(
                [x.largest_free_run / x.free_blocks for x in s if x.free_blocks]
            ),
            copy_blocks=self.copy_blocks,
            copy_runs=copy_runs,
            copy_cost_ratio=copy_cost_ratio(
                self.model, bt, self.copy_blocks, max(1, round(copy_runs))
            ),
            block_copy_s=block_copy_seconds(self.model, bt),
            replication_factor=rep.factor,
            replicated_share=rep.held_by_two_or_more / rep.distinct_blocks
            if rep.distinct_blocks
            else 0.0,
            index_bytes_per_block=index / cached_end if cached_end else 0.0,
            cached_blocks_end=cached_end,
        )


def profile(
    scenario: Scenario, prepared: PreparedWorkload | None = None
) -> tuple[RunResult, FragmentationReport]:
    """One simulated run of ``scenario`` with a fragmentation probe on every replica; the
    copy size is the mean prompt's blocks (what one request offloads to the host tier)."""
    prepared = prepared or prepare(scenario)
    bt = prepared.block_tokens
    mean_prompt = float(np.mean([r.prompt_tokens for r in prepared.requests]))
    requests = prepared.requests
    span_s = max(requests[-1].arrival_s - requests[0].arrival_s, 1e-6)
    probes: list[FragmentationProbe] = []

    def observe(fleet: Fleet, loop: EventLoop, model: CostModel) -> None:
        probes.append(
            FragmentationProbe(
                fleet,
                loop,
                requests[0].arrival_s,
                max(span_s / SNAPSHOTS, MIN_INTERVAL_S),
                round(mean_prompt / bt),
                model,
            )
        )

    result = run(scenario, prepared, observe=observe)
    return result, probes[0].report()


SNAPSHOTS = 200
"""Snapshots over the arrival span (the probe goes on while requests drain)."""
MIN_INTERVAL_S = 0.01
"""The shortest interval between snapshots (simulated): a few decode steps."""
