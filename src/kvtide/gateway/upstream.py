"""The gateway's HTTP/1.1 client to the engines: pooled keep-alive connections on an asyncio
``Protocol``, responses parsed by httptools (llhttp), bodies handed on as they arrive.

Chosen over aiohttp's ``ClientSession`` by measurement (docs/http_stack.md): the gateway only
ever sends small JSON POSTs and GETs to known ``http://host:port`` engines, so a client that
does only that costs a fraction of a general one. Every wait has a deadline: ``connect_s`` to
connect, ``read_s`` between two pieces of a response (the first byte included), or the
caller's ``timeout_s`` for a whole small request. A connection goes back to the pool only
after a complete response the server did not ask to close; anything else closes it, which an
engine sees as the client going away (it aborts the request).
"""

from __future__ import annotations

import asyncio
import collections
from typing import cast
from urllib.parse import urlsplit

import httptools

_MAX_IDLE_PER_HOST = 256
_PAUSE_BYTES = 1 << 20
"""Unread body over this much pauses reading from the engine until the client catches up."""


class UpstreamClosed(ConnectionError):
    """The engine closed the connection (or sent what llhttp cannot parse) before the
    response was complete."""


class _Conn(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    __slots__ = (
        "_buffered",
        "_paused",
        "_waiter",
        "body",
        "complete",
        "error",
        "header_name",
        "headers",
        "headers_done",
        "idle_since",
        "keep_alive",
        "key",
        "parser",
        "transport",
    )

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.headers: dict[bytes, bytes] = {}
        self.header_name = b""
        self.headers_done = False
        self.keep_alive = False
        self.complete = False
        self.body: collections.deque[bytes] = collections.deque()
        self.error: Exception | None = None
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._buffered = 0
        self._paused = False

    # --- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamClosed(f"bad response from the engine: {exc}"))
            return
        if self._buffered > _PAUSE_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.complete:
            self._fail(UpstreamClosed(f"the engine closed the connection: {exc or 'EOF'}"))
        self.transport = None

    # --- httptools callbacks ----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.headers_done = True
        # llhttp forgets it once the message is complete: ask while the head is current
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        self.complete = True

    # --- the client's side -------------------------------------------------------------------

    def _fail(self, exc: Exception) -> None:
        if self.error is None:
            self.error = exc
        self._wake()
        if self.transport is not None:
            self.transport.close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def is_usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.parser = httptools.HttpResponseParser(self)
        self.headers = {}
        self.headers_done = self.complete = self.keep_alive = False
        self.body.clear()
        self._buffered = 0
        self.error = None
        self.transport.write(data)

    async def wait(self, timeout_s: float) -> None:
        """Until more of the response arrives (or it fails); TimeoutError after ``timeout_s``."""
        if self.error is not None:
            raise self.error
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        if self.error is not None:
            raise self.error

    def take(self) -> bytes:
        """The body bytes received since the last call (b"" when none)."""
        body = self.body
        if not body:
            return b""
        data = body.popleft() if len(body) == 1 else b"".join(body)
        body.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no response from the engine in time"))


class Response:
    """One response: ``status`` and ``headers`` (lower-case names) once its head is in; the
    body by ``read_chunk`` (as it arrives) or ``read``. ``close()`` always, when done."""

    __slots__ = ("_conn", "_pool", "_read_s", "headers", "status")

    def __init__(self, pool: UpstreamPool, conn: _Conn, read_s: float) -> None:
        self._pool = pool
        self._conn = conn
        self._read_s = read_s
        self.status = conn.parser.get_status_code()
        self.headers = conn.headers

    async def read_chunk(self, wait_s: float | None = None) -> bytes:
        """The body received since the last call, waiting up to ``wait_s`` (default
        ``read_s``) for some; b"" at the end of the body."""
        conn = self._conn
        while True:
            data = conn.take()
            if data:
                return data
            if conn.complete:
                return b""
            await conn.wait(self._read_s if wait_s is None else wait_s)

    async def read(self, max_bytes: int | None = None) -> bytes:
        """The body (its first ``max_bytes`` when given)."""
        parts: list[bytes] = []
        size = 0
        while max_bytes is None or size < max_bytes:
            data = await self.read_chunk()
            if not data:
                break
            parts.append(data)
            size += len(data)
        body = b"".join(parts)
        return body if max_bytes is None else body[:max_bytes]

    def close(self) -> None:
        """Back to the pool after a complete keep-alive response; closed otherwise."""
        conn = self._conn
        if conn.complete and conn.error is None and conn.keep_alive:
            self._pool.release(conn)
        else:
            conn.close()


class UpstreamPool:
    """Keep-alive connections per ``host:port``, reused most recent first."""

    def __init__(
        self, connect_s: float, read_s: float, idle_s: float = 60.0, headers: bytes = b""
    ) -> None:
        self.connect_s = connect_s
        self.read_s = read_s
        self.idle_s = idle_s
        self.headers = headers
        """Header lines (each ending in CRLF) sent with every request: the engines' key."""
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._origins: dict[str, tuple[tuple[str, int], bytes]] = {}
        self._closed = False

    def _origin(self, base_url: str) -> tuple[tuple[str, int], bytes]:
        found = self._origins.get(base_url)
        if found is None:
            parts = urlsplit(base_url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"only http://host:port engines are supported: {base_url}")
            host, port = parts.hostname, parts.port or 80
            found = self._origins[base_url] = ((host, port), parts.netloc.encode())
        return found

    async def _connect(self, key: tuple[str, int]) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_s):
                _, conn = await loop.create_connection(lambda: _Conn(key), *key)
        except TimeoutError:
            raise TimeoutError(f"connecting to {key[0]}:{key[1]} timed out") from None
        return conn

    def _take_idle(self, key: tuple[str, int], now: float) -> _Conn | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.is_usable and now - conn.idle_since < self.idle_s:
                return conn
            conn.close()
        return None

    def release(self, conn: _Conn) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if self._closed or len(idle) >= _MAX_IDLE_PER_HOST or not conn.is_usable:
            conn.close()
            return
        conn.idle_since = asyncio.get_running_loop().time()
        idle.append(conn)

    async def request(
        self,
        method: bytes,
        base_url: str,
        path: str,
        body: bytes = b"",
        content_type: bytes = b"application/json",
        read_s: float | None = None,
        headers: bytes = b"",
    ) -> Response:
        """Sends one request and waits for the response's head (up to ``read_s``, default the
        pool's); ``OSError`` (``UpstreamClosed`` among them) or ``TimeoutError`` on failure.
        ``headers``: more header lines, each ending in CRLF."""
        key, host = self._origin(base_url)
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\n%s%s" % (
            method,
            path.encode(),
            host,
            self.headers,
            headers,
        )
        if body or method == b"POST":
            head += b"Content-Type: %s\r\nContent-Length: %d\r\n" % (content_type, len(body))
        data = head + b"\r\n" + body
        wait_s = self.read_s if read_s is None else read_s
        loop = asyncio.get_running_loop()
        conn = self._take_idle(key, loop.time())
        if conn is not None:
            conn.send(data)
            try:
                await _head(conn, wait_s)
                return Response(self, conn, wait_s)
            except UpstreamClosed:
                # the engine closed an idle connection as we reused it, before any byte of an
                # answer: the request never started there, send it on a fresh connection
                conn.close()
                if conn.headers_done:
                    raise
            except BaseException:
                conn.close()
                raise
        conn = await self._connect(key)
        conn.send(data)
        try:
            await _head(conn, wait_s)
        except BaseException:
            conn.close()
            raise
        return Response(self, conn, wait_s)

    async def get(self, base_url: str, path: str, timeout_s: float) -> bytes | None:
        """A small GET's body when it answers 200 within ``timeout_s``, else None."""
        got = await self.get_status(base_url, path, timeout_s)
        return got[1] if got is not None and got[0] == 200 else None

    async def get_status(
        self, base_url: str, path: str, timeout_s: float
    ) -> tuple[int, bytes] | None:
        """A small GET's status and body within ``timeout_s``, else None."""
        try:
            async with asyncio.timeout(timeout_s):
                resp = await self.request(b"GET", base_url, path, read_s=timeout_s)
                try:
                    return resp.status, await resp.read()
                finally:
                    resp.close()
        except (OSError, TimeoutError, ValueError):
            return None

    async def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


async def _head(conn: _Conn, timeout_s: float) -> None:
    while not conn.headers_done:
        await conn.wait(timeout_s)
