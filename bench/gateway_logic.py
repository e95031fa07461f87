"""The gateway's own work per request, without HTTP: parse, prompt identity, route, book.

    nice python bench/gateway_logic.py [--tokenizer smollm2] [--policy cost] [--json out.json]

Text mode: chat requests with a ``--prompt-chars`` shared system prompt through
``Gateway``'s parts (orjson, text chunks, ``routing.Router``, shadow index), beside the same
path under ``round_robin`` (the routing policy's share). Token mode (``--tokenizer``): the
same for ~2k-token conversations, first turns with a new system prompt (cold), first turns
sharing one, first turns of one message opening with a shared preamble (the chunk memo's
case), and turns 2-5 resending history (turn 2 also apart: it tokenizes what a first
turn routed on its head left, ``gateway.heads``), beside a peer that renders and tokenizes
the whole prompt every time (what vllm-router's workers do). Medians of ``--runs`` runs, in
us.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import orjson

from kvtide.gateway.app import Gateway
from kvtide.gateway.config import GatewayConfig, ReplicaSpec
from revision import git_rev

WORDS = [
    "the",
    "parcel",
    "ship",
    "depot",
    "route",
    "north",
    "south",
    "fast",
    "slow",
    "customer",
    "order",
    "invoice",
]


def gateway(policy: str, tokenizer: str | None) -> Gateway:
    replicas = tuple(ReplicaSpec.parse(f"http://127.0.0.1:{9000 + i}=m") for i in range(4))
    return Gateway(GatewayConfig(policy=policy, tokenizer=tokenizer, replicas=replicas))


def step(gw: Gateway, raw: bytes, i: int) -> None:
    body = orjson.loads(raw)
    prompt = gw.prompt(body, True, gw.seed("m", ""))  # whole, or a head (gateway.heads)
    route = gw.route_request(prompt, gw.tenants.default, 16, f"r{i}")
    chosen = gw.choose(route, "m")  # candidates, router, metrics, shadow index
    assert chosen is not None
    _, decision = chosen
    gw.router.prefill_done(route, decision, decision.cached_tokens)  # as the engine reports it
    gw.router.complete(route, decision, 0)
    orjson.dumps(body)


def timed(gw: Gateway, bodies: list[bytes]) -> float:
    """Median microseconds per request over ``bodies`` (in order: conversations grow)."""
    out = []
    for i, raw in enumerate(bodies):
        t0 = time.perf_counter()
        step(gw, raw, i)
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e6


def _body(messages: list[dict[str, str]]) -> bytes:
    return orjson.dumps({"model": "m", "messages": messages, "max_tokens": 16})


def text_mode(args: argparse.Namespace) -> dict[str, Any]:
    system = ("You are a helpful assistant. " * (args.prompt_chars // 29 + 1))[: args.prompt_chars]
    bodies = [
        _body([{"role": "system", "content": system}, {"role": "user", "content": f"q {i % 64}"}])
        for i in range(args.requests)
    ]
    runs: dict[str, list[float]] = {args.policy: [], "round_robin": []}
    for _ in range(args.runs):
        for policy in runs:
            gw = gateway(policy, None)
            timed(gw, bodies[:200])
            runs[policy].append(timed(gw, bodies))
    return {k: statistics.median(v) for k, v in runs.items()}


def peer_us(gw: Gateway, bodies: list[bytes]) -> float:
    """Median microseconds to render and tokenize each body's whole prompt, every time (what
    vllm-router's workers do), through the gateway's tokenizer without its chunk memo."""
    tok = gw.prompts.tokenizer
    assert tok is not None
    out = []
    for raw in bodies:
        msgs = orjson.loads(raw)["messages"]
        t0 = time.perf_counter()
        tok.encode(tok.apply_chat_template(msgs, add_generation_prompt=True), False)
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e6


def token_mode(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    system = words(1900)
    cold = [
        _body([{"role": "system", "content": f"{i} {system}"}, {"role": "user", "content": "q"}])
        for i in range(40)
    ]
    shared = [
        _body([{"role": "system", "content": system}, {"role": "user", "content": words(30)}])
        for _ in range(40)
    ]
    # one user message opening with a shared preamble (no system message): the conversation
    # cache has nothing to reuse, the tokenizer's chunk memo (text.chunk_memo) does
    pasted = [_body([{"role": "user", "content": f"{system} {words(30)}"}]) for _ in range(40)]
    turns: list[bytes] = []
    for c in range(20):
        msgs = [{"role": "system", "content": f"c{c} {system}"}]
        for _ in range(5):
            msgs.append({"role": "user", "content": words(30)})
            turns.append(_body(msgs))
            msgs.append({"role": "assistant", "content": words(40)})
    later_idx = [i for i in range(len(turns)) if i % 5]
    out: dict[str, list[float]] = {
        "cold": [],
        "shared_system": [],
        "pasted_preamble": [],
        "pasted_peer": [],
        "later_turns": [],
        "second_turn": [],
        "turns_3_5": [],
        "peer": [],
    }
    for _ in range(args.runs):
        gw = gateway(args.policy, args.tokenizer)
        out["cold"].append(timed(gw, cold))
        timed(gw, shared[:1])
        out["shared_system"].append(timed(gw, shared[1:]))
        out["pasted_preamble"].append(timed(gw, pasted))
        per: list[float] = []
        by_turn: dict[int, list[float]] = {}
        for i, raw in enumerate(turns):
            t0 = time.perf_counter()
            step(gw, raw, 10_000 + i)
            if i in later_idx:
                per.append(time.perf_counter() - t0)
                by_turn.setdefault(i % 5, []).append(per[-1])
        out["later_turns"].append(statistics.median(per) * 1e6)
        # a second turn pays for what its first did not tokenize (a head: gateway.heads)
        out["second_turn"].append(statistics.median(by_turn[1]) * 1e6)
        out["turns_3_5"].append(statistics.median(by_turn[2] + by_turn[3] + by_turn[4]) * 1e6)
        out["peer"].append(peer_us(gw, [turns[i] for i in later_idx]))
        out["pasted_peer"].append(peer_us(gw, pasted))
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--policy", default="cost")
    p.add_argument("--tokenizer")
    p.add_argument("--prompt-chars", type=int, default=2000)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    args = p.parse_args()
    rev = git_rev()
    print(f"gateway_logic: rev {rev} {vars(args)}")
    if args.tokenizer:
        res = token_mode(args)
        print(
            f"token mode, us a request:\n"
            f"  cold first turn {res['cold']:.0f}, first turn sharing a system prompt "
            f"{res['shared_system']:.0f}\n"
            f"  first turn, one message opening with a shared preamble "
            f"{res['pasted_preamble']:.0f} (peer: render + tokenize it {res['pasted_peer']:.0f})\n"
            f"  turns 2-5 {res['later_turns']:.0f} (turn 2 {res['second_turn']:.0f}, "
            f"turns 3-5 {res['turns_3_5']:.0f})\n"
            f"  peer (render + tokenize all, no routing) {res['peer']:.0f}: turns 2-5 at "
            f"{res['later_turns'] / res['peer']:.2f}x the peer"
        )
    else:
        res = text_mode(args)
        print(
            f"text mode us/request: {args.policy} {res[args.policy]:.0f}, round_robin "
            f"{res['round_robin']:.0f} (policy share {res[args.policy] - res['round_robin']:.0f})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"config": vars(args), "result": res}, indent=2))


if __name__ == "__main__":
    main()
