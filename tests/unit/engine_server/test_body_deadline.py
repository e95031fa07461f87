"""The emulated engine's request body under a deadline: a client that sends part of a body
and stops gets a 408 (vLLM's error shape) after ``ApiLimits.body_s``, instead of holding its
handler, and a drain, for as long as it stays connected."""

from __future__ import annotations

import asyncio
import dataclasses

import orjson

from kvtide.asgi.messages import Message
from kvtide.engine_server.server import ServerConfig, build


def test_a_stalled_body_gets_a_408() -> None:
    built = build(ServerConfig(served_model_name="m"))
    try:
        app = built.app
        app.limits = dataclasses.replace(app.limits, body_s=0.2)
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/completions",
            "headers": [(b"content-length", b"100")],
        }
        parts = [{"type": "http.request", "body": b'{"model": "m", ', "more_body": True}]
        sent: list[Message] = []

        async def receive() -> Message:
            if parts:
                return parts.pop()
            await asyncio.Event().wait()  # the client never sends the rest
            raise AssertionError("unreachable")

        async def send(message: Message) -> None:
            sent.append(message)

        async def scenario() -> None:
            await asyncio.wait_for(app(scope, receive, send), 5)

        asyncio.run(scenario())
        assert sent[0]["status"] == 408
        error = orjson.loads(sent[1]["body"])["error"]
        assert error["type"] == "RequestTimeoutError" and "0.2 s" in error["message"]
    finally:
        built.close()
