"""``AsgiServer``'s drain over real sockets: one deadline for the whole drain (the server's
own ``on_stop`` wait included), and a request cut there gets what it can still take: the
error's response if none had started, an SSE error event ending an event stream."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
from tests.unit.asgi.support import free_port, lifespan

from kvtide.asgi import ApiError, AsgiServer, Status
from kvtide.asgi.messages import Receive, Scope, Send

CUT = ApiError(Status(503, "unavailable", "shutting_down"), "going away")


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        return await lifespan(receive, send)
    await receive()  # the (empty) body
    if scope["path"] == "/stream":
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    await asyncio.Event().wait()  # never ends on its own


def _request(port: int, path: str, out: dict[str, bytes], started: threading.Event) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        started.set()
        sock.settimeout(15)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
            if data.endswith(b"0\r\n\r\n") or b"going away" in data:
                break
        out[path] = data


@pytest.mark.timeout(30)
@pytest.mark.parametrize("http", ["uvicorn", "granian"])
def test_one_deadline_and_an_answer_for_every_request_cut(http: str) -> None:
    port = free_port()
    out: dict[str, bytes] = {}
    stopping: list[float] = []

    async def on_stop() -> None:  # a server's own drain, which waits too
        stopping.append(time.monotonic())
        await asyncio.sleep(0.8)

    async def scenario() -> float:
        server = AsgiServer(
            _app, "127.0.0.1", port, on_stop=on_stop, drain_s=1.0, http=http, cut_error=CUT
        )
        serving = asyncio.create_task(server.serve(handle_signals=False))
        await asyncio.sleep(0.5)
        threads = []
        for path in ("/stream", "/plain"):
            started = threading.Event()
            t = threading.Thread(target=_request, args=(port, path, out, started))
            t.start()
            threads.append(t)
            await asyncio.to_thread(started.wait, 5)
        await asyncio.sleep(0.3)  # both handlers are waiting
        server.shutdown()
        await serving
        done = time.monotonic()
        for t in threads:
            await asyncio.to_thread(t.join, 10)
        return done - stopping[0]

    took = asyncio.run(scenario())
    assert took < 1.6  # 0.8 s of on_stop, then what is left of the 1 s, not 1 s more
    assert b"data: 1\n\n" in out["/stream"] and b'data: {"error"' in out["/stream"]
    assert b"going away" in out["/stream"]
    assert out["/plain"].startswith(b"HTTP/1.1 503") and b"shutting_down" in out["/plain"]
