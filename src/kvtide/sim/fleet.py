"""N engine replicas behind a routing policy, on one event loop.

The fleet routes each arriving request through ``routing.Router`` with the real policy object,
runs each replica's ``Scheduler`` through its ``EngineDriver`` (a decode-only run is one event,
cut short when a new request arrives), sends the replicas' KV events to the router's index through
the routing package's delayed, lossy channel and sequenced ingest, takes replicas (and the
index's coordinator) down and up at given times, and samples counters for the time series.
Options: a host tier per replica (``core.tiers``), a global KV pool over the peers' caches,
and disaggregation (the routed replicas only prefill; each request then moves, after its KV
transfer, to the least busy decode replica).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.hashing import BlockHashes
from kvtide.core.tiers import OnboardCost, TieredCache, TieredCacheConfig, TierSpec
from kvtide.engine.driver import EngineDriver
from kvtide.engine.prefix_source import NO_FETCH, Fetch
from kvtide.engine.scheduler import EngineConfig, RequestRecord, Scheduler
from kvtide.engine.timing import IterationTimer
from kvtide.errors import ConfigError, NoHealthyReplica
from kvtide.routing import (
    IndexHealth,
    IndexStore,
    ReplicaState,
    RouteDecision,
    RouteRequest,
    RoutingPolicy,
)
from kvtide.routing.faults import LossyDelayedChannel
from kvtide.routing.identity import route_request
from kvtide.routing.ingest import KVEventIngest, snapshot_events
from kvtide.routing.router import Router
from kvtide.sim.loop import EventLoop
from kvtide.sim.metrics import FleetSample, MetricsCollector
from kvtide.types import Request, Tier


@dataclass(frozen=True, slots=True)
class Outage:
    """Replica ``replica`` (its index) is down from ``start_s`` until ``end_s`` (forever if
    ``None``): its requests are re-routed and its cache is lost."""

    replica: int
    start_s: float
    end_s: float | None = None


@dataclass(frozen=True, slots=True)
class FleetConfig:
    num_replicas: int
    capacity_blocks: int
    block_tokens: int
    eviction: str = "lru"
    """Every tier's eviction policy."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    event_delay_s: float = 0.0
    """Seconds from a cache change to the router's index learning of it."""
    event_loss: float = 0.0
    """Probability that a batch of KV events never reaches the router (below 1); the
    router's ingest notices the sequence gap at the next batch and resyncs the replica."""
    outages: tuple[Outage, ...] = ()
    num_decode_replicas: int = 0
    coordinator_outage: tuple[float, float] | None = None
    """(start, end) seconds during which the index's coordinator is down: its state is lost
    at the start and events sent meanwhile are lost, so the router sees an empty index; the
    first batch after the end reveals the gap and the replica is resynced from a snapshot."""
    host_capacity_blocks: int = 0
    """A host-memory tier per replica under the device (0: none), written back on eviction
    and reloaded as the cost model decides (``kvtide.core.tiers``)."""
    host_admission: str = "none"
    disk_capacity_blocks: int = 0
    """A disk tier per replica under the host (or the device), written to as the host is."""
    kv_transfer: bool = False
    """A global KV pool: a replica fetches a longer prefix held by another replica over the
    network when that beats recomputing it (Mooncake's store)."""
    sample_interval_s: float = 10.0
    classify_misses: bool = True
    """Remember evicted hashes (4x the capacity) so that a miss on a block evicted and wanted
    again is told from a cold one: the early warning's main signal."""

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ConfigError("a fleet needs at least one replica")
        if self.event_delay_s < 0 or not 0.0 <= self.event_loss < 1.0:
            raise ConfigError("event delay must be >= 0 and event loss within [0, 1)")
        if self.num_decode_replicas < 0:
            raise ConfigError("decode replicas must be >= 0")
        if self.sample_interval_s <= 0:
            raise ConfigError("the sample interval must be positive")
        for outage in self.outages:
            if not 0 <= outage.replica < self.num_replicas:
                raise ConfigError(f"outage of replica {outage.replica}: no such replica")
            if outage.end_s is not None and outage.end_s < outage.start_s:
                raise ConfigError("an outage must end after it starts")
        if self.host_capacity_blocks < 0 or self.disk_capacity_blocks < 0:
            raise ConfigError("a host or disk tier's capacity must be >= 0")


