"""A scenario (workload, fleet, model, router) and running it to a result.

``prepare`` reads the workload once and fixes its time scale (``load`` turns into one);
``run`` builds the fleet on a fresh ManualClock and replays the requests through it. Both are
pure functions of the scenario: the same scenario gives the same result, in any process.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig
from kvtide.core.hashing import BlockHashes
from kvtide.costs.cost_model import CostModel, network_transfer_s
from kvtide.costs.memory import memory_fit
from kvtide.costs.specs import gpu_preset, resolve_model
from kvtide.display import tokens
from kvtide.engine.scheduler import EngineConfig
from kvtide.engine.timing import IterationTimer
from kvtide.errors import ConfigError
from kvtide.routing import GlobalPrefixIndex, RoutingContext
from kvtide.routing.identity import RequestHasher
from kvtide.routing.specs import build_policy, needs_index, parse_router
from kvtide.sim.fleet import Fleet, FleetConfig, Outage
from kvtide.sim.loop import EventLoop
from kvtide.sim.metrics import RunSummary, TimeSeries
from kvtide.sim.settings import check_pools
from kvtide.sim.telemetry import FleetTelemetry, PoolShrink, TelemetryResult
from kvtide.telemetry.detector import DetectorConfig
from kvtide.types import Request
from kvtide.workloads import open_workload
from kvtide.workloads.oversized import OversizedRequests

DEFAULT_EVICTION: str = next(
    f.default for f in dataclasses.fields(CacheConfig) if f.name == "policy"
)  # type: ignore[assignment]
"""The cache core's default eviction policy."""
NUM_WINDOWS = 120
"""Time-series windows per run: a run keeps between this many and twice as many samples."""
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
        deadline_k = parse_router(self.router)[1].get("deadline_k")
        if deadline_k and self.engine.scheduling_policy != "priority":
            # the engines would ignore the priorities the router sets: say so, not a silent no-op
            raise ConfigError(
                f"router {self.router!r} sets the engines' queue order (deadline_k), but they "
                f"schedule {self.engine.scheduling_policy}: add --scheduling-policy priority "
                "(scheduling_policy: priority in a sweep)"
            )

    def with_(self, **changes: object) -> Scenario:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class PreparedWorkload:
    """A workload read into memory at its final time scale."""

    requests: tuple[Request, ...]
    block_tokens: int
    description: dict[str, object]
    skipped: tuple[str, ...] = ()
    """One line per request left out for being longer than a replica's whole KV pool."""


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
    block_tokens = scenario.block_tokens or workload.block_tokens
    pool_tokens = scenario.gpu_cache_tokens // block_tokens * block_tokens
    oversized = OversizedRequests(
        pool_tokens, block_tokens, True, f"GPU cache of {pool_tokens:,} tokens per replica"
    )
    requests = tuple(r for i, r in enumerate(workload) if oversized.keep(i, r))
    skipped = tuple(oversized.report(workload))
    if not requests:
        if skipped:
            example = skipped[0].removesuffix("; skipped")
            raise ConfigError(f"every request is too long, as the first: {example}")
        raise ConfigError(f"workload {scenario.workload} has no requests")
    span_s = requests[-1].arrival_s - requests[0].arrival_s
    model = cost_model(scenario)
    work_s = sum(model.prefill_time(r.prompt_tokens) for r in requests)
    offered = work_s / (scenario.replicas * span_s) if span_s > 0 else float("inf")
    time_scale = scenario.time_scale
    if scenario.load is not None:
        if span_s <= 0:
            raise ConfigError(
                f"load (--load) {scenario.load:g}: every request of {scenario.workload} "
                "arrives at one instant, so there is no pace to rescale; leave the load out"
            )
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
    description["skipped_requests"] = len(oversized.skipped)
    return PreparedWorkload(requests, block_tokens, description, skipped)


def check_scenario(
    scenario: Scenario, name_of: Callable[[str], str], *, kv_given: bool = True
) -> list[str]:
    """What can be checked before a run, without reading the workload: outages of replicas
    that exist, pools the simulator can hold, weights and KV that fit the GPUs. Raises a
    ConfigError naming the setting (``name_of(key)``: a flag or a YAML key); returns warnings.

    A KV pool that does not fit beside the weights is an error when it is the default
    (``kv_given`` false) and a warning when the user asked for it: they may mean it."""
    for outage in scenario.outages:
        if outage.replica >= scenario.replicas:
            raise ConfigError(
                f"{name_of('outages')}: replica {outage.replica} does not exist (the fleet has "
                f"replicas 0 to {scenario.replicas - 1})"
            )
    block_tokens = scenario.block_tokens or open_workload(scenario.workload).block_tokens
    check_pools(
        {
            "gpu_cache_tokens": scenario.gpu_cache_tokens,
            "host_cache_tokens": scenario.host_cache_tokens,
            "disk_cache_tokens": scenario.disk_cache_tokens,
        },
        block_tokens,
        name_of,
    )
    fit = memory_fit(cost_model(scenario), scenario.gpu_cache_tokens)
    if not fit.weights_fit:
        raise ConfigError(
            f"{name_of('model')}: {fit.describe()}: the weights alone do not fit; raise "
            f"{name_of('tp')}"
        )
    if fit.fits:
        return []
    problem = (
        f"{name_of('gpu_cache_tokens')}: {fit.describe()}: the KV pool does not fit beside "
        f"the weights (at most {fit.max_kv_tokens:,} tokens)"
    )
    if not kv_given:
        raise ConfigError(f"{problem}; give a smaller {name_of('gpu_cache_tokens')}")
    return [f"{problem}; simulated as given"]


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
        "scheduling_policy": scenario.engine.scheduling_policy,
        "prefill_only": scenario.engine.prefill_only,
        "seed": scenario.seed,
    }


