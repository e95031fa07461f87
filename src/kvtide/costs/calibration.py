"""Fitting the cost model's coefficients to measurements, and the calibration file format.

Prefill rows (new tokens, cached tokens, seconds) fit efficiency, attention coefficient and
iteration overhead; transfer rows (bytes, seconds) fit a link's rate and per-copy latency.
A calibration file is JSON: ``{"kvtide_calibration": 1, "model", "gpu", "tp", "coefficients",
"fit"}``; `load_calibration` reads it and `Calibration.to_json` writes its text.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from kvtide.costs.cost_model import Coefficients, CostModel
from kvtide.errors import ConfigError, TraceFormatError

CALIBRATION_VERSION = 1
PREFILL_CSV_COLUMNS = ("new_tokens", "cached_tokens", "seconds")


@dataclass(frozen=True, slots=True)
class PrefillSample:
    """One measured prefill: ``new_tokens`` after ``cached_tokens`` of cached context."""

    new_tokens: int
    cached_tokens: int
    seconds: float


@dataclass(frozen=True, slots=True)
class FitError:
    """Relative errors of a fit over its rows: mean absolute (MAPE) and maximum, as fractions."""

    mape: float
    max_error: float
    num_rows: int


@dataclass(frozen=True, slots=True)
class PrefillFit:
    coefficients: Coefficients
    error: FitError


@dataclass(frozen=True, slots=True)
class TransferFit:
    """A link as t = latency + bytes / rate, fitted to (bytes, seconds) rows."""

    latency_s: float
    bytes_per_s: float
    error: FitError


def fit_prefill(cost: CostModel, rows: Sequence[PrefillSample]) -> PrefillFit:
    """Least-squares fit of seconds = overhead + (linear + α·attention FLOPs) / (peak · eff).

    Linear in (overhead, 1/eff, α/eff); fitted on relative error (each row weighted by 1/seconds,
    since rows span orders of magnitude), with non-negative terms: every subset of the terms
    containing the linear one is solved, and the best feasible fit kept (exact non-negative
    least squares for three unknowns). Rows the model calls memory-bound carry no information
    on these terms: they are left out of the fit (re-decided with the fitted coefficients until
    the set settles) but counted in the reported error. Other coefficients are kept from
    ``cost``.
    """
    if len(rows) < 3:
        raise ConfigError(f"calibration needs at least 3 rows, got {len(rows)}")
    fitted = cost
    used = _compute_bound(cost, rows)
    for _ in range(5):
        coefficients = _fit_compute_bound(
            [r for r, keep in zip(rows, used, strict=True) if keep], cost
        )
        fitted = replace(cost, coefficients=coefficients)
        settled = _compute_bound(fitted, rows)
        if settled == used:
            break
        used = settled
    predicted = [fitted.prefill_time(r.new_tokens, r.cached_tokens) for r in rows]
    return PrefillFit(fitted.coefficients, fit_error(predicted, [r.seconds for r in rows]))


def calibrate(cost: CostModel, rows: Sequence[PrefillSample]) -> tuple[CostModel, PrefillFit]:
    """``cost`` with its prefill coefficients fitted to ``rows``, and the fit (see
    `fit_prefill`)."""
    fit = fit_prefill(cost, rows)
    return replace(cost, coefficients=fit.coefficients), fit


def _compute_bound(cost: CostModel, rows: Sequence[PrefillSample]) -> list[bool]:
    return [
        cost.prefill_compute_time(r.new_tokens, r.cached_tokens)
        >= cost.prefill_memory_time(r.new_tokens, r.cached_tokens)
        for r in rows
    ]


def _fit_compute_bound(rows: Sequence[PrefillSample], cost: CostModel) -> Coefficients:
    if len(rows) < 3:
        raise ConfigError(
            f"calibration needs at least 3 compute-bound rows, got {len(rows)}: "
            "use prefills of a few hundred tokens or more"
        )
    peak = cost.gpu.bf16_flops_per_s * cost.tp
    design = np.array(
        [
            [
                1.0,
                cost.linear_flops(r.new_tokens) / peak,
                cost.attention_flops(r.new_tokens, r.cached_tokens) / peak,
            ]
            for r in rows
        ]
    )
    seconds = np.array([r.seconds for r in rows])
    weighted = design / seconds[:, None]
    target = np.ones(len(rows))
    scale = np.abs(weighted).max(axis=0)
    if np.linalg.matrix_rank(weighted / scale) < 3:
        raise ConfigError(
            "calibration rows must vary new_tokens over at least 3 values "
            "(or vary cached_tokens) to separate overhead, matmul and attention time"
        )
    best: tuple[float, np.ndarray] | None = None
    for size in (3, 2, 1):
        for subset in itertools.combinations(range(3), size):
            if 1 not in subset:
                continue
            cols = list(subset)
            solution, *_ = np.linalg.lstsq(weighted[:, cols] / scale[cols], target, rcond=None)
            coef = np.zeros(3)
            coef[cols] = solution / scale[cols]
            if (coef < 0).any() or coef[1] <= 0:
                continue
            residual = float(np.sum((weighted @ coef - target) ** 2))
            if best is None or residual < best[0]:
                best = (residual, coef)
    if best is None:
        raise ConfigError("calibration found no fit with positive matmul time")
    overhead, per_flop, attention_per_flop = (float(x) for x in best[1])
    return replace(
        cost.coefficients,
        prefill_efficiency=1.0 / per_flop,
        attention_coefficient=attention_per_flop / per_flop,
        iteration_overhead_s=overhead,
    )


def fit_transfer(rows: Sequence[tuple[float, float]]) -> TransferFit:
    """Fits t = latency + bytes / rate to (bytes, seconds) rows of single copies, on relative
    error; the rate is bounded to be positive and the latency non-negative."""
    if len(rows) < 2 or len({b for b, _ in rows}) < 2:
        raise ConfigError("a transfer fit needs rows of at least 2 sizes")
    sizes = np.array([float(b) for b, _ in rows])
    seconds = np.array([float(s) for _, s in rows])
    weighted = np.column_stack([np.ones_like(sizes), sizes]) / seconds[:, None]
    scale = np.abs(weighted).max(axis=0)
    (latency, inverse_rate), *_ = np.linalg.lstsq(weighted / scale, np.ones(len(rows)), rcond=None)
    latency, inverse_rate = latency / scale[0], inverse_rate / scale[1]
    if latency < 0:
        latency, inverse_rate = 0.0, float(np.mean(seconds / sizes))
    if inverse_rate <= 0:
        raise ConfigError("transfer rows do not grow with size: no positive rate fits")
    predicted = [latency + b * inverse_rate for b in sizes]
    return TransferFit(float(latency), 1.0 / inverse_rate, fit_error(predicted, list(seconds)))


def fit_error(predicted: Sequence[float], measured: Sequence[float]) -> FitError:
    """Relative errors |predicted − measured| / measured: their mean and their maximum."""
    errors = [abs(p - m) / m for p, m in zip(predicted, measured, strict=True)]
    return FitError(sum(errors) / len(errors), max(errors), len(errors))


def parse_prefill_csv(lines: Iterable[str], path: str) -> list[PrefillSample]:
    """Rows of a CSV with the header ``new_tokens,cached_tokens,seconds`` (any column order,
    extra columns ignored); blank lines and lines starting with ``#`` are skipped.
    Each bad line raises TraceFormatError naming it."""
    reader = csv.reader(lines)
    header: dict[str, int] | None = None
    rows: list[PrefillSample] = []
    for fields in reader:
        line = reader.line_num
        if not fields or not "".join(fields).strip() or fields[0].lstrip().startswith("#"):
            continue
        if header is None:
            names = [f.strip() for f in fields]
            missing = [c for c in PREFILL_CSV_COLUMNS if c not in names]
            if missing:
                raise TraceFormatError(path, line, f"header lacks column {missing[0]!r}")
            header = {c: names.index(c) for c in PREFILL_CSV_COLUMNS}
            continue
        rows.append(_parse_row(fields, header, path, line))
    if header is None:
        raise TraceFormatError(
            path, 1, "empty file: expected a header " + ",".join(PREFILL_CSV_COLUMNS)
        )
    return rows


def _parse_row(fields: list[str], header: Mapping[str, int], path: str, line: int) -> PrefillSample:
    width = max(header.values()) + 1
    if len(fields) < width:
        raise TraceFormatError(path, line, f"expected {width} fields, got {len(fields)}")
    text = {c: fields[i].strip() for c, i in header.items()}
    counts: dict[str, int] = {}
    for column in ("new_tokens", "cached_tokens"):
        try:
            counts[column] = int(text[column])
        except ValueError:
            raise TraceFormatError(
                path, line, f"{column} {text[column]!r} is not an integer"
            ) from None
    try:
        seconds = float(text["seconds"])
    except ValueError:
        raise TraceFormatError(path, line, f"seconds {text['seconds']!r} is not a number") from None
    if counts["new_tokens"] < 1 or counts["cached_tokens"] < 0:
        raise TraceFormatError(path, line, "new_tokens must be >= 1 and cached_tokens >= 0")
    if not math.isfinite(seconds) or seconds <= 0:
        raise TraceFormatError(path, line, f"seconds must be positive and finite, got {seconds}")
    return PrefillSample(counts["new_tokens"], counts["cached_tokens"], seconds)


def read_prefill_csv(path: str | Path) -> list[PrefillSample]:
    """`parse_prefill_csv` over a file; ConfigError if it cannot be opened."""
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            return parse_prefill_csv(handle, str(path))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text") from exc


@dataclass(frozen=True, slots=True)
class Calibration:
    """Fitted coefficients and where they come from (model, GPU, tensor-parallel degree)."""

    coefficients: Coefficients
    model: str
    gpu: str
    tp: int = 1
    fit: Mapping[str, float] = field(default_factory=dict)
    """Free-form fit statistics (e.g. ``prefill_mape``), carried for the reader."""

    def to_json(self) -> str:
        document = {
            "kvtide_calibration": CALIBRATION_VERSION,
            "model": self.model,
            "gpu": self.gpu,
            "tp": self.tp,
            "coefficients": self.coefficients.to_dict(),
            "fit": dict(self.fit),
        }
        return json.dumps(document, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, *, origin: str = "calibration") -> Calibration:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{origin}: not valid JSON: {exc}") from exc
        if (
            not isinstance(document, dict)
            or document.get("kvtide_calibration") != CALIBRATION_VERSION
        ):
            raise ConfigError(
                f"{origin}: not a kvtide calibration file (version {CALIBRATION_VERSION})"
            )
        coefficients = document.get("coefficients")
        if not isinstance(coefficients, dict):
            raise ConfigError(f"{origin}: 'coefficients' must be an object")
        fit = document.get("fit", {})
        if not isinstance(fit, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in fit.values()
        ):
            raise ConfigError(f"{origin}: 'fit' must map names to numbers")
        model, gpu, tp = document.get("model"), document.get("gpu"), document.get("tp", 1)
        if not isinstance(model, str) or not isinstance(gpu, str):
            raise ConfigError(f"{origin}: 'model' and 'gpu' must be strings")
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise ConfigError(f"{origin}: 'tp' must be an integer >= 1")
        return cls(Coefficients.from_dict(coefficients, origin=origin), model, gpu, tp, fit)


def load_calibration(path: str | Path) -> Calibration:
    """Reads a calibration file written by `kvtide calibrate` or ``bench/gpu_tiers.py``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text") from exc
    return Calibration.from_json(text, origin=str(path))
