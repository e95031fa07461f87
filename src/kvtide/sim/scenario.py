"""A scenario (workload, fleet, model, router) and running it to a result.

``prepare`` reads the workload once and fixes its time scale (``load`` turns into one);
``run`` builds the fleet on a fresh ManualClock and replays the requests through it. Both are
pure functions of the scenario: the same scenario gives the same result, in any process.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig
from kvtide.core.hashing import BlockHashes, Namespace, request_block_hashes
from kvtide.costs.cost_model import CostModel
from kvtide.costs.specs import gpu_preset, resolve_model
from kvtide.engine.scheduler import EngineConfig
from kvtide.engine.timing import IterationTimer
from kvtide.errors import ConfigError
from kvtide.routing import GlobalPrefixIndex, RoutingContext
from kvtide.sim.fleet import Fleet, FleetConfig, Outage
from kvtide.sim.loop import EventLoop
from kvtide.sim.metrics import RunSummary, TimeSeries
from kvtide.sim.policies import build_policy, needs_index
from kvtide.sim.telemetry import FleetTelemetry, PoolShrink, TelemetryResult
from kvtide.telemetry.detector import DetectorConfig
from kvtide.types import Request
from kvtide.workloads import open_workload

DEFAULT_EVICTION: str = next(
    f.default for f in dataclasses.fields(CacheConfig) if f.name == "policy"
)  # type: ignore[assignment]
"""The cache core's default eviction policy."""
NUM_WINDOWS = 120
"""Time-series windows per run."""
NUM_CDF_POINTS = 200


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything a simulated run depends on. Token sizes are totals per replica."""

    workload: str = "builtin:mixed"
    requests: int | None = None
    block_tokens: int | None = None
    """Cache block size; the workload's native size when ``None``."""
    time_scale: float = 1.0
    load: float | None = None
    """Offered prefill work (no hits) as a fraction of the fleet's prefill capacity; replaces
    ``time_scale``."""
    seed: int = 0
    model: str = "llama-3-8b"
    gpu: str = "h100"
    tp: int = 1
    replicas: int = 4
    router: str = "round_robin"
    eviction: str = DEFAULT_EVICTION
    gpu_cache_tokens: int = 262_144
    host_cache_tokens: int = 0
    host_admission: str = "none"
    """Filter on writes into the host tier (``kvtide.core.admission``: none, seen-twice)."""
    disk_cache_tokens: int = 0
    event_delay_s: float = 0.0
    event_loss: float = 0.0
    outages: tuple[Outage, ...] = ()
    coordinator_outage: tuple[float, float] | None = None
    """(start, end) seconds, relative to the first arrival, when the index is down."""
    decode_replicas: int = 0
    kv_transfer: bool = False
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self) -> None:
        if self.load is not None and not self.load > 0:
            raise ConfigError(f"load must be positive, got {self.load}")
        if self.load is not None and self.time_scale != 1.0:
            raise ConfigError("give either a load or a time scale, not both")
        if self.gpu_cache_tokens < 1:
            raise ConfigError("the GPU cache needs at least one token")
        if self.host_cache_tokens < 0:
            raise ConfigError("the host cache size must be >= 0")
        if self.disk_cache_tokens < 0:
            raise ConfigError("the disk cache size must be >= 0")

    def with_(self, **changes: object) -> Scenario:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class PreparedWorkload:
    """A workload read into memory at its final time scale."""

    requests: tuple[Request, ...]
    block_tokens: int
    description: dict[str, object]


@dataclass(frozen=True, slots=True)
class RunResult:
    summary: RunSummary
    series: TimeSeries
    ttft_cdf_s: list[float]
    """TTFT quantiles at evenly spaced probabilities (for the CDF plot)."""
    num_events: int
    unserved: int
    simulated_s: float
    """Simulated seconds from the first arrival to the last event."""
    diagnostics: dict[str, float] = field(default_factory=dict)
    """Index health and event-channel counters (routing regret, losses, resyncs)."""
    telemetry: TelemetryResult | None = None
    """The cache metrics over time and the early warning's alerts (``sim.telemetry``)."""


def cost_model(scenario: Scenario) -> CostModel:
    return CostModel(resolve_model(scenario.model), gpu_preset(scenario.gpu), tp=scenario.tp)


