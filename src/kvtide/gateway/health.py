"""Active health checks, model discovery and engine load scraping, one loop each.

Every ``health_interval_s`` each replica's ``/health`` is fetched (timeout ``health_s``): a
failure counts towards ejection like a failed request; an ejected replica whose ejection time
is over and whose check passes is re-admitted in slow start, and its models are re-read from
``/v1/models``. Every ``scrape_interval_s`` each routable replica's ``/metrics`` is read for
vLLM's ``num_requests_running``, ``num_requests_waiting`` and ``kv_cache_usage_perc``: the
requests other gateways sent there count in its load, and its KV usage in its utilisation.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable

import orjson

from kvtide.gateway.replicas import Replica, ReplicaSet
from kvtide.gateway.upstream import UpstreamPool

log = logging.getLogger("kvtide.gateway")

SCRAPED = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
_SAMPLE = re.compile(
    rb"^(vllm:num_requests_running|vllm:num_requests_waiting|vllm:kv_cache_usage_perc)"
    rb"(?:\{[^}]*\})?\s+([0-9.eE+-]+|NaN)",
    re.MULTILINE,
)
_CACHE_INFO = re.compile(rb"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)
_CACHE_LABEL = re.compile(rb'\b(num_gpu_blocks|block_size)="(\d+)"')
CAPACITY = "capacity_tokens"
"""The engine's device KV in tokens, from vLLM's ``cache_config_info`` (num_gpu_blocks x
block_size; summed over engines, as the gauges): what the router compares the blocks the
index sees a replica hold with (``cost``'s room check)."""


def parse_engine_metrics(text: bytes) -> dict[str, float]:
    """The scraped gauges, summed over label sets (one per engine, or per DP rank)."""
    out: dict[str, float] = {}
    for m in _SAMPLE.finditer(text):
        name = m.group(1).decode()
        try:
            value = float(m.group(2))
        except ValueError:
            continue
        if value == value:  # NaN
            out[name] = out.get(name, 0.0) + value
    capacity = 0
    for m in _CACHE_INFO.finditer(text):  # one line per engine, both labels from that line
        labels = dict(_CACHE_LABEL.findall(m.group(1)))
        if len(labels) < 2:
            return out  # an engine whose capacity is not given: the total is unknown
        capacity += int(labels[b"num_gpu_blocks"]) * int(labels[b"block_size"])
    if capacity:
        out[CAPACITY] = float(capacity)
    return out


def apply_scrape(replica: Replica, scraped: dict[str, float]) -> None:
    """Engine-reported load on top of this gateway's own bookkeeping: requests the engine
    runs or queues beyond those in flight through here came from elsewhere."""
    state = replica.state
    engine_requests = int(
        scraped.get("vllm:num_requests_running", 0) + scraped.get("vllm:num_requests_waiting", 0)
    )
    replica.count_others(scraped=max(engine_requests - replica.in_flight, 0))
    usage = scraped.get("vllm:kv_cache_usage_perc")
    if usage is not None:
        state.kv_usage = usage
    capacity = scraped.get(CAPACITY)
    if capacity is not None:
        state.capacity_blocks = int(capacity) // state.block_tokens
    replica.scraped = scraped


class HealthChecker:
    def __init__(
        self,
        replicas: ReplicaSet,
        pool: UpstreamPool,
        now_s: Callable[[], float],
        timeout_s: float,
        on_down: Callable[[Replica], None],
        on_up: Callable[[Replica], None],
        on_scraped: Callable[[Replica, bytes], None] | None = None,
    ) -> None:
        self.replicas = replicas
        self.pool = pool
        self.now_s = now_s
        self.timeout_s = timeout_s
        self.on_down = on_down
        self.on_up = on_up
        self.on_scraped = on_scraped
        """Receives each /metrics body read (the telemetry's engine counters)."""
        self._refused: set[str] = set()  # replicas whose last discovery got a 401
        self.on_models: Callable[[Replica], None] | None = None
        """Told after each /v1/models read (the gateway starts an intake waiting for it)."""

    async def _get(self, base_url: str, path: str) -> bytes | None:
        return await self.pool.get(base_url, path, self.timeout_s)

    async def discover(self, replica: Replica) -> bool:
        """Reads the replica's models; False when it does not answer."""
        got = await self.pool.get_status(replica.url, "/v1/models", self.timeout_s)
        if got is None:
            return False
        status, body = got
        if status == 401 and replica.replica_id not in self._refused:
            self._refused.add(replica.replica_id)  # said once: the checks repeat every 2 s
            log.warning(
                "replica %s refuses the gateway's key (401 on /v1/models): give the gateway "
                "its --api-key as --engine-key (KVTIDE_ENGINE_KEY)",
                replica.replica_id,
            )
        if status != 200:
            return False
        self._refused.discard(replica.replica_id)
        try:
            data = orjson.loads(body).get("data", [])
            listed = [m for m in data if isinstance(m, dict) and "id" in m]
        except (ValueError, AttributeError, TypeError):
            return False
        ids = {str(m["id"]) for m in listed}
        # vLLM lists a LoRA adapter with its base model as ``parent``; a base has none
        bases = sorted(str(m["id"]) for m in listed if m.get("parent") is None)
        if replica.spec.model:
            ids.add(replica.spec.model)
        replica.models = frozenset(ids)
        replica.base_model = replica.spec.model or (bases[0] if bases else None)
        replica.answered = True
        if self.on_models is not None:
            self.on_models(replica)
        return True

    async def check(self, replica: Replica) -> None:
        ok = await self._get(replica.url, "/health") is not None
        now = self.now_s()
        if ok:
            refused = replica.replica_id in self._refused
            if replica.is_down:
                if now >= replica.ejected_until_s and await self.discover(replica):
                    replica.readmit()
                    self.on_up(replica)
            elif not replica.models or refused:
                # its models unknown, or it refused the gateway's key: a replica refusing
                # the key answers /health (outside vLLM's /v1) but serves nothing, so the
                # check fails until a discovery goes through (the key fixed, a SIGHUP)
                ok = await self.discover(replica) or replica.replica_id not in self._refused
            if ok:
                if not replica.is_down:
                    replica.health_passed()
                return
        was_down = replica.is_down
        if not was_down:
            replica.health_failed(now)
        if replica.is_down and not was_down:
            log.warning("replica %s ejected (health check failed)", replica.replica_id)
            self.on_down(replica)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(r) for r in self.replicas))

    async def scrape(self, replica: Replica) -> None:
        if replica.is_down:
            return
        body = await self._get(replica.url, "/metrics")
        if body is not None:
            apply_scrape(replica, parse_engine_metrics(body))
            if self.on_scraped is not None:
                self.on_scraped(replica, body)

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape(r) for r in self.replicas))
