"""Raw ASGI messages: read a request body under a size limit, answer, stream, and notice a
client that goes away. No framework: a handler is ``async (scope, receive, send)``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class Disconnected(Exception):
    """The client went away before its request body was read."""


class BodyTooLarge(Exception):
    """The body exceeds the limit: ``declared`` is its Content-Length when that told;
    ``has_more`` whether some of it is still unread (only then may a refusal read on: once
    the last part is in, the server's next ``receive`` waits for the client to go away)."""

    def __init__(self, limit: int, declared: int | None, has_more: bool) -> None:
        super().__init__(limit)
        self.limit = limit
        self.declared = declared
        self.has_more = has_more


class BodyTimeout(Exception):
    """The body did not arrive whole within ``timeout_s``: a stalled client, whose request
    would otherwise hold its handler (and a drain) for as long as it stays connected."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(timeout_s)
        self.timeout_s = timeout_s


class BadContentLength(Exception):
    pass


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of a (lower-case) request header."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def expects_continue(scope: Scope) -> bool:
    """The client sent ``Expect: 100-continue``: it waits for a ``100 Continue`` (which the
    server sends on the first ``receive``) before it uploads the body."""
    value = header(scope, b"expect")
    return value is not None and value.strip().lower() == b"100-continue"


async def read_body(
    scope: Scope, receive: Receive, limit: int, timeout_s: float | None = None
) -> bytes:
    """The whole request body; ``BodyTooLarge`` past ``limit`` bytes (by Content-Length before
    reading anything, else as it arrives), ``BodyTimeout`` if it is not all in within
    ``timeout_s`` (None: no deadline), ``Disconnected`` if the client goes away."""
    declared = header(scope, b"content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BadContentLength from None
        if size > limit:
            raise BodyTooLarge(limit, size, has_more=size > 0)
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            return await _receive_body(receive, limit)
    except TimeoutError:
        if timeout_s is None or not deadline.expired():  # not ours: the server's own
            raise
        raise BodyTimeout(timeout_s) from None


async def _receive_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise Disconnected
        chunk: bytes = msg.get("body", b"")
        more_body = bool(msg.get("more_body", False))
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit, None, has_more=more_body)
        chunks.append(chunk)
        if not more_body:
            return b"".join(chunks)


async def discard_body(receive: Receive, max_bytes: int, timeout_s: float | None = None) -> None:
    """Reads and drops up to ``max_bytes`` more of a refused body, so that a client which
    sends its whole body before reading the answer (urllib, curl) gets the answer rather
    than a broken pipe; for at most ``timeout_s``, so a client that stalls does not hold the
    answer. Call it only while some of the body is unread (``BodyTooLarge.has_more``)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            size = 0
            while size <= max_bytes:
                msg = await receive()
                if msg["type"] == "http.disconnect" or not msg.get("more_body", False):
                    return
                size += len(msg.get("body", b""))


async def respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """A whole response: start and body in two messages."""
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def start_stream(send: Send, status: int, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})


def ends_event(tail: bytes) -> bool:
    """Whether a stream whose last bytes are ``tail`` (``stream_tail``) ends on an SSE event
    boundary, a blank line (LF or CRLF): what is sent after it is an event of its own."""
    return not tail or tail.endswith((b"\n\n", b"\n\r\n"))


def stream_tail(tail: bytes, data: bytes) -> bytes:
    """The last bytes ``ends_event`` reads of a stream that ended in ``tail``, then ``data``."""
    return data[-3:] if len(data) >= 3 else (tail + data)[-3:]


async def send_chunk(send: Send, data: bytes) -> None:
    """One chunk of a streamed body (an SSE event, or several), sent as it is, unbuffered."""
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def end_stream(send: Send, data: bytes = b"") -> None:
    await send({"type": "http.response.body", "body": data})


def watch_disconnect(
    receive: Receive, on_disconnect: Callable[[], object]
) -> asyncio.Future[Message]:
    """Calls ``on_disconnect`` when the client goes away (after the body has been read, the
    next ``receive`` returns only ``http.disconnect``). The caller cancels the returned
    future when its response is done, so a finished request's disconnect is not reported."""
    waiting = asyncio.ensure_future(receive())

    def done(fut: asyncio.Future[Message]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            on_disconnect()

    waiting.add_done_callback(done)
    return waiting
