"""Both HTTP servers under the gateway's ASGI app (`--http-server uvicorn|granian`): answers
streamed and not, an unknown route and a wrong method as OpenAI errors, a client that goes
away mid-stream aborts the engine's request, SIGTERM lets the stream in flight finish, an idle
keep-alive connection outlives the usual clients' idle timeouts and is closed once idle for
``timeouts.keep_alive_s``."""

from __future__ import annotations

import http.client
import json
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from tests.integration.gateway.procs import (
    backend,
    free_port,
    gateway,
    openai_client,
    wait_aborted,
)

pytestmark = pytest.mark.timeout(60)


def _status(url: str, method: str = "GET") -> tuple[int, dict]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("server", ["uvicorn", "granian"])
def test_the_gateway_serves_the_same_on_both_servers(server: str) -> None:
    bport, port = free_port(), free_port()
    slow = backend(bport, "m", "--token-delay", "0.02", "--tokens", "10")
    gw = gateway(port, "--replica", f"http://127.0.0.1:{bport}", "--http-server", server)
    base = f"http://127.0.0.1:{port}"
    try:
        c = openai_client(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=20)
        assert c.completions.create(model="m", prompt="a", max_tokens=2).choices[0].text
        chunks = list(c.completions.create(model="m", prompt="b", stream=True))
        assert "".join(ch.choices[0].text for ch in chunks) == "tok " * 10
        status, body = _status(f"{base}/nowhere")
        assert status == 404 and body["error"]["code"] == "not_found"
        status, body = _status(f"{base}/v1/completions")
        assert status == 405 and body["error"]["code"] == "method_not_allowed"
        # a client gone mid-stream: the engine's request is aborted
        stream = c.completions.create(model="m", prompt="c", stream=True)
        next(iter(stream))
        stream.close()
        assert wait_aborted(bport)["aborted"] == 1
        # SIGTERM: the stream in flight ends whole, then the process exits 0
        it = iter(c.completions.create(model="m", prompt="d", stream=True))
        text = next(it).choices[0].text
        gw.signal(signal.SIGTERM)
        text += "".join(ch.choices[0].text for ch in it)
        assert text == "tok " * 10
        assert gw.proc.wait(10) == 0
    finally:
        gw.stop()
        slow.stop()


@pytest.mark.parametrize("server", ["uvicorn", "granian"])
def test_an_idle_keep_alive_connection_outlives_the_clients_idle_timeouts(server: str) -> None:
    # httpx (the openai client) keeps an idle connection 5 s, aiohttp 15 s: a server closing
    # it first races the client's next request on it (uvicorn's own default is 5 s)
    bport, port = free_port(), free_port()
    engine = backend(bport, "m")
    gw = gateway(port, "--replica", f"http://127.0.0.1:{bport}", "--http-server", server)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/health")
        first = conn.getresponse()
        first.read()
        assert first.status == 200
        sock = conn.sock
        time.sleep(6.5)
        conn.request("GET", "/health")  # http.client reconnects only if the socket is gone
        second = conn.getresponse()
        second.read()
        assert second.status == 200 and conn.sock is sock
    finally:
        conn.close()
        gw.stop()
        engine.stop()


@pytest.mark.parametrize("server", ["uvicorn", "granian"])
def test_a_connection_idle_past_keep_alive_s_is_closed_by_the_server(
    server: str, tmp_path: Path
) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text("timeouts: {keep_alive_s: 1.5}\n")
    bport, port = free_port(), free_port()
    engine = backend(bport, "m")
    gw = gateway(
        port,
        "--config",
        str(config),
        "--replica",
        f"http://127.0.0.1:{bport}",
        "--http-server",
        server,
    )
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        for idle_s in (0.0, 0.5):  # within keep_alive_s: the same connection answers
            time.sleep(idle_s)
            conn.request("GET", "/health")
            answer = conn.getresponse()
            answer.read()  # the whole answer, however the server splits it
            assert answer.status == 200
            if idle_s == 0.0:
                sock = conn.sock
            assert conn.sock is sock
        started = time.monotonic()
        assert sock.recv(4096) == b""  # nothing sent: the server closes it
        assert 1.0 < time.monotonic() - started < 4.0
    finally:
        conn.close()
        gw.stop()
        engine.stop()
