"""Builds an engine server from its config and serves it: the ASGI app on Granian's embedded
server (measured fastest here, docs/http_stack.md), in this process's own uvloop; SIGTERM and
SIGINT drain (new generations get 503 while those in flight finish), then the server stops.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import orjson
import zmq

from kvtide.asgi import ApiError, AsgiServer, check_port
from kvtide.clock import ScaledClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.tiers import TieredCache, TieredCacheConfig, TierSpec
from kvtide.costs.cost_model import CostModel, network_transfer_s
from kvtide.costs.specs import gpu_preset, resolve_model
from kvtide.engine.driver import EngineDriver
from kvtide.engine.scheduler import EngineConfig, RequestRecord, Scheduler
from kvtide.engine.timing import IterationTimer
from kvtide.engine_server.api_errors import UNAVAILABLE
from kvtide.engine_server.app import ApiLimits, Backend, EngineApp
from kvtide.engine_server.engine_loop import EmulatedEngine, filler_tokens
from kvtide.engine_server.kv_publisher import BlockTokens, EnginePublisher, EventFormat
from kvtide.engine_server.kv_transfer import KvTransferConfig, NixlConnector
from kvtide.engine_server.metrics import EngineMetrics
from kvtide.engine_server.side_channel import SideChannel
from kvtide.errors import ConfigError
from kvtide.state.kv_events import KvEventPublisher
from kvtide.telemetry.online import EngineTelemetry
from kvtide.telemetry.recorders import PrometheusRecorder
from kvtide.text import load_tokenizer

log = logging.getLogger("kvtide.engine_server")

REAL_MODEL = "smollm2-135m"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """``kvtide engine``'s flags. ``model`` is a cost-model preset or config.json (emulated),
    or ``smollm2-135m`` (the real model on the CPU)."""

    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "llama-3-8b"
    gpu: str = "h100"
    tp: int = 1
    kv_cache_tokens: int = 262_144
    block_tokens: int = 16
    eviction: str = "lru"
    host_cache_tokens: int = 0
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    scheduling_policy: str = "fcfs"
    speedup: float = 1.0
    served_model_name: str | None = None
    tokenizer: str | Path | None = None
    """A tokenizer directory, a ``.gguf``, or ``smollm2`` (None: SmolLM2's too)."""
    kv_events_port: int | None = None
    kv_events_replay_port: int | None = None
    kv_events_format: EventFormat = "vllm"
    max_model_len: int = 32_768
    max_waiting: int = 1024
    max_body_bytes: int = 4 << 20
    seed: int = 0
    records: Path | None = None
    """Each finished request's ``RequestRecord`` (engine clock) as a JSON line, emulated only."""
    api_keys: tuple[str, ...] = ()
    """vLLM's ``--api-key`` (``VLLM_API_KEY``): ``/v1`` wants one of them as a bearer token."""
    responses_store: bool = False
    """Keep ``/v1/responses`` answers (vLLM's ``VLLM_ENABLE_RESPONSES_API_STORE``)."""
    kv_transfer: KvTransferConfig | None = None
    """vLLM's ``--kv-transfer-config`` (NixlConnector): requests' ``kv_transfer_params`` are
    taken for disaggregated prefill and decode, emulated only."""

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


@dataclass(slots=True)
class Built:
    app: EngineApp
    backend: Backend
    publisher: EnginePublisher | None
    scheduler: Scheduler | None
    records: IO[bytes] | None = None

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
        if self.records is not None:
            self.records.close()


def build(config: ServerConfig) -> Built:
    """The app and its backend, ready to serve (sockets for KV events bound)."""
    tokenizer = load_tokenizer(config.tokenizer)
    metrics = EngineMetrics(config.name, kv_connector=config.kv_transfer is not None)
    if config.model == REAL_MODEL:
        if config.records is not None:
            raise ConfigError("--records: only the emulated engine keeps request records")
        if config.kv_transfer is not None:
            raise ConfigError("--kv-transfer-config: only the emulated engine transfers KV")
        if config.scheduling_policy != "fcfs":
            raise ConfigError(
                "--scheduling-policy: the real model serves one request at a time, in arrival "
                "order (fcfs only)"
            )
        from kvtide.engine_server.real_model import RealModelEngine

        real = RealModelEngine.create(config, tokenizer, metrics)
        limits = _limits(config, min(config.max_model_len, real.max_model_len))
        return Built(EngineApp(real, tokenizer, metrics, limits), real, None, None)
    scheduler, clock = build_scheduler(config, record_events=config.kv_events_port is not None)
    metrics.set_cache_config(config.block_tokens, scheduler.cache.capacity_blocks)
    publisher = None
    if config.kv_events_port is not None:
        publisher = EnginePublisher(
            bind_publisher(config),
            BlockTokens(config.block_tokens),
            event_format=config.kv_events_format,
        )
        publisher.publisher.start_replay_thread()
    _, texts = filler_tokens(tokenizer)
    start = config.seed % len(texts)
    telemetry = EngineTelemetry(PrometheusRecorder(), scheduler.cache, clock, tiers=scheduler.tiers)
    metrics.attach_telemetry(telemetry)
    records = None if config.records is None else config.records.open("wb")
    engine = EmulatedEngine(
        EngineDriver(scheduler),
        clock,
        metrics,
        config.name,
        texts[start:] + texts[:start],
        publisher,
        on_record=(lambda r: None) if records is None else _record_writer(records),
        telemetry=telemetry,
    )
    connector = channel = None
    if config.kv_transfer is not None:
        connector = NixlConnector(config.kv_transfer, config.block_tokens, config.tp)
        engine.kv_lease_s = config.kv_transfer.kv_lease_s
        channel = SideChannel(config.kv_transfer, engine, clock, metrics)
    limits = _limits(config, config.max_model_len)
    app = EngineApp(engine, tokenizer, metrics, limits, connector, channel)
    return Built(app, engine, publisher, scheduler, records)


def _record_writer(file: IO[bytes]) -> Callable[[RequestRecord], None]:
    """Buffered lines, written out as the buffer fills and at close: no flush per request."""

    def write(record: RequestRecord) -> None:
        file.write(orjson.dumps(record) + b"\n")

    return write


def _limits(config: ServerConfig, max_model_len: int) -> ApiLimits:
    return ApiLimits(
        served_model_name=config.name,
        max_model_len=max_model_len,
        max_body_bytes=config.max_body_bytes,
        max_waiting=config.max_waiting,
        priority_scheduling=config.scheduling_policy == "priority",
        api_keys=config.api_keys,
        responses_store=config.responses_store,
    )


def bind_publisher(config: ServerConfig) -> KvEventPublisher:
    port = config.kv_events_port
    replay = config.kv_events_replay_port
    endpoint = f"tcp://{config.host}:{port if port else '*'}"
    replay_endpoint = f"tcp://{config.host}:{replay if replay else '*'}"
    try:
        return KvEventPublisher(endpoint, replay_endpoint, dialect=config.kv_events_format)
    except zmq.ZMQError as exc:
        raise ConfigError(f"--kv-events-port: cannot bind {endpoint}: {exc}") from exc


def build_scheduler(config: ServerConfig, *, record_events: bool) -> tuple[Scheduler, ScaledClock]:
    """The simulator's engine model, sized by the flags, on a clock ``speedup`` times fast."""
    cost = CostModel(resolve_model(config.model), gpu_preset(config.gpu), tp=config.tp)
    clock = ScaledClock(config.speedup)
    bt = config.block_tokens
    blocks = config.kv_cache_tokens // bt
    if blocks < 1:
        raise ConfigError(f"--kv-cache-tokens: {config.kv_cache_tokens} is less than one block")
    engine = EngineConfig(
        max_batched_tokens=config.max_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        scheduling_policy=config.scheduling_policy,
    )
    timer = IterationTimer.from_cost_model(cost)

    def network_s(tokens: int) -> float:  # a remote prefill's KV over this engine's NICs
        return network_transfer_s(cost, tokens)

    if config.host_cache_tokens:
        tiers = TieredCache(
            TieredCacheConfig(
                device=TierSpec(blocks, config.eviction),
                host=TierSpec(config.host_cache_tokens // bt, config.eviction),
                block_tokens=bt,
                record_events=record_events,
                ghost_blocks=None,  # the ghost memory tells evicted misses from cold ones
            ),
            clock,
            cost,
        )
        return (
            Scheduler(engine, tiers.device, timer, clock, tiers=tiers, network_s=network_s),
            clock,
        )
    cache = KVCache(
        CacheConfig(
            blocks, bt, policy=config.eviction, record_events=record_events, ghost_blocks=None
        ),
        clock,
    )
    return Scheduler(engine, cache, timer, clock, network_s=network_s), clock


class EngineServer:
    """One served engine: ``serve()`` until ``shutdown()`` (or SIGTERM / SIGINT, when
    ``handle_signals``), which drains first."""

    def __init__(self, config: ServerConfig, built: Built | None = None) -> None:
        self.config = config
        self.built = built or build(config)
        # the engine drains before the listener closes: new generations get 503 meanwhile;
        # a request cut at the deadline gets the engine's own 503 row
        self.http = AsgiServer(
            self.built.app,
            config.host,
            config.port,
            on_stop=self.built.app.drain,
            cut_error=ApiError(UNAVAILABLE, "the engine is shutting down"),
        )

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self.http.loop

    async def serve(self, *, handle_signals: bool = True) -> None:
        config, built = self.config, self.built
        print(
            f"kvtide engine: serving {config.name} on http://{config.host}:{config.port}"
            + _events_line(built)
            + _connector_line(config),
            file=sys.stderr,
            flush=True,
        )
        try:
            await self.http.serve(handle_signals=handle_signals)
        finally:
            built.close()

    def shutdown(self) -> None:
        """Drains (new generations get 503, those in flight finish), then stops serving."""
        if self.http.loop is not None:
            log.warning("draining: no new requests; waiting for those in flight")
        self.http.shutdown()


def _events_line(built: Built) -> str:
    if built.publisher is None:
        return ""
    pub = built.publisher.publisher
    return f"; KV events on {pub.bound_endpoint} (replay {pub.bound_replay_endpoint})"


def _connector_line(config: ServerConfig) -> str:
    kv = config.kv_transfer
    return "" if kv is None else f"; NixlConnector engine_id {kv.engine_id} ({kv.kv_role})"


def run(config: ServerConfig) -> None:
    import uvloop

    check_port(config.host, config.port)
    server = EngineServer(config)  # bad flags fail here, before any socket is served
    uvloop.run(server.serve())
