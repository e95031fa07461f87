"""Which asyncio HTTP stack should the servers use? A minimal streaming handler on each.

Each stack serves ``POST /v1/completions`` with 16 SSE chunks (``data: {...}``, then
``data: [DONE]``) and no other work; one client process drives it with keep-alive connections
for a few seconds. Reports requests/s and server CPU per request (user+sys from /proc), the
median of ``--runs`` runs per stack, and each stack's ratio to the best.

    python bench/http_stack.py --seconds 3 --runs 3 --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kvtide.cli.processes import free_port
from revision import git_rev

CHUNK = b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" x"}]}\n\n'
DONE = b"data: [DONE]\n\n"
NUM_CHUNKS = 16
STACKS = ("aiohttp", "uvicorn", "granian", "granian-embed")


# --- the minimal servers ------------------------------------------------------------------


async def asgi_app(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    """Raw ASGI: read the body, stream the chunks."""
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        msg = await receive()
        more = msg.get("more_body", False)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    for _ in range(NUM_CHUNKS):
        await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
    await send({"type": "http.response.body", "body": DONE, "more_body": False})


def serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(NUM_CHUNKS):
            await resp.write(CHUNK)
        await resp.write(DONE)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def serve_uvicorn(port: int) -> None:
    import uvicorn

    uvicorn.run(
        "bench.http_stack:asgi_app",
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        lifespan="off",
    )


def serve_granian(port: int) -> None:
    os.execvp(
        sys.executable,
        [
            sys.executable,
            "-m",
            "granian",
            "--interface",
            "asgi",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--no-ws",
            "--log-level",
            "warning",
            "--no-access-log",
            "--http",
            "1",
            "bench.http_stack:asgi_app",
        ],
    )


def serve_granian_embed(port: int) -> None:
    """Granian's embedded server: its Rust I/O threads under this process's own event loop
    (what an app that owns its loop, like the engine server, would use)."""
    import uvloop
    from granian.constants import Interfaces
    from granian.server.embed import Server

    server = Server(
        asgi_app,
        port=port,
        interface=Interfaces.ASGINL,
        websockets=False,
        log_enabled=False,
    )
    uvloop.run(server.serve())


# --- the client ---------------------------------------------------------------------------

REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b'Content-Length: 49\r\n\r\n{"model":"m","prompt":"hi","max_tokens":16,"s":1}'
)


async def read_response(reader: asyncio.StreamReader) -> None:
    """One chunked (or sized) HTTP/1.1 response, body discarded."""
    head = await reader.readuntil(b"\r\n\r\n")
    lower = head.lower()
    if b"content-length:" in lower:
        n = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(n)
        return
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return


async def drive(
    port: int, seconds: float, concurrency: int, request: bytes = REQUEST
) -> tuple[int, float]:
    """Keep-alive connections sending one request after another; (responses, seconds)."""
    done = 0
    stop = time.perf_counter() + seconds

    async def one_conn() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < stop:
                writer.write(request)
                await read_response(reader)
                done += 1
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(one_conn() for _ in range(concurrency)))
    return done, time.perf_counter() - start


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def run_client(coro: Awaitable[tuple[int, float]]) -> tuple[int, float]:
    """The client on uvloop, so that it steals as little of the 2 cores as it can."""
    import uvloop

    async def wrap() -> tuple[int, float]:
        return await coro

    return uvloop.run(wrap())


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and all its live descendants (granian runs its
    workers as child processes)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                parents[int(name)] = int(_stat(int(name))[1])
            except (OSError, IndexError):
                continue
    tree, grew = {pid}, True
    while grew:
        more = {p for p, pp in parents.items() if pp in tree} - tree
        grew = bool(more)
        tree |= more
    ticks = 0
    for p in tree:
        try:
            ticks += sum(int(f) for f in _stat(p)[11:13])
        except OSError:
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def wait_listening(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


def measure(
    argv: list[str], port: int, seconds: float, concurrency: int, request: bytes = REQUEST
) -> tuple[float, float]:
    """Starts ``argv`` (a server on ``port``), drives it; (requests/s, CPU µs per request)."""
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        wait_listening(port)
        run_client(drive(port, 0.5, concurrency, request))  # warm-up
        before = cpu_s(proc.pid)
        done, elapsed = run_client(drive(port, seconds, concurrency, request))
        used = cpu_s(proc.pid) - before
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return done / elapsed, used / max(done, 1) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--stacks", default=",".join(STACKS))
    ap.add_argument("--serve", choices=STACKS, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve = {
            "aiohttp": serve_aiohttp,
            "uvicorn": serve_uvicorn,
            "granian": serve_granian,
            "granian-embed": serve_granian_embed,
        }
        serve[args.serve](args.port)
        return
    rev = git_rev()
    print(
        f"# http_stack: {NUM_CHUNKS} SSE chunks/request, concurrency {args.concurrency}, "
        f"{args.seconds}s x {args.runs} runs, {os.cpu_count()} cores, rev {rev}"
    )
    results: dict[str, tuple[float, float]] = {}
    for stack in args.stacks.split(","):
        rates, cpus = [], []
        for _ in range(args.runs):
            port = free_port()
            argv = [sys.executable, "-m", "bench.http_stack", "--serve", stack, "--port", str(port)]
            rate, cpu = measure(argv, port, args.seconds, args.concurrency)
            rates.append(rate)
            cpus.append(cpu)
        results[stack] = (statistics.median(rates), statistics.median(cpus))
    best = max(r for r, _ in results.values())
    print(f"{'stack':10} {'req/s':>8} {'CPU µs/req':>11} {'vs best':>8}")
    for stack, (rate, cpu) in results.items():
        print(f"{stack:10} {rate:8.0f} {cpu:11.0f} {rate / best:8.2f}")


if __name__ == "__main__":
    main()
