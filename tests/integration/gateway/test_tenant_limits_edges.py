"""Tokens-per-minute limits and engine failures at their edges, through a real `kvtide serve`:
a stream its client cuts off is charged the tokens it got, a request no engine served costs
nothing, and a failed engine reaches the client as one well-formed error that names no engine
(and, ejected, as an unhealthy replica in /metrics). The engines are `kvtide engine`
processes, or a raw-socket engine in this process for the failures a real one cannot be
made to have."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any

import openai
import pytest
from tests.integration.gateway.conftest import KEYS, write_keys
from tests.integration.gateway.procs import (
    engines_behind_gateway,
    free_port,
    gateway,
    openai_client,
)

pytestmark = pytest.mark.timeout(90)

TPM = 2000
SECRET_IN_ENGINE_ERROR = "engine internals at 10.9.8.7:6543"


def _post(port: int, path: str, body: dict[str, Any], key: str) -> tuple[int, Message, bytes]:
    """Status, headers and body of one request to the gateway."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


@contextlib.contextmanager
def _limited_gateway(tmp_path: Path) -> Iterator[int]:
    """One emulated engine behind a gateway whose tenant alpha has ``TPM`` tokens a minute."""
    keys = write_keys(tmp_path / "keys.yaml", {"alpha": KEYS["alpha"]}, tokens_per_minute=TPM)
    with engines_behind_gateway(1, (), "--api-keys", str(keys)) as (port, _):
        yield port


