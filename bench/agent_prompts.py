"""Agents with tools through `kvtide serve` in front of emulated engines whose tokenizer has a
tool-aware chat template, against other gateway checkouts in the same run.

    python bench/agent_prompts.py [--compare LABEL=SRC_DIR ...] [--runs 3] [--json out.json]

``--agents`` agents (three tool sets, one system prompt) each run ``--turns`` turns: a user
message, then an assistant tool call and its result appended to the history, with ``--tools``
tools in every request. Eight run at once, in front of ``--engines`` `kvtide engine`s (main's
code, ``--kv-cache-tokens`` each, KV events on) with the template of
``tests/chat_templates.py``. Per gateway (this checkout's ``src``, then each ``--compare``'s,
e.g. an older revision as a peer) and run: the cached-token ratio the engines report, the hits
the gateway predicted over the hits served, and how many requests the gateway counted other
prompt tokens for than the engine did (a gateway that renders the tools otherwise than the
engine; a request routed on its head alone is an estimate, ``gateway.heads``). Medians of
``--runs``; bad flags exit 2 naming the flag.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai

from revision import git_rev

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "integration")]
from engine_process import Engine  # noqa: E402
from tests.chat_templates import write_tokenizer_dir  # noqa: E402
from tests.integration.gateway.procs import (  # noqa: E402
    access_log_lines,
    emulated_engines,
    wait_http,
)

from kvtide.cli.processes import free_port  # noqa: E402

WORDS = [
    "ship",
    "parcel",
    "route",
    "depot",
    "north",
    "south",
    "invoice",
    "customer",
    "order",
    "fast",
    "slow",
]


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def agents(n: int, turns: int, tools: int, seed: int) -> list[dict[str, Any]]:
    """Each agent's tools and, per turn, its question and its tool's result."""
    rng = random.Random(seed)
    toolsets = [
        [
            {
                "type": "function",
                "function": {
                    "name": f"tool_{k}_{i}",
                    "description": _words(rng, 60),
                    "parameters": {
                        "type": "object",
                        "properties": {"q": {"type": "string", "description": _words(rng, 20)}},
                    },
                },
            }
            for i in range(tools)
        ]
        for k in range(3)
    ]
    return [
        {
            "id": a,
            "tools": toolsets[a % 3],
            "questions": [f"agent {a}: {_words(rng, 40)}" for _ in range(turns)],
            "results": [_words(rng, 60) for _ in range(turns)],
        }
        for a in range(n)
    ]


def run_agent(url: str, system: str, agent: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
    history: list[dict[str, Any]] = [{"role": "system", "content": system}]
    try:
        for t, question in enumerate(agent["questions"]):
            history.append({"role": "user", "content": question})
            client.chat.completions.create(
                model="emu",
                messages=history,  # type: ignore[arg-type]
                tools=agent["tools"],
                max_tokens=8,
            )
            tool = agent["tools"][t % len(agent["tools"])]["function"]["name"]
            call = {
                "id": f"call_{agent['id']}_{t}",
                "type": "function",
                "function": {"name": tool, "arguments": json.dumps({"q": question[:30]})},
            }
            history.append({"role": "assistant", "content": None, "tool_calls": [call]})
            history.append(
                {"role": "tool", "tool_call_id": call["id"], "content": agent["results"][t]}
            )
            time.sleep(0.3)  # the agent's own work: the engines' KV events land meanwhile
    finally:
        client.close()


def summarize(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's numbers from the gateway's access log lines."""
    prompt = sum(line["engine_prompt_tokens"] or 0 for line in lines)
    cached = sum(line["cached_tokens"] or 0 for line in lines)
    predicted = sum(line["predicted_cached_tokens"] or 0 for line in lines)
    return {
        "requests": len(lines),
        "errors": sum(line["status"] != 200 for line in lines),
        "cached_ratio": cached / prompt if prompt else 0.0,
        "predicted_over_served": predicted / cached if cached else 0.0,
        "prompt_count_mismatches": sum(
            line["prompt_tokens"] != line["engine_prompt_tokens"] for line in lines
        ),
    }


def one_run(src: Path, tokenizer: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    engines: list[Engine] = []
    gateway: subprocess.Popen[bytes] | None = None
    log = tmp / f"access-{time.monotonic_ns()}.jsonl"
    try:
        engines += emulated_engines(
            args.engines, "--tokenizer", tokenizer, "--kv-cache-tokens", str(args.kv_cache_tokens)
        )
        port = free_port()
        cmd = [sys.executable, "-m", "kvtide", "serve", "--port", str(port), "--tokenizer",
               tokenizer, "--access-log", str(log)]  # fmt: skip
        for e in engines:
            cmd += ["--replica", f"{e.url}=emu,events={e.events},replay={e.replay}"]
        env = dict(os.environ, PYTHONPATH=str(src))
        gateway = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/ready", 30.0)
        system = "You are a logistics agent. " + _words(random.Random(args.seed), 150)
        plan = agents(args.agents, args.turns, args.tools, args.seed)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda a: run_agent(url, system, a), plan))
        return summarize(access_log_lines(log, args.agents * args.turns, timeout_s=20.0))
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(20)
        for e in engines:
            e.stop()


def _positive_of(flag: str) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be an integer >= 1, got {value!r}")
        return n

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    for flag, default in (("--agents", 24), ("--turns", 6), ("--tools", 3), ("--engines", 4),
                          ("--runs", 3), ("--kv-cache-tokens", 24_576)):  # fmt: skip
        p.add_argument(flag, type=_positive_of(flag), default=default)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare", action="append", default=[], metavar="LABEL=SRC_DIR")
    p.add_argument("--json", type=Path)
    return p


def main() -> None:
    p = parser()
    args = p.parse_args()
    gateways = {"this checkout": ROOT / "src"}
    for spec in args.compare:
        label, _, src = spec.partition("=")
        if not label or not (Path(src) / "kvtide" / "__init__.py").is_file():
            p.error(f"--compare: {spec!r} is not LABEL=SRC_DIR with SRC_DIR/kvtide in it")
        gateways[label] = Path(src).resolve()
    print(f"agent_prompts: rev {git_rev()} {vars(args)}")
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in gateways}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = str(write_tokenizer_dir(Path(tmp) / "tok"))
        for run in range(args.runs):  # gateways interleaved: the machine's drift hits all
            for label, src in gateways.items():
                results[label].append(one_run(src, tokenizer, args, Path(tmp)))
                r = results[label][-1]
                print(f"  run {run} {label}: {json.dumps(r)}", flush=True)
    print("medians:")
    for label, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"  {label}: cached {med['cached_ratio']:.1%}, predicted/served "
            f"{med['predicted_over_served']:.2f}, prompt counts differing "
            f"{med['prompt_count_mismatches']:.0f} of {med['requests']:.0f}, "
            f"errors {med['errors']:.0f}"
        )
    if args.json:
        args.json.write_text(json.dumps({"config": {**vars(args), "json": str(args.json)},
                                         "runs": results}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
