"""A client that pipelines a second request behind a first and hangs up: the first request's
handler learns it (``http.disconnect``), as it would without the second. uvicorn tells only
the newest request of a connection; the runner's protocol tells them all."""

from __future__ import annotations

import asyncio

import pytest
from tests.unit.asgi.support import free_port, lifespan

from kvtide.asgi import AsgiServer
from kvtide.asgi.messages import Receive, Scope, Send


@pytest.mark.timeout(30)
def test_a_pipelined_clients_hang_up_reaches_its_first_request() -> None:
    port = free_port()
    gone: dict[str, asyncio.Event] = {}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await lifespan(receive, send)
        await receive()  # the (empty) body
        # a long answer in the making (an engine generating): until the client goes
        while (await receive())["type"] != "http.disconnect":
            pass
        gone[scope["path"]].set()

    async def scenario() -> None:
        gone["/first"], gone["/second"] = asyncio.Event(), asyncio.Event()
        server = AsgiServer(app, "127.0.0.1", port, http="uvicorn")
        serving = asyncio.create_task(server.serve(handle_signals=False))
        try:
            for _ in range(100):
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            writer.write(
                b"GET /first HTTP/1.1\r\nHost: x\r\n\r\nGET /second HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            await writer.drain()
            await asyncio.sleep(0.3)  # the first is running, the second queued behind it
            writer.close()
            await asyncio.wait_for(gone["/first"].wait(), 5)
        finally:
            server.shutdown()
            await serving

    asyncio.run(scenario())