def config_ghost(config: FleetConfig) -> int | None:
    """``CacheConfig.ghost_blocks`` for the fleet's caches: the default memory, or none."""
    return None if config.classify_misses else 0


@dataclass(frozen=True, slots=True)
class _Flight:
    """A routed request the router has not heard the end of."""

    route: RouteRequest
    decision: RouteDecision


class Replica:
    """One engine, its cache and its drive loop, plus the wake-up scheduled for it."""

    __slots__ = (
        "cache",
        "caches",
        "driver",
        "engine",
        "generation",
        "index",
        "is_healthy",
        "state",
        "up_since_s",
        "wake_s",
    )

    def __init__(self, index: int, engine: Scheduler, cache: KVCache) -> None:
        self.index = index
        self.engine = engine
        # Only first tokens and finishes: a decode run stays one event.
        self.driver = EngineDriver(engine, stream_tokens=False)
        self.cache = cache  # the device tier
        tiers = engine.tiers
        self.caches = list(tiers.caches.values()) if tiers is not None else [cache]
        self.state = ReplicaState(
            f"r{index}",
            capacity_blocks=cache.capacity_blocks,
            block_tokens=cache.config.block_tokens,
        )
        self.is_healthy = True
        self.up_since_s = 0.0  # events published before this are from a previous life
        self.wake_s: float | None = None  # when the scheduled wake-up fires
        self.generation = 0  # bumps invalidate a scheduled wake-up


class PeerCaches:
    """The other replicas' caches seen as one global KV pool (Mooncake's store): the longest
    prefix any healthy peer holds in any tier, fetched over the network when that beats
    recomputing it."""

    __slots__ = ("block_tokens", "me", "recompute_s", "replicas", "transfer_s")

    def __init__(
        self,
        replicas: Sequence[Replica],
        me: Replica,
        transfer_s: Callable[[int], float],
        recompute_s: Callable[[int, int], float],
    ) -> None:
        self.replicas = replicas
        self.me = me
        self.transfer_s = transfer_s
        self.recompute_s = recompute_s
        self.block_tokens = me.cache.config.block_tokens

    def fetch(self, hashes: BlockHashes, local_blocks: int) -> Fetch:
        best = local_blocks
        for peer in self.replicas:
            if peer is self.me or not peer.is_healthy:
                continue
            for cache in peer.caches:  # its device, then its host memory
                held = cache.match(hashes, touch=False).num_blocks
                if held > best:
                    best = held
        if best == local_blocks:
            return NO_FETCH
        tokens = (best - local_blocks) * self.block_tokens
        seconds = self.transfer_s(tokens)
        if seconds >= self.recompute_s(tokens, local_blocks * self.block_tokens):
            return NO_FETCH
        return Fetch(best - local_blocks, seconds)