def describe_tiers(scenario: Scenario) -> str:
    """Every KV tier of a replica with its size: ``GPU 256k tokens + host 1M tokens
    (seen-twice) + disk 4M tokens``; run headers and reports name them all."""
    parts = [f"GPU {tokens(scenario.gpu_cache_tokens)}"]
    if scenario.host_cache_tokens:
        admission = scenario.host_admission
        filtered = f" ({admission})" if admission != "none" else ""
        parts.append(f"host {tokens(scenario.host_cache_tokens)}{filtered}")
    if scenario.disk_cache_tokens:
        parts.append(f"disk {tokens(scenario.disk_cache_tokens)}")
    return " + ".join(parts)


def _check_shrink(
    shrink: PoolShrink, capacity_blocks: int, block_tokens: int, requests: Sequence[Request]
) -> None:
    """A shrunk pool must still hold the longest request (prompt and output), or its engine
    would refuse it mid-run: say so before running."""
    left = capacity_blocks - shrink.steps * round(capacity_blocks * shrink.step_fraction)
    longest = max(requests, key=lambda r: r.prompt_tokens + max(1, r.output_tokens))
    need = -(-(longest.prompt_tokens + max(1, longest.output_tokens)) // block_tokens)
    if need > left:
        raise ConfigError(
            f"pool shrink: {shrink.steps} steps of {shrink.step_fraction:g} leave {left:,} "
            f"blocks per replica, and request {longest.request_id} needs {need:,}"
        )


def run(
    scenario: Scenario,
    prepared: PreparedWorkload | None = None,
    progress: Callable[[float], None] | None = None,
    *,
    detector: DetectorConfig | None = None,
    shrink: PoolShrink | None = None,
    observe: Callable[[Fleet, EventLoop, CostModel], None] | None = None,
) -> RunResult:
    """Replays the scenario's workload through a fresh fleet; ``progress`` gets the fraction
    of the arrival span simulated so far. ``detector`` configures the early warning run on the
    fleet's telemetry; ``shrink`` takes device memory away from every replica step by step;
    ``observe`` is called once the fleet exists, before the first event (a probe's hook)."""
    prepared = prepared or prepare(scenario)
    requests = prepared.requests
    block_tokens = prepared.block_tokens
    model = cost_model(scenario)
    clock = ManualClock(requests[0].arrival_s)
    loop = EventLoop(clock)
    hash_request = RequestHasher(block_tokens, scenario.model)
    observed: list[FleetTelemetry] = []  # set once the fleet exists

    def hasher(request: Request) -> BlockHashes:
        hashes = hash_request(request)
        for telemetry in observed:
            telemetry.routed(hashes)
        return hashes

    capacity_blocks = scenario.gpu_cache_tokens // block_tokens
    if shrink is not None:
        _check_shrink(shrink, capacity_blocks, block_tokens, requests)
    span_s = requests[-1].arrival_s - requests[0].arrival_s
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
        sample_interval_s=expected_duration_s(scenario, requests, model) / NUM_WINDOWS,
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
    sampler = _Sampler(
        fleet, loop, config.sample_interval_s, requests[0].arrival_s, max(span_s, 1e-9)
    )
    sampler.progress = progress
    sampler.start()
    telemetry.start()
    if observe is not None:
        observe(fleet, loop, model)
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
        {**_diagnostics(fleet), "skipped_requests": len(prepared.skipped)},
        telemetry.result(),
    )


def expected_duration_s(scenario: Scenario, requests: Sequence[Request], model: CostModel) -> float:
    """A first guess at the simulated seconds, to size the sampling interval: the arrival
    span, or the prefill work spread over the replicas when that is longer (all requests at
    one instant have no span at all). The sampler widens its interval if the run outlasts it."""
    span_s = requests[-1].arrival_s - requests[0].arrival_s
    work_s = sum(model.prefill_time(r.prompt_tokens) for r in requests) / scenario.replicas
    return max(span_s, work_s, 1e-3)


def _shifted(window: tuple[float, float] | None, start_s: float) -> tuple[float, float] | None:
    return None if window is None else (window[0] + start_s, window[1] + start_s)


def _diagnostics(fleet: Fleet) -> dict[str, float]:
    health = fleet.router.health.summary()
    out: dict[str, float] = {
        "index_precision": health.precision,
        "index_recall": health.recall,
        "regret_tokens": health.regret_tokens,
        "evicted_queued_tokens": health.evicted_queued_tokens,
        # the engines' prefill seconds over the TTFT model's, as the router learned it (1.0
        # until it has; cache-blind policies estimate no TTFT to learn from)
        "prefill_pace": fleet.router.pace.factor if fleet.router.pace is not None else 1.0,
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
    """Samples the fleet's counters every ``interval_s`` while anything is left to happen.

    The interval is a guess (``expected_duration_s``); a run that outlasts it would tick
    without bound, so at ``2 * NUM_WINDOWS`` samples the sampler drops every other one and
    doubles its interval. The samples are cumulative counters, so dropping one merges two
    windows exactly; a run samples O(NUM_WINDOWS * log(duration / guess)) times."""

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
        samples = self.fleet.metrics.samples
        samples.append(self.fleet.sample())
        if len(samples) >= 2 * NUM_WINDOWS:
            del samples[1::2]  # keeps the first (the run's start) and every other one
            self.interval_s *= 2
        if self.progress is not None:
            self.progress(min(1.0, (self.loop.clock.now() - self.start_s) / self.span_s))
        if len(self.loop):  # something else is still scheduled
            self.loop.at(self.loop.clock.now() + self.interval_s, self._tick)