def prepare(scenario: Scenario) -> PreparedWorkload:
    """Reads the workload; with ``load`` set, rescales arrivals so that the prefill work it
    offers (every prompt computed from scratch) is ``load`` of the prefill replicas' time."""
    workload = open_workload(
        scenario.workload,
        block_tokens=scenario.block_tokens,
        limit=scenario.requests,
        time_scale=scenario.time_scale,
        seed=scenario.seed,
    )
    requests = tuple(workload)
    if not requests:
        raise ConfigError(f"workload {scenario.workload} has no requests")
    block_tokens = scenario.block_tokens or workload.block_tokens
    span_s = requests[-1].arrival_s - requests[0].arrival_s
    model = cost_model(scenario)
    work_s = sum(model.prefill_time(r.prompt_tokens) for r in requests)
    offered = work_s / (scenario.replicas * span_s) if span_s > 0 else float("inf")
    time_scale = scenario.time_scale
    if scenario.load is not None:
        if span_s <= 0:
            raise ConfigError("a load needs a workload whose requests arrive over time")
        factor = offered / scenario.load
        time_scale *= factor
        first = requests[0].arrival_s
        requests = tuple(
            dataclasses.replace(r, arrival_s=first + (r.arrival_s - first) * factor)
            for r in requests
        )
        span_s *= factor
        offered = scenario.load
    description: dict[str, object] = {
        **workload.description,
        "requests": len(requests),
        "span_s": span_s,
        "time_scale": time_scale,
        "offered_load": offered,
        "prompt_tokens_mean": float(np.mean([r.prompt_tokens for r in requests])),
        "output_tokens_mean": float(np.mean([r.output_tokens for r in requests])),
        "block_tokens": block_tokens,
    }
    return PreparedWorkload(requests, block_tokens, description)


def describe_setup(scenario: Scenario) -> dict[str, object]:
    """The fleet side of a scenario, for reports (the router and eviction are per run)."""
    return {
        "model": scenario.model,
        "gpu": scenario.gpu,
        "tp": scenario.tp,
        "replicas": scenario.replicas,
        "decode_replicas": scenario.decode_replicas,
        "kv_transfer": scenario.kv_transfer,
        "gpu_cache_tokens": scenario.gpu_cache_tokens,
        "host_cache_tokens": scenario.host_cache_tokens,
        "host_admission": scenario.host_admission,
        "disk_cache_tokens": scenario.disk_cache_tokens,
        "event_delay_s": scenario.event_delay_s,
        "event_loss": scenario.event_loss,
        "outages": [dataclasses.asdict(o) for o in scenario.outages],
        "coordinator_outage": scenario.coordinator_outage,
        "max_batched_tokens": scenario.engine.max_batched_tokens,
        "prefill_only": scenario.engine.prefill_only,
        "seed": scenario.seed,
    }


def network_transfer_s(model: CostModel, tokens: int) -> float:
    """Seconds to ship ``tokens`` tokens of KV between two instances over their NICs (each
    tensor-parallel rank sends its shard over its own NIC share, in parallel)."""
    return model.kv_bytes(tokens) / (model.gpu.network_bytes_per_s * model.tp)


def run(
    scenario: Scenario,
    prepared: PreparedWorkload | None = None,
    progress: Callable[[float], None] | None = None,
    *,
    detector: DetectorConfig | None = None,
    shrink: PoolShrink | None = None,
) -> RunResult:
    """Replays the scenario's workload through a fresh fleet; ``progress`` gets the fraction
    of the arrival span simulated so far. ``detector`` configures the early warning run on the
    fleet's telemetry; ``shrink`` takes device memory away from every replica step by step."""
    prepared = prepared or prepare(scenario)
    requests = prepared.requests
    block_tokens = prepared.block_tokens
    model = cost_model(scenario)
    clock = ManualClock(requests[0].arrival_s)
    loop = EventLoop(clock)
    seed = Namespace(model=scenario.model).seed

    observed: list[FleetTelemetry] = []  # set once the fleet exists

    def hasher(request: Request) -> BlockHashes:
        hashes = request_block_hashes(request, block_tokens, seed)
        for telemetry in observed:
            telemetry.routed(hashes)
        return hashes

    capacity_blocks = scenario.gpu_cache_tokens // block_tokens
    span_s = max(requests[-1].arrival_s - requests[0].arrival_s, 1e-9)
    config = FleetConfig(
        num_replicas=scenario.replicas,
        capacity_blocks=capacity_blocks,
        block_tokens=block_tokens,
        eviction=scenario.eviction,
        engine=scenario.engine,
        event_delay_s=scenario.event_delay_s,
        event_loss=scenario.event_loss,
        num_decode_replicas=scenario.decode_replicas,
        kv_transfer=scenario.kv_transfer,
        host_capacity_blocks=scenario.host_cache_tokens // block_tokens,
        host_admission=scenario.host_admission,
        disk_capacity_blocks=scenario.disk_cache_tokens // block_tokens,
        coordinator_outage=_shifted(scenario.coordinator_outage, requests[0].arrival_s),
        outages=tuple(
            dataclasses.replace(
                o,
                start_s=o.start_s + requests[0].arrival_s,
                end_s=None if o.end_s is None else o.end_s + requests[0].arrival_s,
            )
            for o in scenario.outages
        ),
        sample_interval_s=span_s / NUM_WINDOWS,
    )
    index = (
        GlobalPrefixIndex(scenario.replicas * capacity_blocks)
        if needs_index(scenario.router)
        else None
    )
    ctx = RoutingContext(
        block_tokens=block_tokens,
        clock=clock,
        rng=random.Random(scenario.seed),
        index=index,
        ttft_model=model,
    )
    policy = build_policy(scenario.router, ctx)
    fleet = Fleet(
        config,
        policy,
        index,
        IterationTimer.from_cost_model(model),
        loop,
        hasher=hasher,
        rng=random.Random(scenario.seed + 1),
        health=ctx.health,
        transfer_s=lambda tokens: network_transfer_s(model, tokens),
        recompute_s=model.prefill_compute_time,
        tier_cost=model,
    )
    telemetry = FleetTelemetry(fleet, loop, requests[0].arrival_s, detector, shrink)
    observed.append(telemetry)
    feed = _Feed(iter(requests), fleet, loop)
    feed.schedule_next()
    sampler = _Sampler(fleet, loop, config.sample_interval_s, requests[0].arrival_s, span_s)
    sampler.progress = progress
    sampler.start()
    telemetry.start()
    loop.run()
    fleet.metrics.sample(fleet.sample())
    summary = fleet.metrics.summarize(
        router=scenario.router,
        eviction=scenario.eviction,
        busy_s=fleet.busy_s,
        evicted_blocks=fleet.evicted_blocks,
        hit_tokens_by_tier=fleet.hit_tokens_by_tier,
    )
    ttft = np.sort([r.first_token_s - r.arrival_s for r in fleet.metrics.records])
    cdf = np.quantile(ttft, np.linspace(0, 1, NUM_CDF_POINTS)).tolist() if ttft.size else []
    if progress is not None:
        progress(1.0)
    return RunResult(
        summary,
        fleet.metrics.series(),
        cdf,
        loop.num_events,
        len(fleet.unserved),
        clock.now() - requests[0].arrival_s,
        _diagnostics(fleet),
        telemetry.result(),
    )


