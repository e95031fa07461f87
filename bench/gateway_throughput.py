"""Maximum req/s and added latency of each gateway, in front of zero-work stand-in backends, in
one run: kvtide (`cost` text mode, `cost` token mode, `round_robin`) beside sglang-router, smg
and vllm-router, and ``direct`` (the client straight at one backend) as the floor.

    nice python bench/gateway_throughput.py [--runs 3] [--duration 5] [--json out.json]
    python bench/gateway_throughput.py --table out.json     # a saved run's table again

The backends are a **zero-work stand-in**, not engines: one process (one asyncio loop on
httptools) listening on ``--backends`` ports, answering ``/v1/chat/completions`` and
``/v1/completions`` at once with a fixed OpenAI body (``usage`` with ``prompt_tokens`` =
body bytes / 4 and ``prompt_tokens_details.cached_tokens`` = the longest 1 KiB-aligned body
prefix that port has seen before), ``/v1/models`` (model ``emu``), ``/health``, ``/metrics``
(the vLLM gauges the gateways scrape, at zero, and ``bench_requests_total``) and ``/tokenize``
(vLLM's shape; one token per 4 body bytes, which vllm-router's ``cache_aware`` asks for on
every request). So the gateway's own capacity is what is measured, not a model's.

Closed loop: ``wrk`` (Debian package ``wrk``) with a Lua script POSTing non-streamed chat
bodies in turn: ``--conversations`` conversations of 1–4 turns over ``--system-prompts`` shared
system prompts of ``--system-chars`` characters, at each ``--concurrency`` for ``--duration``
seconds: req/s, wrk's latency p50/p99, and the gateway PID's CPU (/proc, user+system, all its
threads) per request, beside the stand-in's (it shares the client's core). Open loop:
``--rate`` req/s (Poisson) for ``--rate-duration`` s from a small raw-asyncio sender through
each gateway and straight to the backends (round robin): added p50/p99 = gateway minus
direct.

Pinning (default; ``--no-pin`` to leave it to the scheduler): every gateway runs on core 0
(``sched_setaffinity`` inherited at spawn: all its threads, so the multi-threaded Rust peers
get one core too, as kvtide's one process has), and wrk, the backends and this script on core
1, so the client's and backends' CPU is not taken from the gateway's. The run prints its git
revision, load average, medians of ``--runs`` runs and each gateway's req/s against kvtide's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httptools
import orjson
import uvloop

from gateways import (
    MODEL,
    Front,
    gateways_to_run,
    peer_python,
    start_front,
    wait_routable,
)
from kvtide.cli.processes import (
    LOOPBACK,
    ChildProcess,
    ProcessGroup,
    free_port,
    proc_cpu_s,
    start_gateway,
)
from revision import git_rev

KVTIDE_TEXT = "kvtide cost (text)"
KVTIDE_TOKENS = "kvtide cost (tokens)"
KVTIDE_RR = "kvtide round_robin"
KVTIDE = {KVTIDE_TEXT: ("cost", []), KVTIDE_TOKENS: ("cost", ["--tokenizer", "smollm2"])}
KVTIDE[KVTIDE_RR] = ("round_robin", [])
DIRECT = "direct"
PREFIX_BYTES = 1024

# --- the stand-in backend ---

_METRICS = (
    'vllm:num_requests_running{{model_name="emu"}} 0.0\n'
    'vllm:num_requests_waiting{{model_name="emu"}} 0.0\n'
    'vllm:kv_cache_usage_perc{{model_name="emu"}} 0.0\n'
    "bench_requests_total {n}\n"
)
_MODELS = orjson.dumps(
    {
        "object": "list",
        "data": [{"id": MODEL, "object": "model", "owned_by": "bench", "max_model_len": 32768}],
    }
)


class _Port:
    """One listening port's state: requests answered and body prefixes seen."""

    def __init__(self) -> None:
        self.requests = 0
        self.seen: set[int] = set()


