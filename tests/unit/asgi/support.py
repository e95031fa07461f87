"""What the runner's tests share: a free loopback port, and a lifespan that starts and stops."""

from __future__ import annotations

import socket

from kvtide.asgi.messages import Receive, Send


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def lifespan(receive: Receive, send: Send) -> None:
    """An app's lifespan with nothing to start or stop."""
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})
