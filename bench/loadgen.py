"""How many streamed requests per second `kvtide load`'s client can read on this machine,
beside the official `openai` async client reading the same streams in the same run.

    nice -n 10 python bench/loadgen.py --requests 2000 --concurrency 64 --tokens 16 --runs 3

The server is a separate process: aiohttp streaming pre-built vLLM-shaped chunks with no delay
(a role chunk, one chunk per token, a finish chunk, usage, [DONE]), so the client side is what
saturates. Both clients share the 2 cores with that server: the numbers are a floor for the
client, and tell whether one `kvtide load` can drive an engine at the rate claimed for it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import statistics
import time
from typing import Any

import aiohttp
import openai
from aiohttp import web

from kvtide.cli.processes import free_port
from kvtide.loadgen.client import stream
from revision import git_rev


def serve(port: int, tokens: int) -> None:
    role = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
    }
    chunks = [b"data: " + json.dumps(role).encode() + b"\n\n"]
    for i in range(tokens):
        c = {
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}],
        }
        chunks.append(b"data: " + json.dumps(c).encode() + b"\n\n")
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": tokens,
        "total_tokens": 10 + tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    chunks.append(
        b"data: "
        + json.dumps({"object": "chat.completion.chunk", "choices": [], "usage": usage}).encode()
        + b"\n\n"
    )
    chunks.append(b"data: [DONE]\n\n")

    async def complete(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(chunk)  # one write per chunk, as an engine streams token by token
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


BODY: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 16,
    "stream": True,
    "stream_options": {"include_usage": True},
}


async def kvtide_client(url: str, requests: int, concurrency: int) -> tuple[float, int]:
    limit = asyncio.Semaphore(concurrency)
    ok = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> None:
            nonlocal ok
            async with limit:
                out = await stream(session, f"{url}/v1/chat/completions", BODY, {}, 30.0)
                ok += out.ok

        start = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for _ in range(requests):
                group.create_task(one())
        return time.perf_counter() - start, ok


async def openai_client(url: str, requests: int, concurrency: int) -> tuple[float, int]:
    limit = asyncio.Semaphore(concurrency)
    ok = 0
    async with openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=30.0
    ) as client:

        async def one() -> None:
            nonlocal ok
            async with limit:
                text = ""
                first = None
                async for chunk in await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=16,
                    stream=True, stream_options={"include_usage": True},
                ):  # fmt: skip
                    if chunk.choices and chunk.choices[0].delta.content:
                        first = first or time.perf_counter()
                        text += chunk.choices[0].delta.content
                ok += bool(text)

        start = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for _ in range(requests):
                group.create_task(one())
        return time.perf_counter() - start, ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    BODY["max_tokens"] = args.tokens
    rev = git_rev()
    print(
        f"git {rev}  requests {args.requests}  concurrency {args.concurrency}  "
        f"tokens {args.tokens}  runs {args.runs}"
    )
    port = free_port()
    server = multiprocessing.Process(target=serve, args=(port, args.tokens), daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        rates: dict[str, list[float]] = {"kvtide": [], "openai": []}
        for _ in range(args.runs):
            for name, fn in (("kvtide", kvtide_client), ("openai", openai_client)):
                took, ok = asyncio.run(fn(url, args.requests, args.concurrency))
                assert ok == args.requests, f"{name}: {ok} of {args.requests} streams complete"
                rates[name].append(args.requests / took)
        med = {k: statistics.median(v) for k, v in rates.items()}
        for name, values in rates.items():
            print(
                f"{name:>7}: {med[name]:8.0f} streamed req/s "
                f"(median; runs {', '.join(f'{v:.0f}' for v in values)})"
            )
        print(f"kvtide / openai: {med['kvtide'] / med['openai']:.2f}x")
    finally:
        server.terminate()
        server.join(timeout=10)


if __name__ == "__main__":
    main()
