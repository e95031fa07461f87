"""GPU tiers: host<->GPU bandwidth against copy size, reload vs recompute on Llama-3-8B-shaped
layers, and the kvtide cost model's prediction beside every measurement.

    python bench/gpu_tiers.py --out-dir /tmp/tiers             # one NVIDIA GPU, a few minutes
    python bench/gpu_tiers.py --device cpu --shape tiny --quick --out-dir /tmp/tiers   # smoke

Steps: (1) time pinned and pageable copies of 4 KiB to 256 MiB, host-to-GPU, GPU-to-host and
both at once; (2) time prefills of a real bf16 layer stack (RMSNorm, QKV, causal GQA attention
over a KV cache, output projection, SwiGLU MLP; random weights, no RoPE, no embedding or head)
for several (new, cached) token counts; (3) fit the cost model's coefficients to (1) and (2)
and write calibration.json; (4) for prefixes of 1k to 32k tokens, time recompute, layer-wise
overlapped reload from pinned host memory, serial reload, and the split the calibrated model
picks, each beside the model's prediction (calibrated and default coefficients). Medians of
several runs. Writes gpu_tiers.json with everything.

torch is imported only here, in `TorchRunner`; argument parsing, the calibration and the
prediction table are plain Python, tested in tests/unit/bench without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvtide.costs.calibration import (
    Calibration,
    PrefillSample,
    fit_error,
    fit_prefill,
    fit_transfer,
)
from kvtide.costs.cost_model import Coefficients, CostModel
from kvtide.costs.specs import GPU_PRESETS, MODEL_PRESETS, GpuSpec, ModelSpec, gpu_preset
from kvtide.types import Tier
from revision import git_rev

MIB = 1 << 20
# A layer stack small enough for a CPU smoke run, shaped like Llama (GQA, SwiGLU).
TINY_CONFIG: dict[str, object] = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
}
SHAPES: dict[str, dict[str, object]] = {
    "llama-3-8b": dict(MODEL_PRESETS["llama-3-8b"]),
    "tiny": TINY_CONFIG,
}
ACCURACY_BAND = 0.15  # the bar: predictions within ±15% of measured time
# Stand-in "GPU" for CPU smoke runs: rough placeholders so the fit sees compute-bound rows.
CPU_SMOKE_GPU = GpuSpec("cpu", 2e11, 2e10, 1e10, 1e10, 1e9, 1e9)


# --- configuration -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class BenchConfig:
    out_dir: Path
    device: str = "cuda"
    gpu: str | None = None
    """GPU preset for predictions; guessed from the device name when None."""
    shape: str = "llama-3-8b"
    layers: int | None = None
    prefixes: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768)
    new_tokens: int = 1
    prefill_new: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
    prefill_cached: tuple[int, ...] = (0, 4096, 16384)
    memory_new: tuple[int, ...] = (1, 8)
    copy_sizes: tuple[int, ...] = tuple(4096 << (2 * i) for i in range(9))  # 4 KiB .. 256 MiB
    copy_budget_bytes: int = 256 * MIB
    """Bytes copied per timed run of one size (at least 8 and at most 1000 copies)."""
    repeats: int = 5
    chunk_tokens: int = 256
    block_tokens: int = 16
    seed: int = 0


QUICK = {
    "prefixes": (64, 128, 256),
    "prefill_new": (16, 32, 64),
    "prefill_cached": (0, 32),
    "memory_new": (1,),
    "copy_sizes": (4096, 65536, MIB),
    "copy_budget_bytes": 4 * MIB,
    "repeats": 2,
    "chunk_tokens": 32,
    "block_tokens": 8,
}


def parse_args(argv: Sequence[str] | None = None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out-dir", type=Path, required=True, help="where the JSON files go")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--gpu", choices=sorted(GPU_PRESETS), help="preset for predictions")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3-8b")
    parser.add_argument("--layers", type=int, help="layers in the stack (default: the shape's)")
    parser.add_argument(
        "--prefixes", type=_int_list, help="comma-separated prefix lengths (default 1k..32k)"
    )
    parser.add_argument("--repeats", type=int, help="timed runs per point (median); default 5")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="few small points (smoke runs)")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.prefixes is not None:
        overrides["prefixes"] = args.prefixes
    if args.repeats is not None:
        overrides["repeats"] = args.repeats
    config = BenchConfig(
        out_dir=args.out_dir,
        device=args.device,
        gpu=args.gpu,
        shape=args.shape,
        layers=args.layers,
        seed=args.seed,
        **overrides,
    )
    if config.layers is not None and config.layers < 1:
        parser.error("--layers must be >= 1")
    if config.repeats < 1:
        parser.error("--repeats must be >= 1")
    if not config.prefixes or min(config.prefixes) <= config.block_tokens:
        parser.error(f"--prefixes must be longer than a block ({config.block_tokens} tokens)")
    return config


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("values must be positive integers")
    return values


def bench_model_spec(shape: str, layers: int | None) -> ModelSpec:
    """The spec of the measured stack: the shape's layers, with no embedding and no head (a
    one-token vocabulary, so parameter and byte counts are those of the layers alone)."""
    config = dict(SHAPES[shape], vocab_size=1)
    if layers is not None:
        config["num_hidden_layers"] = layers
    return ModelSpec.from_hf_config(config, name=f"{shape}-layers")


def guess_gpu(device_name: str) -> str | None:
    """The preset whose name appears in a CUDA device name (e.g. 'NVIDIA H200' -> 'h200')."""
    squeezed = device_name.lower().replace(" ", "").replace("-", "")
    return next((name for name in GPU_PRESETS if name in squeezed), None)


# --- measurements (plain data) ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class CopyRow:
    memory: str  # "pinned" | "pageable"
    direction: str  # "h2d" | "d2h" | "both"
    chunk_bytes: int
    seconds_per_copy: float
    """Per copy, per direction (for "both": the time of one copy each way, concurrently)."""

    @property
    def bytes_per_s(self) -> float:
        return self.chunk_bytes / self.seconds_per_copy


@dataclasses.dataclass(frozen=True, slots=True)
class OnboardRow:
    prefix_tokens: int
    new_tokens: int
    plan: str  # "recompute" | "reload" | "reload_serial" | "split"
    reload_tokens: int
    seconds: float


# --- calibration and predictions (plain Python) -----------------------------------------------


def calibrate(
    spec: ModelSpec,
    gpu: GpuSpec,
    copies: Sequence[CopyRow],
    prefill: Sequence[PrefillSample],
    chunk_tokens: int,
) -> tuple[Calibration, dict[str, float]]:
    """Fits the coefficients to the copy and prefill measurements.

    Prefill rows give efficiency, attention coefficient and overhead (`fit_prefill`); pinned
    host-to-GPU copies give the per-copy latency and the link efficiency (`fit_transfer`);
    memory-bound prefill rows (a few tokens) give the HBM efficiency.
    """
    base = CostModel(spec, gpu, coefficients=Coefficients(chunk_tokens=chunk_tokens))
    prefill_fit = fit_prefill(base, prefill)
    coefficients = prefill_fit.coefficients
    stats: dict[str, float] = {
        "prefill_mape": prefill_fit.error.mape,
        "prefill_max_error": prefill_fit.error.max_error,
        "prefill_rows": prefill_fit.error.num_rows,
    }
    pinned = [(r.chunk_bytes, r.seconds_per_copy) for r in copies if _is_pinned_h2d(r)]
    if len({size for size, _ in pinned}) >= 2:
        link = fit_transfer(pinned)
        coefficients = dataclasses.replace(
            coefficients,
            host_chunk_latency_s=link.latency_s,
            host_link_efficiency=link.bytes_per_s / gpu.host_to_device_bytes_per_s,
        )
        stats |= {
            "h2d_bytes_per_s": link.bytes_per_s,
            "h2d_latency_s": link.latency_s,
            "h2d_mape": link.error.mape,
            "h2d_max_error": link.error.max_error,
        }
    fitted = CostModel(spec, gpu, coefficients=coefficients)
    memory_bound = [
        r
        for r in prefill
        if fitted.prefill_memory_time(r.new_tokens, r.cached_tokens)
        > fitted.prefill_compute_time(r.new_tokens, r.cached_tokens)
        and r.seconds > coefficients.iteration_overhead_s
    ]
    if memory_bound:
        ratios = [
            fitted.prefill_memory_time(r.new_tokens, r.cached_tokens)
            * coefficients.memory_efficiency
            / (r.seconds - coefficients.iteration_overhead_s)
            for r in memory_bound
        ]
        coefficients = dataclasses.replace(
            coefficients, memory_efficiency=statistics.median(ratios)
        )
        stats["memory_rows"] = len(memory_bound)
    fitted = CostModel(spec, gpu, coefficients=coefficients)
    predicted = [fitted.prefill_time(r.new_tokens, r.cached_tokens) for r in prefill]
    error = fit_error(predicted, [r.seconds for r in prefill])
    stats |= {"prefill_mape": error.mape, "prefill_max_error": error.max_error}
    return Calibration(coefficients, spec.name, gpu.name, 1, stats), stats


def _is_pinned_h2d(row: CopyRow) -> bool:
    return row.memory == "pinned" and row.direction == "h2d"


def planned_splits(cost: CostModel, config: BenchConfig) -> dict[int, int]:
    """For each prefix, the split point the model picks (0 when it has no interior split)."""
    splits = {}
    for prefix in config.prefixes:
        decision = cost.decide_onboard(
            prefix,
            Tier.HOST,
            config.new_tokens,
            block_tokens=config.block_tokens,
            with_break_even=False,
        )
        splits[prefix] = decision.split_reload_tokens
    return splits


def prediction_rows(
    calibrated: CostModel, default: CostModel, measured: Sequence[OnboardRow]
) -> list[dict[str, Any]]:
    """Each measured plan beside the time the model predicts for it.

    The serial reload (load everything, then compute) is predicted as load + compute, since
    the model's own reload overlaps the two layer by layer.
    """
    rows = []
    for m in measured:
        predicted = _predict(calibrated, m)
        rows.append(
            {
                "prefix_tokens": m.prefix_tokens,
                "new_tokens": m.new_tokens,
                "plan": m.plan,
                "reload_tokens": m.reload_tokens,
                "measured_s": m.seconds,
                "predicted_s": predicted,
                "predicted_default_s": _predict(default, m),
                "ratio": predicted / m.seconds,
                "within_band": abs(predicted / m.seconds - 1.0) <= ACCURACY_BAND,
            }
        )
    return rows


def _predict(cost: CostModel, m: OnboardRow) -> float:
    if m.plan == "reload_serial":
        load = cost.transfer_time(cost.kv_bytes(m.prefix_tokens), Tier.HOST)
        return load + cost.prefill_time(m.new_tokens, m.prefix_tokens)
    return cost.onboard_time(m.prefix_tokens, m.reload_tokens, m.new_tokens, Tier.HOST)


def decision_rows(
    calibrated: CostModel, measured: Sequence[OnboardRow], block_tokens: int
) -> list[dict[str, Any]]:
    """Per prefix: the plan the model picks, the plan that measured fastest, and what the
    model's pick costs against reloading always (what engines do today)."""
    by_prefix: dict[int, dict[str, OnboardRow]] = {}
    for m in measured:
        by_prefix.setdefault(m.prefix_tokens, {})[m.plan] = m
    rows = []
    for prefix, plans in sorted(by_prefix.items()):
        candidates = {p: r for p, r in plans.items() if p in ("recompute", "reload", "split")}
        new_tokens = next(iter(plans.values())).new_tokens
        decision = calibrated.decide_onboard(
            prefix, Tier.HOST, new_tokens, block_tokens=block_tokens, with_break_even=False
        )
        picked = str(decision.action)
        if picked not in candidates:  # e.g. a split that was not measured
            picked = "reload" if decision.reload_s <= decision.recompute_s else "recompute"
        fastest = min(candidates.values(), key=lambda r: r.seconds)
        rows.append(
            {
                "prefix_tokens": prefix,
                "model_pick": picked,
                "measured_fastest": fastest.plan,
                "pick_measured_s": candidates[picked].seconds,
                "fastest_measured_s": fastest.seconds,
                "pick_vs_fastest": candidates[picked].seconds / fastest.seconds,
                "pick_vs_reload_always": candidates[picked].seconds / candidates["reload"].seconds
                if "reload" in candidates
                else None,
            }
        )
    return rows


