"""Gateway CPU per proxied request and added latency, against a bare aiohttp pass-through
proxy on the same HTTP stack in the same run.

    nice python bench/gateway_cpu.py --requests 3000 --concurrency 16 [--stream] [--json out.json]

Starts a zero-latency OpenAI-shaped backend, then `kvtide serve` (policy ``--policy``, text
mode) and the bare proxy (no parsing, no routing: the stack's floor) in front of it, one at a
time, and drives ``--requests`` chat requests with ``--prompt-chars`` of shared-prefix prompt at
``--concurrency`` from an aiohttp client; ``--tokenizer smollm2`` runs the gateway in token
mode (chat template + tokenization per request, conversation prefixes cached). CPU is the
gateway process's user+system time (/proc/PID/stat) over the run divided by the requests;
latency is the client's, with the backend direct as the baseline. Prints medians of
``--runs`` runs and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"tok "}}]}\n\n'
BODY = json.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_backend(port: int) -> None:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.Response(body=BODY, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(16):
            await resp.write(CHUNK)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", ok)
    app.router.add_get("/metrics", ok)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def serve_bare_proxy(port: int, upstream: str) -> None:
    """The floor: aiohttp server + pooled aiohttp client, bytes in, bytes out."""

    async def lifespan(app: web.Application):  # type: ignore[no-untyped-def]
        app["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        yield
        await app["s"].close()

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def proxy(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with request.app["s"].post(
            upstream + request.path, data=body, headers={"Content-Type": "application/json"}
        ) as up:
            out = web.StreamResponse(
                status=up.status, headers={"Content-Type": up.headers["Content-Type"]}
            )
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    app = web.Application()
    app.cleanup_ctx.append(lifespan)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", proxy)
    import uvloop

    web.run_app(
        app, host="127.0.0.1", port=port, print=None, access_log=None, loop=uvloop.new_event_loop()
    )


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_up(url: str) -> None:
    import urllib.request

    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(url)


async def drive(url: str, n: int, conc: int, prompt_chars: int, stream: bool) -> list[float]:
    lat: list[float] = []
    system = ("You are a helpful assistant. " * (prompt_chars // 29 + 1))[:prompt_chars]
    queue = list(range(n))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def worker() -> None:
            while queue:
                i = queue.pop()
                body = {
                    "model": "m",
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"question {i % 64}"},
                    ],
                    "max_tokens": 16,
                    "stream": stream,
                }
                t0 = time.perf_counter()
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    await r.read()
                    assert r.status == 200, r.status
                lat.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker() for _ in range(conc)))
    return lat


def measure(
    label: str, url: str, pid: int | None, args: argparse.Namespace
) -> tuple[float, float, float]:
    asyncio.run(drive(url, 200, args.concurrency, args.prompt_chars, args.stream))  # warm up
    c0 = cpu_s(pid) if pid else 0.0
    lat = asyncio.run(drive(url, args.requests, args.concurrency, args.prompt_chars, args.stream))
    c1 = cpu_s(pid) if pid else 0.0
    lat.sort()
    p50 = lat[len(lat) // 2] * 1e3
    p99 = lat[int(len(lat) * 0.99)] * 1e3
    us = (c1 - c0) / args.requests * 1e6
    print(f"  {label:<14} p50 {p50:7.3f} ms  p99 {p99:7.3f} ms  cpu {us:7.1f} us/req", flush=True)
    return p50, p99, us


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--prompt-chars", type=int, default=2000)
    p.add_argument("--policy", default="cost")
    p.add_argument("--tokenizer", help="passed to kvtide serve (e.g. smollm2): token mode")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--json")
    p.add_argument("--serve-backend", type=int, help=argparse.SUPPRESS)
    p.add_argument("--serve-bare", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_backend:
        return serve_backend(args.serve_backend)
    if args.serve_bare:
        return serve_bare_proxy(int(args.serve_bare[0]), args.serve_bare[1])
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(
        f"gateway_cpu: rev {rev.stdout.strip()} requests {args.requests} concurrency "
        f"{args.concurrency} prompt {args.prompt_chars} chars stream {args.stream} "
        f"policy {args.policy} tokenizer {args.tokenizer} runs {args.runs}"
    )
    bport, gport, xport = free_port(), free_port(), free_port()
    me = [sys.executable, __file__]
    procs = [subprocess.Popen([*me, "--serve-backend", str(bport)])]
    backend = f"http://127.0.0.1:{bport}"
    try:
        wait_up(backend + "/health")
        gw = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvtide",
                "serve",
                "--port",
                str(gport),
                "--replica",
                backend,
                "--policy",
                args.policy,
            ]
        )
        bare = subprocess.Popen([*me, "--serve-bare", str(xport), backend])
        procs += [gw, bare]
        wait_up(f"http://127.0.0.1:{gport}/health")
        wait_up(f"http://127.0.0.1:{xport}/health")
        results: dict[str, list[tuple[float, float, float]]] = {
            "direct": [],
            "bare": [],
            "kvtide": [],
        }
        for run in range(args.runs):
            print(f"run {run + 1}")
            results["direct"].append(measure("direct", backend, None, args))
            results["bare"].append(
                measure("bare proxy", f"http://127.0.0.1:{xport}", bare.pid, args)
            )
            results["kvtide"].append(
                measure("kvtide serve", f"http://127.0.0.1:{gport}", gw.pid, args)
            )
        med = {
            k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in results.items()
        }
        d, b, k = med["direct"], med["bare"], med["kvtide"]
        print("medians:")
        print(f"  added p50: bare {b[0] - d[0]:.3f} ms, kvtide {k[0] - d[0]:.3f} ms")
        print(f"  added p99: bare {b[1] - d[1]:.3f} ms, kvtide {k[1] - d[1]:.3f} ms")
        print(f"  cpu/req:   bare {b[2]:.1f} us, kvtide {k[2]:.1f} us, ratio {k[2] / b[2]:.2f}")
        if args.json:
            out = {
                "config": vars(args),
                "rev": rev.stdout.strip(),
                "median": med,
                "runs": results,
            }
            Path(args.json).write_text(json.dumps(out, indent=2))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
