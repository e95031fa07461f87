"""`kvtide cost`: KV size, prefill throughput, and reload versus recompute for a model on a GPU."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kvtide.cli._checks import TP, check_writable, write_text
from kvtide.cli.tables import Column, make_console, print_table
from kvtide.costs.calibration import load_calibration
from kvtide.costs.cost_model import Coefficients, CostModel
from kvtide.costs.memory import memory_fit
from kvtide.costs.onboard import OnboardAction, break_even_prefix_tokens
from kvtide.costs.specs import GPU_PRESETS, MODEL_PRESETS, gpu_preset, resolve_model
from kvtide.display import plural
from kvtide.errors import ConfigError
from kvtide.quantities import flag, real, tokens
from kvtide.types import Tier

PROMPT_TOKENS = tuple(512 << i for i in range(9))
"""Prompt lengths of the table: 512, 1k, 2k, ..., 128k tokens."""
THROUGHPUT_PROMPT_TOKENS = 4096


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "cost",
        help="reload vs recompute times for a model on a GPU",
        description=(
            "Prints KV bytes per token, prefill throughput and, for prompts of 512 to 128k "
            "tokens whose prefix sits in host memory or on disk, the time to recompute it, to "
            "reload it, and the cost model's decision (reload, recompute or split)."
        ),
    )
    add_model_arguments(parser)
    parser.add_argument(
        "--link-load",
        type=flag(real, minimum=0.0, below=1.0),
        default=0.0,
        metavar="X",
        help="fraction of the host/disk link already in use, 0 to 1 (default 0)",
    )
    parser.add_argument(
        "--new-tokens",
        type=flag(tokens, minimum=1, maximum=PROMPT_TOKENS[0] - 1),
        default=1,
        metavar="N",
        help="uncached tokens at the end of each prompt (default 1: the last prompt token "
        "is always computed)",
    )
    parser.add_argument(
        "--block-tokens",
        type=flag(tokens, minimum=1, maximum=PROMPT_TOKENS[-1]),
        default=16,
        metavar="N",
        help="cache block size: a split reloads whole blocks (default 16, vLLM's default)",
    )
    parser.add_argument(
        "--calibration", type=Path, metavar="FILE", help="coefficients from kvtide calibrate"
    )
    parser.add_argument("--json", type=Path, metavar="FILE", dest="json_path", help="write JSON")
    parser.set_defaults(func=run)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--model, --gpu, --tp, --dtype: shared by `kvtide cost` and `kvtide calibrate`."""
    parser.add_argument(
        "--model",
        required=True,
        metavar="M",
        help=f"model preset ({', '.join(sorted(MODEL_PRESETS))}) or a path to a Hugging Face "
        "config.json",
    )
    parser.add_argument(
        "--gpu", required=True, metavar="G", help=f"GPU preset: {', '.join(sorted(GPU_PRESETS))}"
    )
    parser.add_argument("--tp", type=TP, default=1, metavar="N", help="tensor-parallel degree")
    parser.add_argument(
        "--dtype", default="bf16", metavar="D", help="KV-cache dtype: bf16 or fp8 (default bf16)"
    )


def run(args: argparse.Namespace) -> int:
    check_writable(args.json_path, "--json")
    coefficients = Coefficients()
    source = "defaults (assumed; see kvtide calibrate)"
    gpu = gpu_preset(args.gpu)
    if args.calibration is not None:
        calibration = load_calibration(args.calibration)
        coefficients = calibration.coefficients
        source = f"{args.calibration} ({calibration.model} on {calibration.gpu})"
        if calibration.gpu != gpu.name:
            print(
                f"kvtide: note: calibration measured on {calibration.gpu}, applied to {gpu.name}",
                file=sys.stderr,
            )
    cost = CostModel(resolve_model(args.model), gpu, args.tp, args.dtype, coefficients)
    fit = memory_fit(cost, 0)
    if not fit.weights_fit:
        print(f"kvtide: warning: {fit.describe()}: the weights alone do not fit", file=sys.stderr)
    report = cost_report(cost, args.link_load, args.new_tokens, args.block_tokens)
    print_report(report, source)
    if args.json_path is not None:
        write_text(args.json_path, json.dumps(report, indent=2) + "\n")
    return 0