def summary(predictions: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Share of predictions within ±15% of measured, and the median and worst |error|."""
    errors = [abs(r["ratio"] - 1.0) for r in predictions]
    if not errors:
        return {}
    return {
        "within_band": sum(r["within_band"] for r in predictions) / len(predictions),
        "median_abs_error": statistics.median(errors),
        "max_abs_error": max(errors),
    }


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table (numbers right-aligned)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def write_outputs(out_dir: Path, report: dict[str, Any], calibration: Calibration) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path, calibration_path = out_dir / "gpu_tiers.json", out_dir / "calibration.json"
    report_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    calibration_path.write_text(calibration.to_json(), encoding="utf-8")
    return [report_path, calibration_path]


# --- measuring with torch -----------------------------------------------------------------


class TorchRunner:
    """Everything that touches torch: buffers, the layer stack, timed copies and prefills."""

    def __init__(self, config: BenchConfig, spec: ModelSpec) -> None:
        import torch  # the one place torch enters kvtide's code

        self.torch = torch
        self.config = config
        self.spec = spec
        self.is_cuda = config.device == "cuda"
        if self.is_cuda and not torch.cuda.is_available():
            raise SystemExit("gpu_tiers: --device cuda but torch sees no CUDA device")
        self.device = torch.device(config.device)
        # bf16 as served on a GPU; float32 on the CPU, where bf16 matmuls are slow.
        self.dtype = torch.bfloat16 if self.is_cuda else torch.float32
        torch.manual_seed(config.seed)
        if not self.is_cuda:
            torch.set_num_threads(1)  # shared CI cores: one thread is faster and steadier
        self.device_name = (
            torch.cuda.get_device_name(self.device)
            if self.is_cuda
            else f"cpu ({platform.machine()})"
        )
        self.layers = [self._random_layer() for _ in range(spec.num_layers)]
        max_prefix = max(config.prefixes)
        context = max(
            max_prefix + config.new_tokens,
            max(config.prefill_cached) + max(config.prefill_new),
        )
        kv_shape = (context, 2, spec.num_kv_heads, spec.head_dim)  # K and V side by side
        self.cache = [
            torch.zeros(kv_shape, dtype=self.dtype, device=self.device) for _ in self.layers
        ]
        host_shape = (max_prefix, 2, spec.num_kv_heads, spec.head_dim)
        # Zeros, not random: filling gigabytes of pinned memory with randn takes tens of seconds
        # on the host, and copy and attention times do not depend on the values.
        self.host = [
            torch.zeros(host_shape, dtype=self.dtype, pin_memory=self.is_cuda) for _ in self.layers
        ]
        # torch.cuda's Stream and Event constructors are unannotated
        self.copy_stream = (
            torch.cuda.Stream(self.device) if self.is_cuda else None  # type: ignore[no-untyped-call]
        )
        self.attention_path = self._choose_attention_path()

    # -- timing --

    def _sync(self) -> None:
        if self.is_cuda:
            self.torch.cuda.synchronize(self.device)

    def median_seconds(self, run: Callable[[], None]) -> float:
        """Median seconds of ``repeats`` runs after one warm-up."""
        run()
        self._sync()
        samples: list[float] = []
        for _ in range(self.config.repeats):
            if self.is_cuda:
                start = self.torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                end = self.torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                start.record()
                run()
                end.record()
                end.synchronize()
                samples.append(float(start.elapsed_time(end)) / 1e3)
            else:
                began = time.perf_counter()
                run()
                samples.append(time.perf_counter() - began)
        return statistics.median(samples)

    # -- copies --

    def measure_copies(self) -> list[CopyRow]:
        torch, sizes = self.torch, self.config.copy_sizes
        largest = max(sizes)
        memories = ("pinned", "pageable") if self.is_cuda else ("pageable",)
        rows = []
        for memory in memories:
            pinned = memory == "pinned"
            host_in, host_out = (
                torch.empty(largest, dtype=torch.uint8, pin_memory=pinned) for _ in range(2)
            )
            dev_in, dev_out = (
                torch.empty(largest, dtype=torch.uint8, device=self.device) for _ in range(2)
            )
            for size in sizes:
                count = max(8, min(1000, self.config.copy_budget_bytes // size))
                h2d = _copier(dev_in[:size], host_in[:size], count)
                d2h = _copier(host_out[:size], dev_out[:size], count)
                rows.append(CopyRow(memory, "h2d", size, self.median_seconds(h2d) / count))
                rows.append(CopyRow(memory, "d2h", size, self.median_seconds(d2h) / count))
                if self.copy_stream is not None:
                    both = self._concurrently(h2d, d2h)
                    rows.append(CopyRow(memory, "both", size, self.median_seconds(both) / count))
        return rows

    def _concurrently(
        self, first: Callable[[], None], second: Callable[[], None]
    ) -> Callable[[], None]:
        """Runs ``second`` on the copy stream while ``first`` runs on the current stream."""
        torch, stream = self.torch, self.copy_stream
        assert stream is not None

        def both() -> None:
            current = torch.cuda.current_stream(self.device)
            stream.wait_stream(current)
            with torch.cuda.stream(stream):
                second()
            first()
            current.wait_stream(stream)

        return both

    # -- the layer stack --

    def _random_layer(self) -> dict[str, Any]:
        torch, s = self.torch, self.spec
        q_dim, kv_dim = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim

        def weight(rows: int, cols: int) -> Any:
            return torch.randn(rows, cols, dtype=self.dtype, device=self.device) * rows**-0.5

        return {
            "norm1": torch.ones(s.hidden_size, dtype=self.dtype, device=self.device),
            "qkv": weight(s.hidden_size, q_dim + 2 * kv_dim),
            "o": weight(q_dim, s.hidden_size),
            "norm2": torch.ones(s.hidden_size, dtype=self.dtype, device=self.device),
            "gate_up": weight(s.hidden_size, 2 * s.intermediate_size),
            "down": weight(s.intermediate_size, s.hidden_size),
        }

    def _choose_attention_path(self) -> str:
        """'native' when SDPA takes GQA with a bottom-right causal mask here (flash attention
        on a GPU); else 'repeat' (K and V heads repeated before masked attention)."""
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right

        s = self.spec
        q = torch.randn(1, s.num_heads, 16, s.head_dim, dtype=self.dtype, device=self.device)
        kv = torch.randn(1, s.num_kv_heads, 48, s.head_dim, dtype=self.dtype, device=self.device)
        # On a GPU, only a fused kernel counts: the math fallback would materialise the
        # (queries × context) scores, gigabytes at 32k tokens.
        fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
        try:
            with sdpa_kernel(fused) if self.is_cuda else contextlib.nullcontext():
                native = torch.nn.functional.scaled_dot_product_attention(
                    q, kv, kv, attn_mask=causal_lower_right(16, 48), enable_gqa=True
                )
        except RuntimeError:
            return "repeat"
        group = s.num_heads // s.num_kv_heads
        reference = torch.nn.functional.scaled_dot_product_attention(
            q,
            kv.repeat_interleave(group, dim=1),
            kv.repeat_interleave(group, dim=1),
            attn_mask=causal_lower_right(16, 48),
        )
        return "native" if torch.allclose(native, reference, atol=2e-2, rtol=2e-2) else "repeat"

    def _attention(self, q: Any, k: Any, v: Any, start: int) -> Any:
        """q [n, heads, d]; k, v [start + n, kv heads, d]; causal, the new tokens last."""
        torch = self.torch
        from torch.nn.attention.bias import causal_lower_right

        n = q.shape[0]
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if start == 0:
            out = sdpa(q, k, v, is_causal=True, enable_gqa=True)
        elif n == 1:
            out = sdpa(q, k, v, enable_gqa=True)  # one query sees the whole context
        elif self.attention_path == "native":
            out = sdpa(q, k, v, attn_mask=causal_lower_right(n, start + n), enable_gqa=True)
        else:
            group = self.spec.num_heads // self.spec.num_kv_heads
            k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
            out = sdpa(q, k, v, attn_mask=causal_lower_right(n, start + n))
        return out.squeeze(0).transpose(0, 1).reshape(n, -1)

    def _layer(self, index: int, x: Any, start: int) -> Any:
        torch, s, w = self.torch, self.spec, self.layers[index]
        n = x.shape[0]
        q_dim, kv_dim = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        h = _rms_norm(torch, x, w["norm1"])
        q, k, v = (h @ w["qkv"]).split([q_dim, kv_dim, kv_dim], dim=-1)
        cache = self.cache[index]
        cache[start : start + n, 0] = k.view(n, s.num_kv_heads, s.head_dim)
        cache[start : start + n, 1] = v.view(n, s.num_kv_heads, s.head_dim)
        context = cache[: start + n]
        attended = self._attention(
            q.view(n, s.num_heads, s.head_dim), context[:, 0], context[:, 1], start
        )
        x = x + attended @ w["o"]
        gate, up = (_rms_norm(torch, x, w["norm2"]) @ w["gate_up"]).chunk(2, dim=-1)
        return x + (torch.nn.functional.silu(gate) * up) @ w["down"]

    def forward(self, new_tokens: int, start: int, layer_ready: Sequence[Any] = ()) -> None:
        """Prefills ``new_tokens`` random hidden states after ``start`` cached tokens; waits for
        ``layer_ready[i]`` (a CUDA event) before layer i when given."""
        torch = self.torch
        x = torch.randn(new_tokens, self.spec.hidden_size, dtype=self.dtype, device=self.device)
        for i in range(len(self.layers)):
            if layer_ready:
                torch.cuda.current_stream(self.device).wait_event(layer_ready[i])
            x = self._layer(i, x, start)

    # -- onboarding plans --

    def _load(self, tokens: int) -> list[Any]:
        """Copies the first ``tokens`` of every layer from pinned host memory, one copy per
        layer per chunk, on the copy stream; returns one event per layer."""
        torch, chunk = self.torch, self.config.chunk_tokens
        events = []
        stream = self.copy_stream
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for cache, host in zip(self.cache, self.host, strict=True):
                for begin in range(0, tokens, chunk):
                    end = min(tokens, begin + chunk)
                    cache[begin:end].copy_(host[begin:end], non_blocking=True)
                if stream is not None:
                    event = torch.cuda.Event()
                    event.record(stream)
                    events.append(event)
        return events

    def onboard(self, prefix: int, reload_tokens: int, overlapped: bool = True) -> None:
        new = self.config.new_tokens
        if reload_tokens == 0:
            self.forward(prefix + new, 0)
            return
        events = self._load(reload_tokens)
        if not overlapped and events:
            torch = self.torch
            for event in events:
                torch.cuda.current_stream(self.device).wait_event(event)
            events = []
        self.forward(prefix - reload_tokens + new, reload_tokens, events)

    def measure_onboard(self, splits: dict[int, int]) -> list[OnboardRow]:
        rows = []
        new = self.config.new_tokens
        for prefix in self.config.prefixes:
            plans = [("recompute", 0, True), ("reload", prefix, True)]
            if self.is_cuda:
                plans.append(("reload_serial", prefix, False))
            if splits.get(prefix):
                plans.append(("split", splits[prefix], True))
            for plan, tokens, overlapped in plans:
                seconds = self.median_seconds(
                    functools.partial(self.onboard, prefix, tokens, overlapped)
                )
                rows.append(OnboardRow(prefix, new, plan, tokens, seconds))
        return rows

    def measure_prefill(self) -> list[PrefillSample]:
        c = self.config
        points = [(n, p) for n in c.prefill_new for p in c.prefill_cached]
        points += [(n, 0) for n in c.memory_new]
        return [
            PrefillSample(n, p, self.median_seconds(functools.partial(self.forward, n, p)))
            for n, p in points
        ]


def _copier(destination: Any, source: Any, count: int) -> Callable[[], None]:
    def copy() -> None:
        for _ in range(count):
            destination.copy_(source, non_blocking=True)

    return copy


def _rms_norm(torch: Any, x: Any, weight: Any, eps: float = 1e-5) -> Any:
    scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (x.float() * scale).to(x.dtype) * weight


# --- the run ----------------------------------------------------------------------------------


def run(config: BenchConfig) -> tuple[dict[str, Any], Calibration]:
    spec = bench_model_spec(config.shape, config.layers)
    began = time.perf_counter()
    runner = TorchRunner(config, spec)
    if config.gpu is not None:
        gpu = gpu_preset(config.gpu)
    elif runner.is_cuda:
        gpu = gpu_preset(guess_gpu(runner.device_name) or "h200")
    else:
        gpu = CPU_SMOKE_GPU
    _say(
        f"gpu_tiers: rev {git_rev()}, torch {runner.torch.__version__}, "
        f"device {runner.device_name!r} (predicting for preset {gpu.name}), "
        f"stack {spec.name} x {spec.num_layers} layers, seed {config.seed}, "
        f"{config.repeats} runs per point (median), attention path {runner.attention_path}"
    )
    if not runner.is_cuda:
        _say("gpu_tiers: CPU smoke run: the numbers exercise the code, they mean nothing")
    copies = runner.measure_copies()
    _say(_copies_table(copies))
    prefill = runner.measure_prefill()
    calibration, stats = calibrate(spec, gpu, copies, prefill, config.chunk_tokens)
    calibrated = CostModel(spec, gpu, coefficients=calibration.coefficients)
    default = CostModel(spec, gpu, coefficients=Coefficients(chunk_tokens=config.chunk_tokens))
    _say(_calibration_text(calibration, stats))
    measured = runner.measure_onboard(planned_splits(calibrated, config))
    predictions = prediction_rows(calibrated, default, measured)
    decisions = decision_rows(calibrated, measured, config.block_tokens)
    accuracy = summary(predictions)
    _say(_predictions_table(predictions))
    _say(_decisions_table(decisions))
    _say(
        f"predictions within ±{ACCURACY_BAND:.0%}: {accuracy.get('within_band', 0):.0%}, "
        f"median |error| {accuracy.get('median_abs_error', 0):.1%}, "
        f"worst {accuracy.get('max_abs_error', 0):.1%}; "
        f"wall {time.perf_counter() - began:.0f} s"
    )
    return {
        "config": {k: _jsonable(v) for k, v in dataclasses.asdict(config).items()},
        "git_revision": git_rev(),
        "torch": runner.torch.__version__,
        "device": runner.device_name,
        "gpu_preset": gpu.name,
        "attention_path": runner.attention_path,
        "spec": {k: _jsonable(v) for k, v in dataclasses.asdict(spec).items()},
        "copies": [dataclasses.asdict(r) | {"bytes_per_s": r.bytes_per_s} for r in copies],
        "prefill": [dataclasses.asdict(r) for r in prefill],
        "calibration": json.loads(calibration.to_json()),
        "onboard": predictions,
        "decisions": decisions,
        "accuracy": accuracy,
    }, calibration


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    report, calibration = run(config)
    for path in write_outputs(config.out_dir, report, calibration):
        _say(f"wrote {path}")
    return 0


def _say(text: str) -> None:
    print(text, flush=True)


def _jsonable(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    if hasattr(value, "value"):  # enums
        return value.value
    return value


def _copies_table(copies: Sequence[CopyRow]) -> str:
    rows = [
        (r.memory, r.direction, r.chunk_bytes, r.seconds_per_copy * 1e6, r.bytes_per_s / 1e9)
        for r in copies
    ]
    return format_table(("memory", "direction", "bytes", "us/copy", "GB/s"), rows)


def _calibration_text(calibration: Calibration, stats: dict[str, float]) -> str:
    c = calibration.coefficients
    return (
        f"calibration: prefill efficiency {c.prefill_efficiency:.3f}, attention coefficient "
        f"{c.attention_coefficient:.3f}, overhead {c.iteration_overhead_s * 1e3:.2f} ms, "
        f"HBM efficiency {c.memory_efficiency:.3f}, host link efficiency "
        f"{c.host_link_efficiency:.3f}, copy latency {c.host_chunk_latency_s * 1e6:.2f} us; "
        f"prefill fit MAPE {stats['prefill_mape']:.1%}, max {stats['prefill_max_error']:.1%}"
    )


def _predictions_table(predictions: Sequence[dict[str, Any]]) -> str:
    rows = [
        (
            r["prefix_tokens"],
            r["plan"],
            r["reload_tokens"],
            r["measured_s"] * 1e3,
            r["predicted_s"] * 1e3,
            r["ratio"],
            r["predicted_default_s"] * 1e3,
            r["within_band"],
        )
        for r in predictions
    ]
    header = ("prefix", "plan", "reloaded", "measured ms", "model ms", "model/meas", "default ms")
    return format_table((*header, "±15%"), rows)


def _decisions_table(decisions: Sequence[dict[str, Any]]) -> str:
    rows = [
        (
            d["prefix_tokens"],
            d["model_pick"],
            d["measured_fastest"],
            d["pick_vs_fastest"],
            d["pick_vs_reload_always"] if d["pick_vs_reload_always"] is not None else "-",
        )
        for d in decisions
    ]
    header = ("prefix", "model picks", "fastest measured", "pick/fastest", "pick/reload-always")
    return format_table(header, rows)


if __name__ == "__main__":
    sys.exit(main())
