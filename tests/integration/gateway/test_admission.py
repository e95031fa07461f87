"""Late binding through a real `kvtide serve` (``limits.max_in_flight_per_replica``): requests
beyond the cap wait at the gateway, never at an engine, and go to whichever replica frees
first; a full queue and a wait past ``timeouts.queue_s`` are 503s with OpenAI error bodies; a
client that leaves while queued gives up its place, never a slot."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from tests.integration.gateway.procs import Proc, backend, backend_stats, free_port, gateway

pytestmark = pytest.mark.timeout(90)


def _config(tmp_path: Path, ports: list[int], cap: int, **extra: Any) -> Path:
    queue_s = extra.pop("queue_s", None)
    limits = {"max_in_flight_per_replica": cap, **extra}
    lines = ["replicas:", *(f"  - url: http://127.0.0.1:{p}" for p in ports), "limits:"]
    lines += [f"  {k}: {v}" for k, v in limits.items()]
    if queue_s is not None:
        lines += ["timeouts:", f"  queue_s: {queue_s}"]
    path = tmp_path / "gw.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def _body(i: int) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}], "stream": True}


async def _post(session: aiohttp.ClientSession, url: str, i: int) -> tuple[int, bytes, float]:
    t0 = time.monotonic()
    async with session.post(f"{url}/v1/chat/completions", json=_body(i)) as resp:
        body = await resp.read()
        return resp.status, body, time.monotonic() - t0


def _start(tmp_path: Path, n: int, delay: str, cap: int, **extra: Any) -> tuple[list, Proc, str]:
    ports = [free_port() for _ in range(n)]
    backends = [backend(p, "m", "--token-delay", delay) for p in ports]
    port = free_port()
    gw = gateway(port, "--config", str(_config(tmp_path, ports, cap, **extra)))
    return list(zip(backends, ports, strict=True)), gw, f"http://127.0.0.1:{port}"


def _stop(backends: list, gw: Proc) -> None:
    gw.stop()
    for proc, _ in backends:
        proc.stop()


def test_requests_beyond_the_cap_wait_at_the_gateway_and_all_complete(tmp_path: Path) -> None:
    backends, gw, url = _start(tmp_path, 2, "0.03", cap=1)  # 8 tokens: ~0.25 s a request
    try:

        async def burst() -> list[tuple[int, bytes, float]]:
            async with aiohttp.ClientSession() as s:
                return await asyncio.gather(*(_post(s, url, i) for i in range(6)))

        results = asyncio.run(burst())
        assert [status for status, _, _ in results] == [200] * 6
        assert all(body.rstrip().endswith(b"data: [DONE]") for _, body, _ in results)
        stats = [backend_stats(port) for _, port in backends]
        assert [s["max_running"] for s in stats] == [1, 1]  # never two at an engine
        assert sum(s["requests"] for s in stats) == 6
        # six at once on two slots: three waves, so the last answers took ~3 requests' time
        assert max(t for _, _, t in results) > 2.5 * min(t for _, _, t in results)
        assert _metric(url, "kvtide_gateway_queue_wait_seconds_count") >= 4
        assert _metric(url, "kvtide_gateway_queued") == 0
        # the official client through the same queue
        with openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0) as client:
            out = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}]
            )
        assert out.choices[0].message.content
    finally:
        _stop(backends, gw)


def test_a_full_queue_and_a_long_wait_are_503s(tmp_path: Path) -> None:
    backends, gw, url = _start(tmp_path, 1, "0.2", cap=1, max_queued=1, queue_s=0.4)
    try:

        async def three() -> list[tuple[int, bytes, float]]:
            async with aiohttp.ClientSession() as s:
                first = asyncio.create_task(_post(s, url, 0))  # takes the one slot (~1.6 s)
                await asyncio.sleep(0.3)
                second = asyncio.create_task(_post(s, url, 1))  # waits, then times out
                await asyncio.sleep(0.1)
                third = await _post(s, url, 2)  # finds the queue full
                return [await first, await second, third]

        (s0, _, _), (s1, b1, t1), (s2, b2, t2) = asyncio.run(three())
        assert s0 == 200
        assert s1 == 503 and b'"code":"queue_timeout"' in b1.replace(b" ", b"")
        assert 0.35 < t1 < 1.4  # queue_s, not the first request's 1.6 s
        assert s2 == 503 and b'"code":"queue_full"' in b2.replace(b" ", b"")
        assert t2 < 0.3  # at once
        assert backend_stats(backends[0][1])["requests"] == 1
        with pytest.raises(openai.InternalServerError) as caught:  # 5xx: the client's class

            async def hold_and_ask() -> None:
                async with aiohttp.ClientSession() as s:
                    held = asyncio.create_task(_post(s, url, 3))
                    queued = asyncio.create_task(_post(s, url, 4))
                    await asyncio.sleep(0.2)
                    try:
                        async with openai.AsyncOpenAI(
                            base_url=f"{url}/v1", api_key="x", max_retries=0
                        ) as client:
                            await client.chat.completions.create(
                                model="m", messages=[{"role": "user", "content": "y"}]
                            )
                    finally:
                        await asyncio.gather(held, queued)

            asyncio.run(hold_and_ask())
        assert caught.value.status_code == 503
        assert caught.value.response.headers["retry-after"] == "1"
    finally:
        _stop(backends, gw)


def test_a_client_gone_while_queued_gives_up_its_place_not_a_slot(tmp_path: Path) -> None:
    backends, gw, url = _start(tmp_path, 1, "0.1", cap=1)  # ~0.8 s a request
    try:

        async def scenario() -> tuple[int, int]:
            async with aiohttp.ClientSession() as s:
                first = asyncio.create_task(_post(s, url, 0))
                await asyncio.sleep(0.2)
                gone = asyncio.create_task(_post(s, url, 1))
                await asyncio.sleep(0.2)
                assert _metric(url, "kvtide_gateway_queued") == 1
                gone.cancel()  # closes its connection: the gateway's handler is cancelled
                deadline = time.monotonic() + 5
                while _metric(url, "kvtide_gateway_queued") != 0:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                status0, _, _ = await first
                status2, _, _ = await _post(s, url, 2)  # the slot is still there
                return status0, status2

        assert asyncio.run(scenario()) == (200, 200)
        assert backend_stats(backends[0][1])["requests"] == 2  # the one that left never went
    finally:
        _stop(backends, gw)