def _read_and_hang_up(port: int, tokens: int) -> int:
    """Streams a chat answer without ``max_tokens`` (the engine writes until its context is
    full), reads ``tokens`` content events and closes the connection: the tokens read."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    body = {"model": "emu", "stream": True, "messages": [{"role": "user", "content": "a story"}]}
    conn.request(
        "POST",
        "/v1/chat/completions",
        json.dumps(body),
        {"Authorization": f"Bearer {KEYS['alpha']}", "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    got, buf = 0, b""
    while got < tokens:
        data = resp.read1(65536)
        assert data, f"the stream ended after {got} tokens"
        *events, buf = (buf + data).split(b"\n\n")
        got += sum(1 for e in events if b'"content":"' in e and b'"role"' not in e)
    assert conn.sock is not None
    conn.sock.close()  # before the stream's end, and its usage event
    conn.close()
    return got


def test_a_stream_its_client_cuts_off_is_charged_the_tokens_it_got(tmp_path: Path) -> None:
    """Admitted on its prompt and 16 tokens (no ``max_tokens``), the stream is read for 2,500
    tokens and hung up on before the engine's usage event: those tokens are charged, and the
    tenant (2,000 a minute) must wait."""
    with _limited_gateway(tmp_path) as port:
        assert _read_and_hang_up(port, 2500) >= 2500
        time.sleep(0.5)  # the gateway sees the disconnect and settles
        chat = {"model": "emu", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
        status, headers, body = _post(port, "/v1/chat/completions", chat, KEYS["alpha"])
    assert status == 429, body
    assert int(headers["Retry-After"]) >= 10  # 500 and more in debt, 33 tokens a second


def test_a_completion_is_admitted_on_the_max_tokens_its_engine_uses(tmp_path: Path) -> None:
    """/v1/completions: the engine writes ``max_tokens`` whatever ``max_completion_tokens``
    says (a chat field), so the gateway admits on ``max_tokens`` too."""
    with _limited_gateway(tmp_path) as port:
        first = {"model": "emu", "prompt": "hello", "max_tokens": 1000}
        status, _, body = _post(port, "/v1/completions", first, KEYS["alpha"])
        assert status == 200, body
        assert json.loads(body)["usage"]["completion_tokens"] == 1000
        # under 1,000 tokens left: room for 1 more, not for 1,500
        both = {**first, "max_completion_tokens": 1, "max_tokens": 1500}
        status, _, body = _post(port, "/v1/completions", both, KEYS["alpha"])
        assert status == 429, body
        one = {**first, "max_tokens": 1}
        assert _post(port, "/v1/completions", one, KEYS["alpha"])[0] == 200


def test_requests_the_engine_refuses_cost_nothing(tmp_path: Path) -> None:
    """``max_tokens`` of ten million: the engine answers 400 without writing a token, and the
    tenant is not charged it (nor locked out for days)."""
    with _limited_gateway(tmp_path) as port:
        huge = {"model": "emu", "prompt": "hello", "max_tokens": 10_000_000}
        for _ in range(3):
            status, _, body = _post(port, "/v1/completions", huge, KEYS["alpha"])
            assert status == 400, body
        small = {"model": "emu", "prompt": "hello", "max_tokens": 1500}
        status, headers, body = _post(port, "/v1/completions", small, KEYS["alpha"])
    assert status == 200, (headers.get("Retry-After"), body)


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(120)
def test_a_tenant_named_default_is_held_to_one_limit_across_gateways(
    tmp_path: Path, redis_client: Any
) -> None:
    """``--state redis://``: a keys-file tenant may be named "default"; what one gateway
    charged it, the other takes from its bucket (not from the keyless default tenant's)."""
    keys = write_keys(tmp_path / "keys.yaml", {"default": KEYS["alpha"]}, tokens_per_minute=600)
    prefix = f"kvtide-test-{uuid.uuid4().hex[:8]}"
    state = ["--state", "redis://127.0.0.1:6379/0", "--state-prefix", prefix]
    shared = ["--api-keys", str(keys), "--tenant-secret", "s3cret", *state]
    try:
        with engines_behind_gateway(1, (), *shared) as (port, engines):
            other_port = free_port()
            other = gateway(other_port, "--replica", f"{engines[0].url}=emu", *shared)
            try:
                spend = {"model": "emu", "prompt": "hi", "max_tokens": 590}
                assert _post(port, "/v1/completions", spend, KEYS["alpha"])[0] == 200
                time.sleep(3.0)  # two exchanges through Redis (one a second)
                ask = {"model": "emu", "prompt": "hi", "max_tokens": 100}
                status, _, body = _post(other_port, "/v1/completions", ask, KEYS["alpha"])
            finally:
                other.stop()
    finally:
        for key in redis_client.scan_iter(f"{prefix}:*"):
            redis_client.delete(key)
    assert status == 429, body


# --- a raw-socket engine that fails as a real one may -----------------------------------


class _BrokenEngine:
    """An OpenAI-shaped engine on a loopback socket, in a thread: /health and /v1/models
    answer; a completion gets a 500 that quotes the engine's internals (``fail500``), or a
    stream that stops in the middle of its second event (``cut``)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        self.sock.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError, ValueError):
            reader = conn.makefile("rb")
            while True:
                head = [reader.readline()]
                while head[-1] not in (b"\r\n", b""):
                    head.append(reader.readline())
                if head[-1] == b"":
                    return
                path = head[0].split()[1]
                length = 0
                for line in head[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                reader.read(length)
                if path == b"/v1/models":
                    conn.sendall(_response(200, b'{"object":"list","data":[{"id":"m"}]}'))
                elif not path.startswith(b"/v1/"):
                    conn.sendall(_response(200, b"{}"))
                elif self.mode == "fail500":
                    error = json.dumps({"error": SECRET_IN_ENGINE_ERROR}).encode()
                    conn.sendall(_response(500, error))
                else:
                    self._cut(conn)
                    return

    @staticmethod
    def _cut(conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        base = {"id": "x", "object": "chat.completion.chunk", "model": "m"}
        role = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        token = {**base, "choices": [{"index": 0, "delta": {"content": "hello"}}]}
        for data in (_event(role), _event(token)[:30]):
            conn.sendall(b"%x\r\n%s\r\n" % (len(data), data))
            time.sleep(0.05)


def _response(status: int, body: bytes) -> bytes:
    head = b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return head % (status, len(body)) + body


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@contextlib.contextmanager
def _behind_gateway(
    mode: str, tmp_path: Path, **failover: float
) -> Iterator[tuple[int, _BrokenEngine]]:
    """A ``_BrokenEngine`` behind `kvtide serve` (tenant alpha: ``TPM`` tokens a minute)."""
    engine = _BrokenEngine(mode)
    keys = write_keys(tmp_path / "keys.yaml", {"alpha": KEYS["alpha"]}, tokens_per_minute=TPM)
    config = {
        "replicas": [f"http://127.0.0.1:{engine.port}=m"],
        "api_keys": str(keys),
        "failover": {"health_interval_s": 60, **failover},
    }
    (tmp_path / "gateway.yaml").write_text(json.dumps(config))
    port = free_port()
    gw = gateway(port, "--config", str(tmp_path / "gateway.yaml"))
    try:
        yield port, engine
    finally:
        gw.stop()
        engine.stop()


def test_a_failing_engine_costs_nothing_and_its_words_stay_in_the_log(tmp_path: Path) -> None:
    """Every attempt a 500: the client gets a 502 that quotes neither the engine's body nor
    its address, and is not charged the request (a second one is a 502 again, not a 429)."""
    with _behind_gateway("fail500", tmp_path) as (port, engine):
        ask = {"model": "m", "prompt": "hello", "max_tokens": 1500}
        for _ in range(2):
            status, _, body = _post(port, "/v1/completions", ask, KEYS["alpha"])
            assert status == 502, body
            assert SECRET_IN_ENGINE_ERROR.encode() not in body
            assert str(engine.port).encode() not in body


def test_an_event_cut_off_mid_stream_is_an_openai_api_error(tmp_path: Path) -> None:
    """The client asked for usage, so the stream passes as the engine sends it: the engine
    stops in the middle of an event, and the gateway's error event is an event of its own,
    which the ``openai`` client raises as its ``APIError``, naming no engine."""
    with _behind_gateway("cut", tmp_path) as (port, engine):
        c = openai_client(
            base_url=f"http://127.0.0.1:{port}/v1", api_key=KEYS["alpha"], max_retries=0
        )
        stream = c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "x"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        with pytest.raises(openai.APIError) as err:
            for _ in stream:
                pass
    assert "mid-stream" in err.value.message
    assert str(engine.port) not in err.value.message


def test_a_replica_ejected_mid_stream_is_unhealthy_in_metrics(tmp_path: Path) -> None:
    with _behind_gateway("cut", tmp_path, eject_after=2) as (port, engine):
        ask = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
        for _ in range(2):
            status, _, body = _post(port, "/v1/chat/completions", ask, KEYS["alpha"])
            assert status == 200 and b'"error"' in body, body
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
    series = f'kvtide_gateway_replica_healthy{{replica="127.0.0.1:{engine.port}"}} '
    (line,) = [m for m in metrics.splitlines() if m.startswith(series)]
    assert float(line.split()[-1]) == 0.0
