"""Requests/s and CPU per request of one `kvtide engine` process, beside a minimal stub server
on the same HTTP stack (Granian embedded, raw ASGI, 16 SSE chunks) in the same run.

The engine runs at a --speedup high enough that the timing model costs no wall time (1e5: a
16-token completion of llama-3-8b takes microseconds), so what is measured is the HTTP path,
parsing, tokenization, the engine driver and the SSE frames. Each request streams 16 output
tokens. One uvloop client process with keep-alive connections drives each server for a few
seconds; CPU is the server process's user+sys from /proc. Medians of --runs runs.

    python bench/engine_server.py --seconds 4 --runs 3 --concurrency 64 [--profile out.prof]

``--real-ttft`` instead times `kvtide engine --model smollm2-135m` (SmolLM2-135M on the CPU):
TTFT of a 1,024-token prompt cold (a fresh 992-token prefix plus a 32-token turn) and on a hit
(the same prefix, another 32-token turn), over HTTP, median of --runs; bench/real_reuse.py
times the same case in-process (docs/tiers.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from http_stack import measure
from kvtide.cli.processes import free_port
from revision import git_rev

ROOT = Path(__file__).resolve().parents[1]
BODY = b'{"model":"emu","prompt":"Tell me about the tide.","max_tokens":16,"stream":true}'
REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY
)


def engine_argv(port: int, speedup: float, profile: Path | None) -> list[str]:
    head = [sys.executable]
    if profile is not None:
        head += ["-m", "cProfile", "-o", str(profile)]
    return [
        *head, "-m", "kvtide", "engine", "--port", str(port), "--served-model-name", "emu",
        "--speedup", str(speedup), "--max-waiting", "100000",
    ]  # fmt: skip


def stub_argv(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.http_stack",
        "--serve",
        "granian-embed",
        "--port",
        str(port),
    ]


PARAGRAPH = (
    "Paragraph {i}. The tide came in over the flats while the harbour master logged each "
    "vessel by name, tonnage and draught. Cargo manifests listed grain, timber, copper wire "
    "and crates of oranges; the clerk checked every seal twice before signing. "
)


def real_ttft(runs: int) -> None:
    import time

    import httpx2 as httpx

    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from engine_process import running_engine

    with running_engine("--model", "smollm2-135m", "--kv-cache-tokens", "65536") as eng:

        def ids(text: str) -> list[int]:
            tokens: list[int] = httpx.post(eng.url + "/tokenize", json={"prompt": text}).json()[
                "tokens"
            ]
            return tokens

        def ttft(prompt: list[int]) -> float:
            body = {"prompt": prompt, "max_tokens": 1, "stream": True}
            start = time.perf_counter()
            with httpx.stream("POST", eng.url + "/v1/completions", json=body, timeout=120) as r:
                for _ in r.iter_bytes():
                    break
            return time.perf_counter() - start

        turns = ids(" " + PARAGRAPH.format(i="x") * 3)
        colds, warms = [], []
        ttft(ids("warm-up " + PARAGRAPH.format(i=0) * 8))
        for run in range(runs):
            prefix = ids(f"Run {run}. " + "".join(PARAGRAPH.format(i=i) for i in range(40)))[:992]
            colds.append(ttft(prefix + turns[:32]))
            warms.append(ttft(prefix + turns[32:64]))
    cold, warm = statistics.median(colds), statistics.median(warms)
    print(f"# real_ttft: SmolLM2-135M, 1,024-token prompt, median of {runs}, rev {git_rev()}")
    print(f"cold {cold:.3f} s  hit {warm:.3f} s  cold/hit {cold / warm:.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--speedup", type=float, default=1e5)
    ap.add_argument("--profile", type=Path, help="cProfile the engine's last run into this file")
    ap.add_argument("--real-ttft", action="store_true", help="time SmolLM2 cold vs hit instead")
    args = ap.parse_args()
    if args.real_ttft:
        real_ttft(args.runs)
        return
    rev = git_rev()
    print(
        f"# engine_server: 16 streamed tokens/request, concurrency {args.concurrency}, "
        f"speedup {args.speedup:g}, {args.seconds}s x {args.runs} runs, {os.cpu_count()} cores, "
        f"load avg {os.getloadavg()[0]:.1f}, rev {rev}"
    )
    rows: dict[str, tuple[float, float]] = {}
    for name in ("stub (granian-embed)", "kvtide engine"):
        rates, cpus = [], []
        for i in range(args.runs):
            port = free_port()
            if name.startswith("stub"):
                argv = stub_argv(port)
            else:
                last = i == args.runs - 1
                argv = engine_argv(port, args.speedup, args.profile if last else None)
            rate, cpu = measure(argv, port, args.seconds, args.concurrency, REQUEST)
            rates.append(rate)
            cpus.append(cpu)
        rows[name] = (statistics.median(rates), statistics.median(cpus))
    stub_rate, stub_cpu = rows["stub (granian-embed)"]
    print(
        f"{'server':22} {'req/s':>8} {'CPU µs/req':>11} {'req/s vs stub':>14} {'CPU vs stub':>12}"
    )
    for name, (rate, cpu) in rows.items():
        print(f"{name:22} {rate:8.0f} {cpu:11.0f} {rate / stub_rate:14.2f} {cpu / stub_cpu:12.2f}")


if __name__ == "__main__":
    main()