class Fleet:
    """Replicas, the router in front of them, and the event channel between them.

    ``policy`` is a routing policy object from ``kvtide.routing``; ``index`` the index its
    context reads (``None`` for cache-blind and self-contained policies), fed through the
    routing package's own lossy, delayed channel and sequenced ingest. ``health`` receives
    the cached tokens each engine really reused, so routing regret is measured.
    """

    def __init__(
        self,
        config: FleetConfig,
        policy: RoutingPolicy,
        index: IndexStore | None,
        timer: IterationTimer,
        loop: EventLoop,
        *,
        hasher: Callable[[Request], BlockHashes],
        rng: random.Random,
        health: IndexHealth | None = None,
        transfer_s: Callable[[int], float] = lambda tokens: 0.0,
        recompute_s: Callable[[int, int], float] = lambda new, cached: 0.0,
        tier_cost: OnboardCost | None = None,
    ) -> None:
        self.config = config
        self.tier_cost = tier_cost
        self.index = index
        self.loop = loop
        self.clock: ManualClock = loop.clock
        self.hasher = hasher
        self.transfer_s = transfer_s
        self.metrics = MetricsCollector()
        self.unserved: list[Request] = []
        prefill_engine = config.engine
        if config.num_decode_replicas:
            prefill_engine = dataclasses.replace(prefill_engine, prefill_only=True)
        self.replicas = [
            self._make_replica(i, prefill_engine, timer, is_routed=True)
            for i in range(config.num_replicas)
        ]
        self.decoders = [
            self._make_replica(config.num_replicas + i, config.engine, timer, is_routed=False)
            for i in range(config.num_decode_replicas)
        ]
        if config.kv_transfer:
            for replica in self.replicas:
                replica.engine.source = PeerCaches(self.replicas, replica, transfer_s, recompute_s)
        self.router = Router(policy, [r.state for r in self.replicas], health)
        self.channel = LossyDelayedChannel(
            rng, delay_s=config.event_delay_s, loss_prob=config.event_loss
        )
        self.ingest = (
            KVEventIngest(index, self.clock, self.router.health) if index is not None else None
        )
        self._by_id = {r.state.replica_id: r for r in self.replicas}
        self._flights: dict[str, _Flight] = {}
        self.route_reasons: dict[str, int] = {}  # decisions by the branch the policy took
        self._prefill_records: dict[str, RequestRecord] = {}
        self._requests_by_id: dict[str, Request] = {}
        for outage in config.outages:
            loop.at(outage.start_s, self._fail, self.replicas[outage.replica])
            if outage.end_s is not None:
                loop.at(outage.end_s, self._recover, self.replicas[outage.replica])
        self.num_batches_lost_in_outage = 0
        if config.coordinator_outage is not None and index is not None:
            loop.at(config.coordinator_outage[0], self._coordinator_down)

    def _make_replica(
        self, index: int, engine: EngineConfig, timer: IterationTimer, *, is_routed: bool
    ) -> Replica:
        """A routed replica gets the lower tiers; a decode replica only its device."""
        cfg = self.config
        if (cfg.host_capacity_blocks or cfg.disk_capacity_blocks) and is_routed:
            host = disk = None
            if cfg.host_capacity_blocks:
                host = TierSpec(
                    cfg.host_capacity_blocks, cfg.eviction, admission=cfg.host_admission
                )
            if cfg.disk_capacity_blocks:
                disk = TierSpec(cfg.disk_capacity_blocks, cfg.eviction)
            tiers = TieredCache(
                TieredCacheConfig(
                    device=TierSpec(cfg.capacity_blocks, cfg.eviction),
                    host=host,
                    disk=disk,
                    block_tokens=cfg.block_tokens,
                    record_events=True,
                    ghost_blocks=config_ghost(cfg),
                ),
                self.clock,
                self.tier_cost,
            )
            scheduler = Scheduler(engine, tiers.device, timer, self.clock, tiers=tiers)
            return Replica(index, scheduler, tiers.device)
        cache = KVCache(
            CacheConfig(
                cfg.capacity_blocks,
                cfg.block_tokens,
                policy=cfg.eviction,
                record_events=True,
                ghost_blocks=config_ghost(cfg),
            ),
            self.clock,
        )
        return Replica(index, Scheduler(engine, cache, timer, self.clock), cache)

    # --- requests -------------------------------------------------------------------------

    def submit(self, request: Request, arrival_s: float | None = None) -> None:
        """Routes ``request`` now and queues it on the chosen replica; with no healthy
        replica it waits for one to recover."""
        hashes = self.hasher(request)
        route = route_request(request, hashes, self.config.block_tokens)
        try:
            decision = self.router.route(route)
        except NoHealthyReplica:
            self.unserved.append(request)
            return
        replica = self._by_id[decision.replica]
        reasons = self.route_reasons
        reasons[decision.reason] = reasons.get(decision.reason, 0) + 1
        self._flights[request.request_id] = _Flight(route, decision)
        if self.decoders:
            self._requests_by_id[request.request_id] = request
        now = self.clock.now()
        replica.driver.add(
            request,
            hashes,
            now,
            arrival_s=request.arrival_s if arrival_s is None else arrival_s,
            priority=decision.engine_priority(now) or 0,  # what a gateway would send
        )
        self._publish(replica)
        self._arm(replica)

    def _arm(self, replica: Replica) -> None:
        """Schedules the replica's next wake-up where its driver wants it (a new arrival may
        have moved it earlier: the stale one is ignored)."""
        due = replica.driver.next_wake_s
        if due != replica.wake_s:
            replica.wake_s = due
            replica.generation += 1
            if due is not None:
                self.loop.at(due, self._wake, (replica, replica.generation))

    def _wake(self, arg: tuple[Replica, int]) -> None:
        replica, generation = arg
        if generation != replica.generation:
            return
        replica.wake_s = None
        decoded = replica.engine.stats.decode_tokens
        outputs = replica.driver.on_wake(self.clock.now())
        if replica.index < self.config.num_replicas:
            # What a gateway sees: first tokens (with the engine's reported cached tokens)
            # and streamed decode tokens.
            for out in outputs:
                if out.is_first_token:
                    flight = self._flights[out.request_id]
                    self.router.prefill_done(flight.route, flight.decision, out.hit_tokens)
            decoded = replica.engine.stats.decode_tokens - decoded
            if decoded:
                replica.state.decode_progress(decoded)
        for out in outputs:
            if out.record is not None:
                self._finished(replica, out.record)
        self._publish(replica)
        self._arm(replica)

    def _finished(self, replica: Replica, record: RequestRecord) -> None:
        if replica.index >= self.config.num_replicas:  # a decode replica
            self._finish_decode(record)
            return
        flight = self._flights.pop(record.request_id)
        output = 1 if self.decoders else record.output_tokens
        self.router.complete(flight.route, flight.decision, output)
        if not self.decoders:
            self.metrics.record(record)
            return
        self._prefill_records[record.request_id] = record
        self.loop.at(
            self.clock.now() + self.transfer_s(record.prompt_tokens), self._hand_off, record
        )

    # --- disaggregation -------------------------------------------------------------------

    def _hand_off(self, record: RequestRecord) -> None:
        decoder = min(
            self.decoders, key=lambda d: (d.engine.num_running + d.engine.num_waiting, d.index)
        )
        request = self._requests_by_id.pop(record.request_id)
        decoder.driver.add(
            request,
            self.hasher(request),
            self.clock.now(),
            arrival_s=record.arrival_s,
            first_token_s=record.first_token_s,
        )
        self._publish(decoder)
        self._arm(decoder)

    def _finish_decode(self, record: RequestRecord) -> None:
        prefill = self._prefill_records.pop(record.request_id)
        self.metrics.record(
            dataclasses.replace(
                record,
                arrival_s=prefill.arrival_s,
                first_token_s=prefill.first_token_s,
                hit_tokens=prefill.hit_tokens,
                host_hit_tokens=prefill.host_hit_tokens,
                disk_hit_tokens=prefill.disk_hit_tokens,
                fetched_tokens=prefill.fetched_tokens,
                prefill_tokens=prefill.prefill_tokens + record.prefill_tokens,
                num_preemptions=prefill.num_preemptions + record.num_preemptions,
            )
        )

    # --- KV events ------------------------------------------------------------------------

    def _publish(self, replica: Replica) -> None:
        """Sends what the replica's cache changed down the (delayed, lossy) event channel."""
        events = replica.engine.take_events()
        if not events or self.ingest is None or replica.index >= self.config.num_replicas:
            return
        self.channel.send(replica.state.replica_id, events, self.clock.now())
        if self.config.event_delay_s:
            due = self.channel.next_due_s()
            if due is not None:
                self.loop.at(due, self._deliver)
        else:
            self._deliver()

    def _coordinator_down(self, _: object = None) -> None:
        assert self.index is not None
        for replica in self.replicas:
            self.index.clear_replica(replica.state.replica_id)

    def _is_coordinator_down(self) -> bool:
        window = self.config.coordinator_outage
        return window is not None and window[0] <= self.clock.now() < window[1]

    def _deliver(self, _: object = None) -> None:
        ingest = self.ingest
        assert ingest is not None
        is_down = self._is_coordinator_down()
        for batch in self.channel.deliver(self.clock.now()):
            if is_down:
                self.num_batches_lost_in_outage += 1
                continue
            replica = self._by_id[batch.replica]
            if not replica.is_healthy or batch.sent_s < replica.up_since_s:
                continue  # published before a crash: that cache is gone
            gap = ingest.receive(batch.replica, batch.seq, batch.events, batch.sent_s)
            if gap is not None:
                # The simulator can read the engine's cache: resync from a snapshot of it,
                # which reflects every batch numbered before the channel's next one.
                snapshot = snapshot_events(replica.cache)
                ingest.resync(batch.replica, self.channel.next_seq(batch.replica), snapshot)

    # --- failures -------------------------------------------------------------------------

    def _fail(self, replica: Replica) -> None:
        if not replica.is_healthy:
            return
        replica.is_healthy = False
        replica.wake_s = None
        replica.generation += 1
        dropped = replica.driver.drain()
        for cache in replica.caches:
            cache.clear()
        replica.engine.take_events()  # a dead replica publishes nothing: its failed health
        state = replica.state  # check is what makes the router forget its blocks
        if self.ingest is not None:
            self.ingest.forget(state.replica_id)
        state.healthy = False
        for request, _ in dropped:
            flight = self._flights.pop(request.request_id)
            self.router.cancel(flight.route, flight.decision)
        state.num_requests = state.queued_prefill_tokens = 0
        state.decode_sequences = state.decode_tokens = 0
        for request, arrival_s in dropped:
            self.submit(request, arrival_s)

    def _recover(self, replica: Replica) -> None:
        replica.is_healthy = True
        replica.state.healthy = True
        replica.up_since_s = self.clock.now()
        stranded, self.unserved = self.unserved, []
        for request in stranded:
            self.submit(request)

    # --- sampling -------------------------------------------------------------------------

    def sample(self) -> FleetSample:
        everyone = self.replicas + self.decoders
        return FleetSample(
            time_s=self.clock.now(),
            hit_tokens=sum(r.engine.stats.hit_tokens for r in self.replicas),
            prompt_tokens=sum(r.engine.stats.prompt_tokens for r in self.replicas),
            evicted_blocks=sum(r.cache.tree.num_evicted_total for r in everyone),
            busy_s=[r.engine.stats.busy_s for r in everyone],
            queued=[r.engine.num_running + r.engine.num_waiting for r in everyone],
        )

    @property
    def hit_tokens_by_tier(self) -> dict[str, int]:
        records = self.metrics.records
        fetched = sum(r.fetched_tokens for r in records)
        host = sum(r.host_hit_tokens for r in records)
        disk = sum(r.disk_hit_tokens for r in records)
        device = sum(r.hit_tokens for r in records) - fetched - host - disk
        by_tier = {Tier.DEVICE.name.lower(): device}
        if self.config.host_capacity_blocks:
            by_tier[Tier.HOST.name.lower()] = host
        if self.config.disk_capacity_blocks:
            by_tier[Tier.DISK.name.lower()] = disk
        if self.config.kv_transfer:
            by_tier["remote"] = fetched
        return by_tier

    def written_blocks_by_tier(self) -> dict[str, int]:
        """Blocks written into each lower tier, all replicas together."""
        out: dict[str, int] = {}
        for replica in self.replicas:
            tiers = replica.engine.tiers
            if tiers is None:
                continue
            for tier, stats in tiers.stats().tiers.items():
                if tier is not Tier.DEVICE:
                    name = tier.name.lower()
                    out[name] = out.get(name, 0) + stats.written_blocks
        return out

    @property
    def busy_s(self) -> Sequence[float]:
        return [r.engine.stats.busy_s for r in self.replicas]

    @property
    def evicted_blocks(self) -> int:
        return sum(r.cache.tree.num_evicted_total for r in self.replicas + self.decoders)
