"""kvtide's metrics: declared once (``metrics``), recorded through a ``Recorder`` (null, in
memory, Prometheus), fed by ``CacheTelemetry`` and ``RouterTelemetry``, watched by the
``EarlyWarning`` detector, and exported as Prometheus rules and a Grafana dashboard."""

from kvtide.telemetry.cache import CacheTelemetry
from kvtide.telemetry.detector import Alert, DetectorConfig, EarlyWarning, Sample
from kvtide.telemetry.labels import TenantLabels
from kvtide.telemetry.online import EngineTelemetry
from kvtide.telemetry.recorders import MemoryRecorder, NullRecorder, PrometheusRecorder, Recorder
from kvtide.telemetry.router import HotPrefixes, RouterTelemetry

__all__ = [
    "Alert",
    "CacheTelemetry",
    "DetectorConfig",
    "EarlyWarning",
    "EngineTelemetry",
    "HotPrefixes",
    "MemoryRecorder",
    "NullRecorder",
    "PrometheusRecorder",
    "Recorder",
    "RouterTelemetry",
    "Sample",
    "TenantLabels",
]
