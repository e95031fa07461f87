"""The gateway's kvtide_* families: the router's (``telemetry.RouterTelemetry``) and the
online early warning over the fleet, on one ``PrometheusRecorder`` (the engine's recorder).

Router: index lag, lost batches and resyncs come from the KV event intakes (added to the
router's ``IndexHealth`` after each poll), predicted vs reported cached tokens from the proxy
(``Router.prefill_done`` and the streamed ``usage``), the replication factor from the index:
how many replicas hold each of the hottest prefixes the gateway routed.

Early warning: the gateway has no KV cache of its own; each engine's /metrics, which the
health checker scrapes anyway, carries its ``kvtide_cache_*`` counters. Their sum over the
replicas is the fleet's ``Sample`` (the ``--by job`` view of ``kvtide alerts``), evaluated at
most once per ``DetectorConfig.interval_s``; alerts go to ``kvtide_alert_*`` and to the
``kvtide.alerts`` log. A counter that goes down (the engine restarted) continues from where
it was, as Prometheus' ``increase`` treats a reset.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kvtide.clock import Clock
from kvtide.routing.consistency import IndexHealth
from kvtide.routing.index import IndexStore
from kvtide.routing.pace import PrefillPace
from kvtide.telemetry.detector import Alert, DetectorConfig, EarlyWarning, Sample
from kvtide.telemetry.metrics import BY_NAME, Kind
from kvtide.telemetry.recorders import MemoryRecorder, PrometheusRecorder
from kvtide.telemetry.router import RouterTelemetry
from kvtide.types import BlockHash, ReplicaId

SAMPLED = (
    "kvtide_cache_lookups_total",
    "kvtide_cache_prompt_tokens_total",
    "kvtide_cache_hit_tokens_total",
    "kvtide_cache_miss_tokens_total",
    "kvtide_cache_evicted_blocks_total",
    "kvtide_cache_used_blocks",
    "kvtide_cache_cached_blocks",
    "kvtide_cache_capacity_blocks",
)
"""The engine families ``Sample.of`` reads."""
_LINE = re.compile(
    rb"^(" + b"|".join(n.encode() for n in SAMPLED) + rb")(?:\{([^}]*)\})?\s+(\S+)", re.MULTILINE
)
_LABEL = re.compile(rb'\w+="([^"]*)"')


def parse_cache_samples(text: bytes) -> dict[tuple[str, tuple[str, ...]], float]:
    """The ``SAMPLED`` samples of an engine's exposition, keyed as ``MemoryRecorder`` keys
    them (name, label values in declared order: each has at most one label)."""
    out: dict[tuple[str, tuple[str, ...]], float] = {}
    for m in _LINE.finditer(text):
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if value != value:  # NaN
            continue
        labels = tuple(v.decode() for v in _LABEL.findall(m.group(2) or b""))
        out[(m.group(1).decode(), labels)] = value
    return out


class _EngineCounters:
    """One engine's scraped values, counters kept monotonic across its restarts."""

    __slots__ = ("offsets", "raw", "recorder")

    def __init__(self) -> None:
        self.recorder = MemoryRecorder()
        self.raw: dict[tuple[str, tuple[str, ...]], float] = {}
        self.offsets: dict[tuple[str, tuple[str, ...]], float] = {}

    def update(self, samples: dict[tuple[str, tuple[str, ...]], float]) -> None:
        values = self.recorder.values
        for key, value in samples.items():
            if BY_NAME[key[0]].kind is Kind.COUNTER:
                last = self.raw.get(key)
                if last is not None and value < last:  # a reset: carry what was counted
                    self.offsets[key] = self.offsets.get(key, 0.0) + last
                self.raw[key] = value
                value += self.offsets.get(key, 0.0)
            values[key] = value


class GatewayTelemetry:
    def __init__(
        self,
        health: IndexHealth,
        index: IndexStore,
        clock: Clock,
        config: DetectorConfig | None = None,
        pace: PrefillPace | None = None,
    ) -> None:
        self.recorder = PrometheusRecorder()
        self.index = index
        self.clock = clock
        self.router = RouterTelemetry(self.recorder, health, self.holders, pace=pace)
        self.detector = EarlyWarning(config, self.recorder)
        self.engines: dict[ReplicaId, _EngineCounters] = {}
        self._next_s = clock.now()

    def holders(self, path: Sequence[BlockHash]) -> int:
        """Replicas whose device tier holds the whole prefix ``path``, by the index."""
        n = len(path)
        return sum(1 for blocks in self.index.match(path).device.values() if blocks >= n)

    def routed(self, hashes: Sequence[BlockHash]) -> None:
        self.router.routed(hashes)

    def scraped(self, replica: ReplicaId, body: bytes) -> None:
        """An engine's /metrics body, as the health checker read it."""
        samples = parse_cache_samples(body)
        if not samples:
            return
        counters = self.engines.get(replica)
        if counters is None:
            counters = self.engines[replica] = _EngineCounters()
        counters.update(samples)

    def forget(self, replica: ReplicaId) -> None:
        self.engines.pop(replica, None)

    def tick(self) -> list[Alert]:
        """Runs the detector when ``interval_s`` has passed since its last run."""
        now = self.clock.now()
        if now < self._next_s or not self.engines:
            return []
        self._next_s = now + self.detector.config.interval_s
        return self.detector.update(Sample.of(now, [e.recorder for e in self.engines.values()]))

    def exposition(self) -> bytes:
        """The kvtide_* families, as of now (collected and ticked first)."""
        self.router.collect()
        self.tick()
        return self.recorder.exposition()
