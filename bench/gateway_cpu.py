"""Gateway CPU per proxied request and added latency, against bare pass-through proxies in the
same run.

    nice python bench/gateway_cpu.py --requests 3000 --concurrency 16 [--stream] [--json out.json]
        [--compare LABEL=SRC_DIR ...]

Starts a zero-latency OpenAI-shaped backend, then `kvtide serve` (policy ``--policy``, text
mode), ``--variant``'s (extra flags) and ``--compare``'s other `kvtide serve`s (the same
flags, the code of another checkout's ``src``: an older revision as a peer) and the bare
proxies (no parsing, no routing: each stack's floor) in front of it: ``--bare SERVER+CLIENT``,
SERVER aiohttp (``web``), granian (raw ASGI on Granian embedded) or uvicorn (the same app on
uvicorn's httptools protocol), CLIENT aiohttp (``ClientSession``) or pool (the gateway's own
upstream client), one at a time, and drives ``--requests`` chat requests with
``--prompt-chars`` of shared-prefix prompt at ``--concurrency`` from an aiohttp client;
``--tokenizer smollm2`` runs the gateway in token mode (chat template + tokenization per
request, conversation prefixes cached). CPU is the gateway process's user+system time
(/proc/PID/stat) over the run divided by the requests; latency is the client's, with the
backend direct as the baseline. Prints medians of ``--runs`` runs and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from kvtide.cli.processes import free_port
from kvtide.gateway.upstream import UpstreamPool
from revision import git_rev

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


DEFAULT_BARE = ["aiohttp+aiohttp", "granian+aiohttp", "granian+pool"]


def serve_backend(port: int, chunk_gap_s: float = 0.0) -> None:
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
            if chunk_gap_s:  # one token at a time, as an engine streams them
                await asyncio.sleep(chunk_gap_s)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", ok)
    app.router.add_get("/metrics", ok)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


class _Upstream:
    """The bare proxies' client: aiohttp's ClientSession ("aiohttp") or the gateway's own
    keep-alive pool ("pool"), one method for both: POST, then the body's pieces as they come.
    ``bases``: one upstream URL, or several comma-separated, taken in turn (round robin)."""

    def __init__(self, kind: str, bases: str) -> None:
        self.kind = kind
        self._bases = itertools.cycle(bases.split(","))
        self.session: aiohttp.ClientSession | None = None
        self.pool: UpstreamPool | None = None

    async def start(self) -> None:
        if self.kind == "pool":
            self.pool = UpstreamPool(5.0, 30.0)
        else:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        if self.pool is not None:
            await self.pool.close()

    async def post(self, path: str, body: bytes, start, write) -> None:  # type: ignore[no-untyped-def]
        base = next(self._bases)
        if self.pool is not None:
            resp = await self.pool.request(b"POST", base, path, body)
            try:
                await start(resp.status, resp.headers[b"content-type"])
                while chunk := await resp.read_chunk():
                    await write(chunk)
            finally:
                resp.close()
            return
        assert self.session is not None
        async with self.session.post(
            base + path, data=body, headers={"Content-Type": "application/json"}
        ) as up:
            await start(up.status, up.headers["Content-Type"].encode())
            async for chunk in up.content.iter_any():
                await write(chunk)


def serve_bare_proxy(server: str, client: str, port: int, upstream: str) -> None:
    """A stack's floor: bytes in, bytes out, no parsing, no routing. ``server``: aiohttp
    (``web``), granian (raw ASGI on Granian embedded) or uvicorn (the same app, uvicorn's
    httptools protocol in our loop); ``client``: aiohttp or pool."""
    import uvloop

    up = _Upstream(client, upstream)
    if server == "aiohttp":

        async def lifespan(app: web.Application):  # type: ignore[no-untyped-def]
            await up.start()
            yield
            await up.close()

        async def health(request: web.Request) -> web.Response:
            return web.Response(text="")

        async def proxy(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            out: list[web.StreamResponse] = []

            async def start(status: int, ctype: bytes) -> None:
                resp = web.StreamResponse(status=status, headers={"Content-Type": ctype.decode()})
                await resp.prepare(request)
                out.append(resp)

            async def write(chunk: bytes) -> None:
                await out[0].write(chunk)

            await up.post(request.path, body, start, write)
            await out[0].write_eof()
            return out[0]

        app = web.Application()
        app.cleanup_ctx.append(lifespan)
        app.router.add_get("/health", health)
        app.router.add_post("/v1/chat/completions", proxy)
        loop = uvloop.new_event_loop()
        web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, loop=loop)
        return

    from kvtide.asgi import AsgiServer, read_body, respond
    from kvtide.asgi.messages import end_stream, send_chunk, start_stream

    async def asgi(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan":
            await receive()
            await up.start()
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await up.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/health":
            await respond(send, 200, b"", [])
            return
        body = await read_body(scope, receive, 1 << 22)

        async def start(status: int, ctype: bytes) -> None:
            await start_stream(send, status, [(b"content-type", ctype)])

        await up.post(scope["path"], body, start, lambda chunk: send_chunk(send, chunk))
        await end_stream(send)

    if server == "uvicorn":
        import uvicorn

        config = uvicorn.Config(
            asgi,
            host="127.0.0.1",
            port=port,
            loop="none",
            http="httptools",
            lifespan="on",
            log_level="warning",
            access_log=False,
        )
        uvloop.run(uvicorn.Server(config).serve())
        return
    uvloop.run(AsgiServer(asgi, "127.0.0.1", port).serve())


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_up(url: str) -> None:
    import urllib.request

    for _ in range(1200):  # a loaded machine: a token-mode gateway takes a while to load
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(url)


async def drive(
    url: str, n: int, conc: int, prompt_chars: int, stream: bool, unique: bool = False
) -> list[float]:
    lat: list[float] = []
    system = ("You are a helpful assistant. " * (prompt_chars // 29 + 1))[:prompt_chars]
    queue = list(range(n))
    tag = f"{time.monotonic_ns()}"  # unique prompts stay unique across runs and peers
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def worker() -> None:
            while queue:
                i = queue.pop()
                body = {
                    "model": "m",
                    "messages": [
                        {
                            "role": "system",
                            "content": f"[{tag}-{i}] {system}" if unique else system,
                        },
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
    shape = (args.prompt_chars, args.stream, args.unique_prompts)
    asyncio.run(drive(url, 200, args.concurrency, *shape))  # warm up
    c0 = cpu_s(pid) if pid else 0.0
    lat = asyncio.run(drive(url, args.requests, args.concurrency, *shape))
    c1 = cpu_s(pid) if pid else 0.0
    lat.sort()
    p50 = lat[len(lat) // 2] * 1e3
    p99 = lat[int(len(lat) * 0.99)] * 1e3
    us = (c1 - c0) / args.requests * 1e6
    print(f"  {label:<20} p50 {p50:7.3f} ms  p99 {p99:7.3f} ms  cpu {us:7.1f} us/req", flush=True)
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
    p.add_argument(
        "--unique-prompts",
        action="store_true",
        help="a distinct system prompt per request: no conversation prefix to reuse (by "
        "default every request shares one system prompt and 64 questions cycle)",
    )
    p.add_argument("--json")
    p.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="LABEL=SRC_DIR",
        help="another kvtide serve from SRC_DIR (a checkout's src/), measured alongside",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL=FLAGS",
        help="another kvtide serve with extra flags (e.g. 'granian=--http-server granian')",
    )
    p.add_argument("--no-bare", action="store_true", help="leave out the bare proxies")
    p.add_argument(
        "--chunk-gap-ms",
        type=float,
        default=0.0,
        help="with --stream: the backend waits this long between its 16 chunks, so each "
        "reaches the gateway on its own read, as an engine's tokens do (default 0: all 16 "
        "written at once, usually one read)",
    )
    p.add_argument("--serve-backend", type=int, help=argparse.SUPPRESS)
    p.add_argument(
        "--bare",
        action="append",
        metavar="SERVER+CLIENT",
        help="bare proxies to measure (aiohttp|granian|uvicorn)+(aiohttp|pool); default "
        "aiohttp+aiohttp granian+aiohttp granian+pool",
    )
    p.add_argument("--serve-bare", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_backend:
        return serve_backend(args.serve_backend, args.chunk_gap_ms / 1e3)
    if args.serve_bare:
        server, client, port, upstream = args.serve_bare
        return serve_bare_proxy(server, client, int(port), upstream)
    rev = git_rev()
    print(
        f"gateway_cpu: rev {rev} requests {args.requests} concurrency "
        f"{args.concurrency} prompt {args.prompt_chars} chars (unique {args.unique_prompts}) "
        f"stream {args.stream} chunk gap {args.chunk_gap_ms} ms "
        f"policy {args.policy} tokenizer {args.tokenizer} runs {args.runs}"
    )
    bport = free_port()
    me = [sys.executable, __file__]
    gap = ["--chunk-gap-ms", str(args.chunk_gap_ms)]
    procs = [subprocess.Popen([*me, "--serve-backend", str(bport), *gap])]
    backend = f"http://127.0.0.1:{bport}"
    serve_flags = ["--replica", backend, "--policy", args.policy]
    if args.tokenizer:
        serve_flags += ["--tokenizer", args.tokenizer]
    # label -> (url, pid)
    peers: dict[str, tuple[str, int]] = {}
    try:
        wait_up(backend + "/health")

        def start(label: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
            port = free_port()
            proc = subprocess.Popen([*cmd, str(port)], env=env)
            procs.append(proc)
            peers[label] = (f"http://127.0.0.1:{port}", proc.pid)

        kvtide = [sys.executable, "-m", "kvtide", "serve", *serve_flags, "--port"]
        start("kvtide serve", kvtide)
        for spec in args.variant:
            label, flags = spec.split("=", 1)
            start(f"kvtide {label}", [*kvtide[:-1], *flags.split(), "--port"])
        for spec in args.compare:
            label, src = spec.split("=", 1)
            env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()))
            start(f"kvtide {label}", kvtide, env)
        bares = [] if args.no_bare else args.bare or DEFAULT_BARE
        for spec in bares:
            server, client = spec.split("+")
            cmd = [*me, "--serve-bare", server, client, str(xp := free_port()), backend]
            procs.append(subprocess.Popen(cmd))
            peers[f"bare {spec}"] = (f"http://127.0.0.1:{xp}", procs[-1].pid)
        for url, _ in peers.values():
            wait_up(url + "/health")
        results: dict[str, list[tuple[float, float, float]]] = {"direct": []}
        results.update({label: [] for label in peers})
        for run in range(args.runs):
            print(f"run {run + 1}  (load average {os.getloadavg()[0]:.2f})", flush=True)
            results["direct"].append(measure("direct", backend, None, args))
            # a gateway measured first in a run was seen to take 15-20% less CPU than the
            # same code measured later, whatever the code: each run starts one further along
            labels = list(peers)
            shift = run % len(labels) if labels else 0
            for label in labels[shift:] + labels[:shift]:
                url, pid = peers[label]
                results[label].append(measure(label, url, pid, args))
        med = {
            k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in results.items()
        }
        d = med["direct"]
        base = med.get("bare aiohttp+aiohttp")
        print(f"medians of {args.runs} runs (load average {os.getloadavg()}):")
        for label, (p50, p99, us) in med.items():
            if label == "direct":
                continue
            ratio = f"  x{us / base[2]:.2f} of bare aiohttp+aiohttp" if base else ""
            print(
                f"  {label:<20} added p50 {p50 - d[0]:6.3f} ms  p99 {p99 - d[1]:6.3f} ms"
                f"  cpu {us:7.1f} us/req{ratio}"
            )
        if args.json:
            out = {
                "config": vars(args),
                "rev": rev,
                "loadavg": os.getloadavg(),
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