def _completion(kind: bytes, body: bytes, port: _Port) -> bytes:
    port.requests += 1
    cached = 0
    for end in range(PREFIX_BYTES, len(body), PREFIX_BYTES):
        key = hash(body[:end])
        if key in port.seen:
            cached = end
        else:
            if len(port.seen) > 1 << 20:
                port.seen.clear()
            port.seen.add(key)
    prompt = max(1, len(body) // 4)
    choice = (
        b'{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"length"}'
        if kind == b"chat.completion"
        else b'{"index":0,"text":"ok","finish_reason":"length"}'
    )
    return (
        b'{"id":"cmpl-%d","object":"%s","created":0,"model":"emu","choices":[%s],'
        b'"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d,'
        b'"prompt_tokens_details":{"cached_tokens":%d}}}'
        % (port.requests, kind, choice, prompt, prompt + 1, min(cached // 4, prompt))
    )


def _answer(method: bytes, path: bytes, body: bytes, port: _Port) -> tuple[bytes, bytes, bytes]:
    """(status line, content type, body) for one request."""
    json_type = b"application/json"
    if method == b"POST" and path == b"/v1/chat/completions":
        return b"200 OK", json_type, _completion(b"chat.completion", body, port)
    if method == b"POST" and path == b"/v1/completions":
        return b"200 OK", json_type, _completion(b"text_completion", body, port)
    if method == b"POST" and path == b"/tokenize":
        tokens = [int.from_bytes(body[i : i + 4]) % 49152 for i in range(0, len(body), 4)]
        out = {"count": len(tokens), "max_model_len": 32768, "tokens": tokens, "token_strs": None}
        return b"200 OK", json_type, orjson.dumps(out)
    if path == b"/v1/models":
        return b"200 OK", json_type, _MODELS
    if path == b"/health":
        return b"200 OK", b"text/plain", b""
    if path == b"/metrics":
        return b"200 OK", b"text/plain; version=0.0.4", _METRICS.format(n=port.requests).encode()
    return b"404 Not Found", json_type, b'{"error":{"message":"not found","type":"not_found"}}'


class _BackendProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive over httptools; answers each request as soon as it is complete."""

    def __init__(self, port: _Port) -> None:
        self.port = port
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        path = self.url.split(b"?", 1)[0]
        status, ctype, payload = _answer(
            self.parser.get_method(), path, b"".join(self.body), self.port
        )
        self.url, self.body = b"", []
        keep = self.parser.should_keep_alive()
        self.transport.write(
            b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n%s"
            % (status, ctype, len(payload), b"" if keep else b"connection: close\r\n", payload)
        )
        if not keep:
            self.transport.close()


def _protocol_factory(state: _Port) -> Callable[[], _BackendProtocol]:
    return lambda: _BackendProtocol(state)


def serve_backends(ports: Sequence[int]) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        servers = []
        for p in ports:
            state = _Port()
            servers.append(
                await loop.create_server(_protocol_factory(state), LOOPBACK, p, backlog=1024)
            )
        print("serving", file=sys.stderr, flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


@dataclass
class StandIn:
    """One stand-in backend port, in the shape `start_gateway` and `start_front` take."""

    port: int

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def replica_spec(self) -> str:
        return self.url


def requests_answered(backends: Sequence[StandIn]) -> list[int]:
    out = []
    for b in backends:
        with urllib.request.urlopen(f"{b.url}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        out.append(int(text.rsplit("bench_requests_total ", 1)[1].split()[0]))
    return out


# --- the workload ---

_WORDS = [
    "alpha",
    "bravo",
    "cargo",
    "delta",
    "ember",
    "fjord",
    "gamma",
    "harbor",
    "index",
    "jolly",
    "kernel",
    "lemon",
    "mango",
    "north",
    "ocean",
    "parcel",
    "quartz",
    "river",
    "signal",
    "tango",
    "umbra",
    "vector",
    "willow",
    "xenon",
    "yellow",
    "zephyr",
]


def chat_bodies(
    conversations: int, system_prompts: int, system_chars: int, seed: int
) -> list[bytes]:
    """Every turn of ``conversations`` chats (1–4 turns each, 300-char user turns, short
    answers), each over one of ``system_prompts`` shared system prompts: non-streamed chat
    bodies, turns interleaved so consecutive requests belong to different conversations."""
    rng = random.Random(seed)

    def text(n: int) -> str:
        words: list[str] = []
        size = 0
        while size < n:
            words.append(rng.choice(_WORDS))
            size += len(words[-1]) + 1
        return " ".join(words)

    systems = [f"You are assistant {k} of the bench. " + text(system_chars) for k in range(16)]
    systems = systems[:system_prompts]
    turns: list[list[bytes]] = []
    for c in range(conversations):
        messages = [{"role": "system", "content": systems[c % len(systems)]}]
        mine = []
        for t in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": f"[{c}-{t}] " + text(300)})
            body = {"model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0.0}
            mine.append(orjson.dumps(body))
            messages = [*messages, {"role": "assistant", "content": text(60)}]
        turns.append(mine)
    out = []
    for t in range(4):
        out += [mine[t] for mine in turns if t < len(mine)]
    return out


# --- closed loop: wrk ---

WRK_LUA = r"""
local requests = {}
local i = 0
function init(args)
  for line in io.lines(args[1]) do
    requests[#requests + 1] = wrk.format("POST", "/v1/chat/completions",
      {["Content-Type"] = "application/json"}, line)
  end
  i = math.random(#requests)
end
function request()
  i = i % #requests + 1
  return requests[i]
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK {"requests":%d,"duration_us":%d,"errors":%d,"non2xx":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


def run_wrk(
    url: str, bodies_file: Path, lua: Path, concurrency: int, duration_s: float, threads: int
) -> dict[str, Any]:
    cmd = ["wrk", "-t", str(min(threads, concurrency)), "-c", str(concurrency)]
    cmd += ["-d", f"{max(1, round(duration_s))}s", "--timeout", "10s", "-s", str(lua), url]
    out = subprocess.run([*cmd, "--", str(bodies_file)], capture_output=True, text=True, check=True)
    line = next((x for x in out.stdout.splitlines() if x.startswith("WRK ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary: {out.stdout[-300:]} {out.stderr[-300:]}")
    r: dict[str, Any] = json.loads(line[4:])
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    return r


# --- open loop: a raw-asyncio fixed-rate sender ---


class _ClientProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(self.parser.get_status_code())

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("closed"))


async def open_loop(
    targets: Sequence[str], bodies: Sequence[bytes], rate: float, duration_s: float, seed: int
) -> tuple[list[float], int]:
    """Poisson ``rate`` for ``duration_s`` (request i to ``targets[i % len]``), keep-alive
    connections reused when idle: latencies (s) of the 200s, and the count of the others."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    idle: dict[str, list[_ClientProtocol]] = {t: [] for t in targets}
    lat: list[float] = []
    errors = 0

    async def one(i: int) -> None:
        nonlocal errors
        target = targets[i % len(targets)]
        host, port = target.rsplit("/", 1)[1].split(":")
        pool = idle[target]
        proto = pool.pop() if pool else None
        t0 = time.perf_counter()
        if proto is None:
            _, proto = await loop.create_connection(_ClientProtocol, host, int(port))
        body = bodies[i % len(bodies)]
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s\r\n" % host.encode()
        head += b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
        proto.done = loop.create_future()
        assert proto.transport is not None
        proto.transport.write(head + body)
        try:
            status = await proto.done
        except ConnectionError:
            errors += 1
            return
        if status == 200:
            lat.append(time.perf_counter() - t0)
        else:
            errors += 1
        pool.append(proto)

    start = time.monotonic()
    at = 0.0
    i = 0
    async with asyncio.TaskGroup() as tg:
        while at < duration_s:
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tg.create_task(one(i))
            i += 1
            at += rng.expovariate(rate)
    for pool in idle.values():
        for proto in pool:
            if proto.transport is not None:
                proto.transport.close()
    return lat, errors


# --- the run ---


@contextlib.contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    """This thread on ``cpus`` while children are spawned (they inherit it), then back."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def start(
    name: str,
    group: ProcessGroup,
    backends: Sequence[StandIn],
    peers_python: Path,
    cpus: set[int] | None,
) -> Front:
    with pinned(cpus):
        if name == DIRECT:
            return Front(name, backends[0].url, None)
        if name in KVTIDE:
            policy, extra = KVTIDE[name]
            gw = start_gateway(group, backends, policy, extra)  # type: ignore[arg-type]
            wait_routable(gw.url, gw.process)  # the tokenizer loads on first use: not measured
            return Front(name, gw.url, gw.process)
        return start_front(name, group, backends, peers_python)  # type: ignore[arg-type]


def measure(
    front: Front,
    backends: Sequence[StandIn],
    args: argparse.Namespace,
    files: tuple[Path, Path],
    bodies: Sequence[bytes],
    run: int,
    backends_pid: int,
) -> dict[str, Any]:
    out: dict[str, Any] = {"closed": {}}
    url = front.url
    assert url is not None, "every front here has a URL (direct: the first backend's)"
    run_wrk(url, *files, args.concurrency[-1], 1, args.threads)  # warm-up, not counted
    before = requests_answered(backends)
    for c in args.concurrency:
        cpu0, bcpu0 = front.cpu_s(), proc_cpu_s(backends_pid)
        r = run_wrk(url, files[0], files[1], c, args.duration, args.threads)
        n = max(1, r["requests"])
        r["cpu_us_per_request"] = (front.cpu_s() - cpu0) / n * 1e6
        # the stand-in's own share of the client core (vllm-router's /tokenize calls weigh here)
        r["backend_cpu_us_per_request"] = (proc_cpu_s(backends_pid) - bcpu0) / n * 1e6
        out["closed"][str(c)] = r
    served = [b - a for a, b in zip(before, requests_answered(backends), strict=True)]
    out["served_per_backend"] = served
    if args.rate > 0:
        targets = [b.url for b in backends] if front.child is None else [url]
        cpu0 = front.cpu_s()
        lat, errors = asyncio.run(
            open_loop(targets, bodies, args.rate, args.rate_duration, args.seed + run)
        )
        cpu_s = front.cpu_s() - cpu0
        lat.sort()
        out["open"] = {
            "rate": args.rate,
            "requests": len(lat) + errors,
            "errors": errors,
            "p50_ms": lat[len(lat) // 2] * 1e3 if lat else None,
            "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3 if lat else None,
            # at a fixed rate every request pays the loop's wake-ups alone: dearer than at
            # the closed loop's best concurrency, where they are shared
            "cpu_us_per_request": cpu_s / max(1, len(lat) + errors) * 1e6 if front.child else None,
        }
    return out


def _median(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def summarize(runs: Sequence[dict[str, Any]], concurrency: Sequence[int]) -> dict[str, Any]:
    closed = {}
    for c in map(str, concurrency):
        rows = [r["closed"][c] for r in runs]
        closed[c] = {
            k: _median([x.get(k) for x in rows])
            for k in (
                "rps",
                "p50_us",
                "p99_us",
                "cpu_us_per_request",
                "backend_cpu_us_per_request",
                "errors",
                "non2xx",
            )
        }
    served = runs[-1]["served_per_backend"]
    mean = sum(served) / len(served) if served else 0
    best = max(closed, key=lambda c: closed[c]["rps"] or 0.0)
    out: dict[str, Any] = {
        "closed": closed,
        "max_rps": closed[best]["rps"] or 0.0,
        "cpu_us_per_request_at_max": closed[best]["cpu_us_per_request"],
        "backend_cpu_us_per_request_at_max": closed[best]["backend_cpu_us_per_request"],
        "spread_max_over_mean": max(served) / mean if mean else None,
    }
    if "open" in runs[0]:
        out["open"] = {
            k: _median([r["open"].get(k) for r in runs])
            for k in ("p50_ms", "p99_ms", "errors", "cpu_us_per_request")
        }
    return out


LEGEND = """
req/s: wrk's, closed loop. p50/p99: wrk's, at the highest concurrency. CPU: the gateway
process's (all threads) per request, at the concurrency of its best req/s; stand-in: the
backends' CPU per request there (they share core 1 with wrk). spread: max/mean of
requests per backend in the last run (1.00 = even). added: the open-loop sender's p50/p99
through the gateway minus straight to the backends; CPU @rate: the gateway's per request
then. kvtide/it: kvtide cost (text)'s best req/s over this gateway's."""


def print_table(med: dict[str, dict[str, Any]], concurrency: Sequence[int], rate: float) -> None:
    ours = med.get(KVTIDE_TEXT, {}).get("max_rps")
    direct = med.get(DIRECT, {}).get("open")
    cols = "".join(f"{'req/s c=' + str(c):>12}" for c in concurrency)
    last = concurrency[-1]
    print(
        f"\n{'gateway':<28}{cols}{'p50/p99 ms c=' + str(last):>18}{'CPU us/req':>11}"
        f"{'stand-in':>9}{'spread':>7}{f'added p50/p99 ms @{rate:g}/s':>26}"
        f"{'CPU @rate':>10}{'kvtide/it':>10}"
    )
    for name, m in med.items():
        closed = m["closed"]
        rps = "".join(f"{closed[str(c)]['rps'] or 0:>12.0f}" for c in concurrency)
        lc = closed[str(last)]
        lat = f"{(lc['p50_us'] or 0) / 1e3:.2f}/{(lc['p99_us'] or 0) / 1e3:.2f}"
        cpu = m["cpu_us_per_request_at_max"] or 0.0
        cpu_s = "-" if name == DIRECT else f"{cpu:.0f}"
        b = m.get("backend_cpu_us_per_request_at_max")
        stand_in = "-" if b is None else f"{b:.0f}"
        spread = "-" if m["spread_max_over_mean"] is None else f"{m['spread_max_over_mean']:.2f}"
        added = "-"
        o = m.get("open")
        if o and direct and name != DIRECT and o["p50_ms"] is not None:
            added = f"{o['p50_ms'] - direct['p50_ms']:.2f}/{o['p99_ms'] - direct['p99_ms']:.2f}"
            if o["errors"]:
                added += f" ({o['errors']:.0f} err)"
        elif o and name == DIRECT and o["p50_ms"] is not None:
            added = f"(direct {o['p50_ms']:.2f}/{o['p99_ms']:.2f})"
        ratio = f"x{ours / m['max_rps']:.2f}" if ours and m["max_rps"] else "-"
        open_cpu = o.get("cpu_us_per_request") if o else None
        at_rate = "-" if open_cpu is None else f"{open_cpu:.0f}"
        print(
            f"{name:<28}{rps}{lat:>18}{cpu_s:>11}{stand_in:>9}{spread:>7}{added:>26}"
            f"{at_rate:>10}{ratio:>10}"
        )
    print(LEGEND)


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", type=int, default=4)
    p.add_argument("--concurrency", default="8,32,64", help="comma-separated wrk connections")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    p.add_argument("--threads", type=int, default=1, help="wrk threads")
    p.add_argument("--rate", type=float, default=200.0, help="open-loop req/s (0: skip)")
    p.add_argument("--rate-duration", type=float, default=5.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--conversations", type=int, default=400)
    p.add_argument("--system-prompts", type=int, default=8)
    p.add_argument("--system-chars", type=int, default=2000)
    p.add_argument("--peers-venv", type=Path, default=Path("/work/peers-venv"))
    p.add_argument("--only", help="comma-separated gateway names (default all)")
    p.add_argument("--no-pin", action="store_true", help="no core pinning")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, dest="json_path")
    p.add_argument("--table", type=Path, help="print the table of a saved --json run and exit")
    p.add_argument("--serve-backends", nargs="+", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.table is not None:
        saved = json.loads(args.table.read_text())
        print(f"rev {saved['rev']}, load average {saved['loadavg']}, pinning: {saved['pinning']}")
        config = saved["config"]
        med = {n: summarize(v, config["concurrency"]) for n, v in saved["runs"].items() if v}
        print(f"medians of {config['runs']} runs")
        print_table(med, config["concurrency"], config["rate"])
        return 0
    if args.serve_backends:
        serve_backends(args.serve_backends)
        return 0
    if shutil.which("wrk") is None:
        print("gateway_throughput: wrk is not installed (Debian/Ubuntu: apt-get install wrk)")
        return 2
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    cores = sorted(os.sched_getaffinity(0))
    pin = not args.no_pin and len(cores) >= 2
    gateway_cpus, client_cpus = ({cores[0]}, {cores[1]}) if pin else (None, None)
    python = peer_python(args.peers_venv)
    names = gateways_to_run([DIRECT, *KVTIDE], args.peers_venv, args.only)
    rev = git_rev()
    pinning = f"gateway on core {cores[0]}, wrk+backends+client on core {cores[1]}" if pin else "no"
    config = {k: v for k, v in vars(args).items() if k != "serve_backends"}
    print(f"gateway_throughput: rev {rev}, load average {loadavg()}, pinning: {pinning}")
    print(f"config {json.dumps(config, default=str)}", flush=True)
    bodies = chat_bodies(args.conversations, args.system_prompts, args.system_chars, args.seed)
    sizes = sorted(len(b) for b in bodies)
    print(
        f"{len(bodies)} chat bodies, {sizes[0]}–{sizes[-1]} bytes (median {sizes[len(sizes) // 2]})"
    )
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp, ProcessGroup() as group:
        files = (Path(tmp) / "bodies.jsonl", Path(tmp) / "chat.lua")
        files[0].write_bytes(b"\n".join(bodies) + b"\n")
        files[1].write_text(WRK_LUA)
        if client_cpus is not None:
            os.sched_setaffinity(0, client_cpus)
        backends = [StandIn(free_port()) for _ in range(args.backends)]
        cmd = [sys.executable, __file__, "--serve-backends", *(str(b.port) for b in backends)]
        stand_in = group.add(ChildProcess(cmd, "stand-in backends"))
        stand_in.wait_banner("serving", 30)
        for run in range(args.runs):
            print(f"run {run + 1} (load average {loadavg()})", flush=True)
            for name in names:
                front = start(name, group, backends, python, gateway_cpus)
                try:
                    r = measure(front, backends, args, files, bodies, run, stand_in.pid)
                finally:
                    if front.child is not None:
                        front.child.stop()
                        group.children.remove(front.child)
                results[name].append(r)
                closed = " ".join(f"c{c} {v['rps']:.0f}/s" for c, v in r["closed"].items())
                print(f"  {name:<28} {closed}  {json.dumps(r.get('open'))}", flush=True)
    med = {n: summarize(v, args.concurrency) for n, v in results.items() if v}
    print(f"\nmedians of {args.runs} runs, rev {rev}, load average {loadavg()}, pinning: {pinning}")
    print_table(med, args.concurrency, args.rate)
    if args.json_path is not None:
        out = {
            "config": config,
            "rev": rev,
            "loadavg": os.getloadavg(),
            "pinning": pinning,
            "median": med,
            "runs": results,
        }
        args.json_path.write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