def _shifted(window: tuple[float, float] | None, start_s: float) -> tuple[float, float] | None:
    return None if window is None else (window[0] + start_s, window[1] + start_s)


def _diagnostics(fleet: Fleet) -> dict[str, float]:
    health = fleet.router.health.summary()
    out: dict[str, float] = {
        "index_precision": health.precision,
        "index_recall": health.recall,
        "regret_tokens": health.regret_tokens,
        "event_batches_sent": fleet.channel.counters.sent,
        "event_batches_lost": fleet.channel.counters.dropped,
        "event_batches_lost_in_outage": fleet.num_batches_lost_in_outage,
        "gaps": health.gaps,
        "resyncs": health.resyncs,
        "max_lag_s": health.max_lag_s,
        "preemptions": sum(r.engine.stats.num_preemptions for r in fleet.replicas),
        "block_tokens": fleet.config.block_tokens,
    }
    for tier, blocks in fleet.written_blocks_by_tier().items():
        out[f"{tier}_writes_blocks"] = blocks
    for reason, count in sorted(fleet.route_reasons.items()):
        out[f"route_{reason}"] = count
    return out


class _Feed:
    """Puts one arrival at a time on the loop (the heap never holds the whole trace)."""

    __slots__ = ("fleet", "loop", "requests")

    def __init__(self, requests: Iterator[Request], fleet: Fleet, loop: EventLoop) -> None:
        self.requests = requests
        self.fleet = fleet
        self.loop = loop

    def schedule_next(self) -> None:
        request = next(self.requests, None)
        if request is not None:
            self.loop.at(request.arrival_s, self._arrive, request)

    def _arrive(self, request: Request) -> None:
        self.fleet.submit(request)
        self.schedule_next()


class _Sampler:
    """Samples the fleet's counters every ``interval_s`` while anything is left to happen."""

    __slots__ = ("fleet", "interval_s", "loop", "progress", "span_s", "start_s")

    def __init__(
        self, fleet: Fleet, loop: EventLoop, interval_s: float, start_s: float, span_s: float
    ) -> None:
        self.fleet = fleet
        self.loop = loop
        self.interval_s = interval_s
        self.start_s = start_s
        self.span_s = span_s
        self.progress: Callable[[float], None] | None = None

    def start(self) -> None:
        self.loop.at(self.start_s, self._tick)

    def _tick(self, _: object = None) -> None:
        self.fleet.metrics.sample(self.fleet.sample())
        if self.progress is not None:
            self.progress(min(1.0, (self.loop.clock.now() - self.start_s) / self.span_s))
        if len(self.loop):  # something else is still scheduled
            self.loop.at(self.loop.clock.now() + self.interval_s, self._tick)
