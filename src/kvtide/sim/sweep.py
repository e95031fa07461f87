"""Sweeps: a YAML grid (policies x cache sizes x replica counts x load ...) expanded into
scenarios, run by an executor, and flattened to one row per point.

    base:                 # fixed settings: Scenario fields (``gpu_cache_tokens``) or the
      workload: builtin:chat   # flags of `kvtide simulate` (``gpu-cache-tokens``)
      requests: 400
    grid:                 # every combination of these lists is one point
      router: [round_robin, cost]
      gpu_cache_tokens: [64k, 256k]
      replicas: [2, 4]
      load: [0.5, 1.0]
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from kvtide.engine.scheduler import EngineConfig
from kvtide.errors import ConfigError
from kvtide.sim.scenario import RunResult, Scenario

_ENGINE_KEYS = {f.name for f in dataclasses.fields(EngineConfig)}
_SCENARIO_KEYS = {f.name for f in dataclasses.fields(Scenario)} - {"engine", "outages"}
_ALIASES = {"event_delay": "event_delay_s", "decode": "decode_replicas"}
_TOKEN_KEYS = {"gpu_cache_tokens", "host_cache_tokens", "disk_cache_tokens", "max_batched_tokens"}
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


@dataclasses.dataclass(frozen=True, slots=True)
class SweepPoint:
    values: Mapping[str, object]
    """The grid's values at this point, by key."""
    scenario: Scenario


def load_sweep(path: Path) -> list[SweepPoint]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping with 'base' and 'grid'")
    return expand(doc.get("base") or {}, doc.get("grid") or {}, origin=str(path))


def expand(
    base: Mapping[str, Any], grid: Mapping[str, Any], *, origin: str = "sweep"
) -> list[SweepPoint]:
    """Every combination of ``grid``'s lists applied over ``base``, in grid order."""
    if not isinstance(base, Mapping) or not isinstance(grid, Mapping):
        raise ConfigError(f"{origin}: 'base' and 'grid' must be mappings")
    fixed = {_key(k, origin): _value(_key(k, origin), v, origin) for k, v in base.items()}
    axes: list[tuple[str, list[object]]] = []
    for raw_key, values in grid.items():
        key = _key(raw_key, origin)
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{origin}: grid.{raw_key} must be a non-empty list")
        axes.append((key, [_value(key, v, origin) for v in values]))
    points = []
    for combo in itertools.product(*(values for _, values in axes)):
        values = dict(zip((k for k, _ in axes), combo, strict=True))
        points.append(SweepPoint(values, _scenario({**fixed, **values}, origin)))
    return points


def _key(raw: object, origin: str) -> str:
    key = str(raw).strip().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in _SCENARIO_KEYS and key not in _ENGINE_KEYS:
        valid = ", ".join(sorted(_SCENARIO_KEYS | _ENGINE_KEYS))
        raise ConfigError(f"{origin}: unknown setting {raw!r} (valid: {valid})")
    return key


def _value(key: str, value: object, origin: str) -> object:
    if key in _TOKEN_KEYS and isinstance(value, str):
        text = value.strip().lower()
        scale = _UNITS.get(text[-1:], 1)
        try:
            return int(float(text[:-1] if scale > 1 else text) * scale)
        except ValueError:
            raise ConfigError(f"{origin}: {key}: not a token count: {value!r}") from None
    return value


def _scenario(settings: Mapping[str, object], origin: str) -> Scenario:
    engine = {k: v for k, v in settings.items() if k in _ENGINE_KEYS}
    fields = {k: v for k, v in settings.items() if k in _SCENARIO_KEYS}
    if isinstance(fields.get("coordinator_outage"), list):
        fields["coordinator_outage"] = tuple(fields["coordinator_outage"])  # type: ignore[arg-type]
    try:
        return Scenario(engine=EngineConfig(**engine), **fields)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(f"{origin}: {exc}") from exc


METRICS = (
    "requests",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "hit_ratio",
    "throughput_tok_s",
    "load_imbalance",
    "evictions_per_s",
    "prefill_tokens_computed",
)


def row(point: SweepPoint, result: RunResult) -> dict[str, object]:
    """A flat row: the point's grid values, then its metrics (CSV-ready)."""
    s = result.summary
    metrics: dict[str, object] = {
        "requests": s.requests,
        "ttft_mean_s": s.ttft_s.mean,
        "ttft_p50_s": s.ttft_s.p50,
        "ttft_p90_s": s.ttft_s.p90,
        "ttft_p99_s": s.ttft_s.p99,
        "tpot_p50_s": s.tpot_s.p50,
        "tpot_p99_s": s.tpot_s.p99,
        "e2e_p50_s": s.e2e_s.p50,
        "e2e_p99_s": s.e2e_s.p99,
        "hit_ratio": s.hit_ratio,
        "throughput_tok_s": s.throughput_tok_s,
        "load_imbalance": s.load_imbalance,
        "evictions_per_s": s.evictions_per_s,
        "prefill_tokens_computed": s.prefill_tokens_computed,
    }
    # A metric that does not apply (TPOT of a prefill-only pool) is empty, not NaN.
    clean = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in metrics.items()}
    return {**point.values, **clean}


def rows(points: Sequence[SweepPoint], results: Sequence[RunResult]) -> list[dict[str, object]]:
    return [row(p, r) for p, r in zip(points, results, strict=True)]
