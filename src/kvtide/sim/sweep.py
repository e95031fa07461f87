"""Sweeps: a YAML grid (policies x cache sizes x replica counts x load ...) expanded into
scenarios, run by an executor, and flattened to one row per point.

    base:                 # fixed settings: Scenario fields (``gpu_cache_tokens``) or the
      workload: builtin:chat   # flags of `kvtide simulate` (``gpu-cache-tokens``)
      requests: 400
    grid:                 # every combination of these lists is one point
      router: [round_robin, cost]
      gpu_cache_tokens: [64k, 256Ki]   # k/M/G are 10^3/10^6/10^9, Ki/Mi/Gi 2^10/2^20/2^30
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
from kvtide.sim.scenario import RunResult, Scenario, check_scenario
from kvtide.sim.settings import ENGINE_SETTINGS, SCENARIO_SETTINGS, SETTINGS

_ALIASES = {"event_delay": "event_delay_s", "decode": "decode_replicas", "outage": "outages"}
_TOP_KEYS = ("base", "grid")


@dataclasses.dataclass(frozen=True, slots=True)
class SweepPoint:
    values: Mapping[str, object]
    """The grid's values at this point, by key."""
    scenario: Scenario
    warnings: tuple[str, ...] = ()
    """What ``check_scenario`` found questionable but not wrong (a KV pool that does not
    fit beside the weights, as given)."""


def load_sweep(path: Path) -> list[SweepPoint]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping with 'base' and 'grid'")
    for key in doc:
        if key not in _TOP_KEYS:
            raise ConfigError(f"{path}: unknown top-level key {key!r} (valid: base, grid)")
    return expand(doc.get("base") or {}, doc.get("grid") or {}, origin=str(path))


def expand(
    base: Mapping[str, Any], grid: Mapping[str, Any], *, origin: str = "sweep"
) -> list[SweepPoint]:
    """Every combination of ``grid``'s lists applied over ``base``, in grid order; each value
    goes through the setting's parser (``kvtide.sim.settings``), as the same flag would."""
    if not isinstance(base, Mapping) or not isinstance(grid, Mapping):
        raise ConfigError(f"{origin}: 'base' and 'grid' must be mappings")
    fixed: dict[str, object] = {}
    for raw_key, value in base.items():
        key = _key(raw_key, origin)
        fixed[key] = SETTINGS[key](value, name=f"{origin}: base.{raw_key}")
    axes: list[tuple[str, list[object]]] = []
    for raw_key, values in grid.items():
        key = _key(raw_key, origin)
        name = f"{origin}: grid.{raw_key}"
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{name}: must be a non-empty list, got {values!r}")
        axes.append((key, [SETTINGS[key](v, name=f"{name}[{i}]") for i, v in enumerate(values)]))
    points = []
    for combo in itertools.product(*(values for _, values in axes)):
        values = dict(zip((k for k, _ in axes), combo, strict=True))
        settings = {**fixed, **values}
        scenario = _scenario(settings, origin)
        given = "gpu_cache_tokens" in settings
        warnings = check_scenario(scenario, lambda key: f"{origin}: {key}", kv_given=given)
        points.append(SweepPoint(values, scenario, tuple(warnings)))
    return points


def normal_key(raw: object) -> str:
    """A setting as a sweep file or ``--mean-over`` may spell it (``gpu-cache-tokens``, the
    alias ``event_delay``), as the grid keys it: the Scenario field's name."""
    key = str(raw).strip().replace("-", "_")
    return _ALIASES.get(key, key)


def _key(raw: object, origin: str) -> str:
    key = normal_key(raw)
    if key not in SETTINGS:
        valid = ", ".join(sorted(SETTINGS))
        raise ConfigError(f"{origin}: unknown setting {raw!r} (valid: {valid})")
    return key


def _scenario(settings: Mapping[str, object], origin: str) -> Scenario:
    engine = {k: v for k, v in settings.items() if k in ENGINE_SETTINGS}
    fields = {k: v for k, v in settings.items() if k in SCENARIO_SETTINGS}
    try:
        scenario = Scenario(engine=EngineConfig(**engine), **fields)  # type: ignore[arg-type]
    except ConfigError as exc:  # a combination of valid values that does not go together
        point = ", ".join(f"{k}={v}" for k, v in settings.items())
        raise ConfigError(f"{origin}: {exc} (at {point})") from exc
    return scenario


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


def mean_over_keys(keys: Sequence[str], over: Sequence[str]) -> list[str]:
    """``over``, grid keys as a sweep file may spell them (``gpu-cache-tokens``,
    ``event_delay``), as the grid keys them, each once; a key not in the grid is an error."""
    for raw in over:
        if normal_key(raw) not in keys:
            raise ConfigError(
                f"--mean-over: {raw!r} is not a key of the grid (grid: {', '.join(keys)})"
            )
    return list(dict.fromkeys(normal_key(k) for k in over))


def mean_rows(
    table_rows: Sequence[Mapping[str, object]], keys: Sequence[str], over: Sequence[str]
) -> list[dict[str, object]]:
    """The rows grouped by the grid ``keys`` not in ``over`` (in order of first appearance),
    each metric the mean over its group (a metric empty in any row of the group is empty), and
    ``points``, the group's size: seeds averaged, say. ``over`` as ``mean_over_keys`` takes it."""
    over = mean_over_keys(keys, over)
    kept = [k for k in keys if k not in over]
    groups: dict[tuple[object, ...], list[Mapping[str, object]]] = {}
    for r in table_rows:
        groups.setdefault(tuple(r[k] for k in kept), []).append(r)
    out = []
    for group_key, members in groups.items():
        mean: dict[str, object] = dict(zip(kept, group_key, strict=True))
        mean["points"] = len(members)
        for metric in METRICS:
            values = [m.get(metric) for m in members]
            numbers = [float(v) for v in values if isinstance(v, int | float)]
            mean[metric] = sum(numbers) / len(numbers) if len(numbers) == len(values) else None
        out.append(mean)
    return out