def cost_report(
    cost: CostModel, link_load: float, new_tokens: int = 1, block_tokens: int = 16
) -> dict[str, Any]:
    """The numbers `kvtide cost` prints, as the JSON document it writes."""
    if not 0.0 <= link_load < 1.0:
        raise ConfigError(f"--link-load must lie in [0, 1), got {link_load}")
    if new_tokens < 1 or new_tokens >= PROMPT_TOKENS[0]:
        raise ConfigError(f"--new-tokens must lie in [1, {PROMPT_TOKENS[0] - 1}]")
    if block_tokens < 1:
        raise ConfigError("--block-tokens must be >= 1")
    rows = []
    for prompt in PROMPT_TOKENS:
        cached = prompt - new_tokens
        host, disk = (
            cost.decide_onboard(
                cached,
                tier,
                new_tokens,
                link_load,
                block_tokens=block_tokens,
                with_break_even=False,
            )
            for tier in (Tier.HOST, Tier.DISK)
        )
        rows.append(
            {
                "prompt_tokens": prompt,
                "recompute_s": host.recompute_s,
                "reload_host_s": host.reload_s,
                "reload_disk_s": disk.reload_s,
                "decision": str(host.action),
                "decision_disk": str(disk.action),
                "best_host_s": host.time_s,
                "best_disk_s": disk.time_s,
                "reload_tokens_host": host.reload_tokens,
                "reload_tokens_disk": disk.reload_tokens,
                "break_even_host_bytes_per_s": _finite_or_none(host.break_even_bytes_per_s),
            }
        )
    return {
        "model": cost.model.name,
        "gpu": cost.gpu.name,
        "tp": cost.tp,
        "dtype": cost.dtype,
        "link_load": link_load,
        "new_tokens": new_tokens,
        "block_tokens": block_tokens,
        "kv_bytes_per_token": cost.kv_bytes_per_token,
        "prefill_tokens_per_s": cost.prefill_tokens_per_s(THROUGHPUT_PROMPT_TOKENS),
        "host_bytes_per_s": cost.link_bytes_per_s(Tier.HOST, link_load),
        "disk_bytes_per_s": cost.link_bytes_per_s(Tier.DISK, link_load),
        "break_even_prefix_tokens": {
            "host": break_even_prefix_tokens(cost, Tier.HOST, new_tokens, link_load),
            "disk": break_even_prefix_tokens(cost, Tier.DISK, new_tokens, link_load),
        },
        "coefficients": cost.coefficients.to_dict(),
        "rows": rows,
    }


def print_report(report: dict[str, Any], coefficients_source: str) -> None:
    console = make_console()
    kv = report["kv_bytes_per_token"]
    pays = report["break_even_prefix_tokens"]
    console.print(
        f"{report['model']} on {report['tp']} × {report['gpu']}, KV {report['dtype']}, "
        f"link load {report['link_load']:.0%}, {plural(report['new_tokens'], 'new token')} per "
        "prompt"
    )
    console.print(f"KV bytes per token   {kv:,} ({kv / 1024:,.1f} KiB)")
    console.print(
        f"prefill throughput   {report['prefill_tokens_per_s']:,.0f} tokens/s "
        f"({THROUGHPUT_PROMPT_TOKENS:,}-token prompt)"
    )
    console.print(
        f"usable KV rate       host {report['host_bytes_per_s'] / 1e9:,.1f} GB/s, "
        f"disk {report['disk_bytes_per_s'] / 1e9:,.1f} GB/s"
    )
    console.print(
        f"reload pays from     host {_tokens(pays['host'])}, disk {_tokens(pays['disk'])}"
    )
    console.print(f"coefficients         {coefficients_source}")
    console.print("times in seconds; a plan is reload, recompute, or split N%:")
    console.print("reload the first N% of the prompt while computing the rest")
    columns = [
        Column("recompute", "times"),
        Column("host\nreload", "times"),
        Column("disk\nreload", "times"),
        Column("host plan", "plans", left=True),
        Column("disk plan", "plans", left=True),
    ]
    rows = [
        [
            f"{row['prompt_tokens']:,}",
            f"{row['recompute_s']:.4f}",
            f"{row['reload_host_s']:.4f}",
            f"{row['reload_disk_s']:.4f}",
            _plan(row["decision"], row["reload_tokens_host"], row["prompt_tokens"]),
            _plan(row["decision_disk"], row["reload_tokens_disk"], row["prompt_tokens"]),
        ]
        for row in report["rows"]
    ]
    print_table(console, "prefix in host memory or on disk", [Column("prompt")], columns, rows)


def _plan(action: str, reload_tokens: int, prompt_tokens: int) -> str:
    if action != OnboardAction.SPLIT:
        return action
    share = f"{reload_tokens / prompt_tokens:.0%}"
    # A split always leaves something on both sides: never print it as 0% or 100%.
    return "split " + {"0%": "<1%", "100%": ">99%"}.get(share, share)


def _tokens(value: int | None) -> str:
    if value is None:
        return "never (up to 4M tokens)"
    return f"{value:,} token{'' if value == 1 else 's'}"


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and value != float("inf") else None
