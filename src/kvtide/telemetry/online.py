"""EngineTelemetry: what an engine or gateway runs online, in one object: the cache's metrics
collected and the early warning evaluated every ``config.interval_s`` on the engine's clock."""

from __future__ import annotations

from kvtide.clock import Clock
from kvtide.core.cache import KVCache
from kvtide.core.tiers import TieredCache
from kvtide.telemetry.cache import CacheTelemetry
from kvtide.telemetry.detector import Alert, DetectorConfig, EarlyWarning, Sample
from kvtide.telemetry.labels import TenantLabels
from kvtide.telemetry.recorders import MemoryRecorder


class EngineTelemetry:
    """Call ``tick()`` as often as convenient (every iteration, every scrape): it collects and
    evaluates at most once per ``interval_s`` and returns the alerts that fired then, which
    are also logged on ``kvtide.alerts`` and set in ``kvtide_alert_*``. ``recorder`` is a
    ``MemoryRecorder`` or a ``PrometheusRecorder`` (the detector reads its counters back)."""

    def __init__(
        self,
        recorder: MemoryRecorder,
        cache: KVCache,
        clock: Clock,
        *,
        tiers: TieredCache | None = None,
        config: DetectorConfig | None = None,
        tenants: TenantLabels | None = None,
    ) -> None:
        self.recorder = recorder
        self.clock = clock
        self.cache = CacheTelemetry(recorder, cache, tiers=tiers, tenants=tenants)
        self.detector = EarlyWarning(config, recorder)
        self._next_s = clock.now()

    def tick(self) -> list[Alert]:
        now = self.clock.now()
        if now < self._next_s:
            return []
        self._next_s = now + self.detector.config.interval_s
        self.cache.collect()
        return self.detector.update(Sample.of(now, [self.recorder]))
