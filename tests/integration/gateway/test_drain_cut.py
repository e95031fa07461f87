"""A stream cut at the drain's deadline, in process: the client gets the gateway's error
event, and the gateway does not count it as a client that went away (its
``kvtide_gateway_client_disconnects_total`` stays where it was)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from tests.integration.gateway.procs import backend, free_port

from kvtide.asgi import ApiError, AsgiServer
from kvtide.gateway.app import Gateway
from kvtide.gateway.config import GatewayConfig, ReplicaSpec
from kvtide.gateway.server import build_app
from kvtide.gateway.status import SHUTTING_DOWN

pytestmark = pytest.mark.timeout(60)


def _disconnects(gateway: Gateway) -> float:
    for line in gateway.metrics.render().decode().splitlines():
        if line.startswith("kvtide_gateway_client_disconnects_total "):
            return float(line.split()[1])
    raise AssertionError("no client disconnects counter")


def _cut(path: str, body: dict[str, object]) -> tuple[bytes, Gateway]:
    """A stream of ``path`` through an in-process gateway whose drain (0.5 s) begins once the
    stream is on: what the client got, and the gateway."""
    bport, port = free_port(), free_port()
    slow = backend(bport, "m", "--token-delay", "0.2", "--tokens", "40")
    try:
        config = GatewayConfig(replicas=(ReplicaSpec.parse(f"http://127.0.0.1:{bport}=m"),))
        gateway = Gateway(config)
        server = AsgiServer(
            build_app(gateway),
            "127.0.0.1",
            port,
            drain_s=0.5,
            http="uvicorn",
            cut_error=ApiError(SHUTTING_DOWN, "the gateway is shutting down"),
        )

        async def scenario() -> bytes:
            serving = asyncio.create_task(server.serve(handle_signals=False))
            await asyncio.sleep(1.0)
            url = f"http://127.0.0.1:{port}{path}"
            async with aiohttp.ClientSession() as session, session.post(url, json=body) as r:
                first = await r.content.readany()  # the stream is on
                server.shutdown()
                rest = await r.content.read()
            await serving
            return first + rest

        return asyncio.run(scenario()), gateway
    finally:
        slow.stop()


def test_a_stream_cut_at_the_drain_deadline_is_not_a_client_disconnect() -> None:
    streamed, gateway = _cut("/v1/completions", {"model": "m", "prompt": "go", "stream": True})
    assert b"the gateway is shutting down" in streamed
    assert _disconnects(gateway) == 0


def test_a_messages_stream_cut_at_the_drain_deadline_ends_with_anthropics_error_event() -> None:
    """The same cut on /v1/messages: an Anthropic ``error`` event, which the ``anthropic``
    client raises, not OpenAI's ``data:`` error object, which it would not understand."""
    body = {"model": "m", "max_tokens": 40, "stream": True,
            "messages": [{"role": "user", "content": "go"}]}  # fmt: skip
    streamed, _ = _cut("/v1/messages", body)
    assert streamed.startswith(b"event: message_start"), streamed[:80]
    last = streamed.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"event: error\ndata: "), last
    error = json.loads(last.split(b"data: ", 1)[1])
    shutting = {"type": "overloaded_error", "message": "the gateway is shutting down"}
    assert error == {"type": "error", "error": shutting}
