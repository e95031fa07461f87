"""A stream cut at the drain's deadline, in process: the client gets the gateway's error
event, and the gateway does not count it as a client that went away (its
``kvtide_gateway_client_disconnects_total`` stays where it was)."""

from __future__ import annotations

import asyncio

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


def test_a_stream_cut_at_the_drain_deadline_is_not_a_client_disconnect() -> None:
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
            body = {"model": "m", "prompt": "go", "stream": True}
            url = f"http://127.0.0.1:{port}/v1/completions"
            async with aiohttp.ClientSession() as session, session.post(url, json=body) as r:
                first = await r.content.readany()  # the stream is on
                server.shutdown()
                rest = await r.content.read()
            await serving
            return first + rest

        streamed = asyncio.run(scenario())
        assert b"the gateway is shutting down" in streamed
        assert _disconnects(gateway) == 0
    finally:
        slow.stop()
