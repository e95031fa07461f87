"""Serves one raw ASGI app in the caller's event loop (uvloop in the CLIs), so the app's
lifespan and background tasks live in the loop we own and the signals are ours, on one of two
HTTP/1 servers (docs/http_stack.md): ``granian`` (Granian's embedded server: its Rust I/O
thread parses and writes, cheapest at high concurrency) or ``uvicorn`` (uvicorn's httptools
protocol on the loop itself, no thread hand-off: cheapest at low concurrency).

SIGTERM/SIGINT: ``on_stop`` runs (a server drains its own way), then the listener closes (new
connections are refused) while requests in flight finish; those still running ``drain_s``
later are cancelled, and each gets ``cut_error`` as what it can still take, in its API's
wording (``api_errors.error_for``: Anthropic's on ``/v1/messages``): the error's response
where none had started, an SSE error event ending an event stream (the ``openai`` client
raises ``APIError``; cut without it, the client saw a dropped connection and the server
logged a traceback), the end of any other body. Then the lifespan shuts down. SIGHUP
calls ``on_reload``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from kvtide.asgi.api_errors import ApiError, Status, error_event_for, error_for
from kvtide.asgi.messages import Message, Receive, Scope, Send, ends_event, stream_tail
from kvtide.errors import ConfigError, KvtideError

log = logging.getLogger("kvtide.asgi")

App = Callable[[Scope, Receive, Send], Awaitable[None]]
KEEP_ALIVE_S = 75.0
"""Seconds an idle keep-alive connection stays open, on both servers (uvicorn's own default is
5; Granian's, its header-read timeout, 30). A server must keep one open longer than its
clients do, or a client reusing it as the server closes it loses the request mid-write
(aiohttp keeps 15 s, httpx and so the openai client 5 s, cloud load balancers 60 s; nginx's
own default is 75): with 5 s, 1 of the 458 Mooncake requests of each of two runs of
bench/gateways.py failed so."""
HttpServer = Literal["granian", "uvicorn"]
HTTP_SERVERS: tuple[HttpServer, ...] = ("granian", "uvicorn")
SHUTTING_DOWN = ApiError(
    Status(503, "service_unavailable", "shutting_down"), "the server is shutting down"
)
"""What a request cut at the drain's deadline gets, by default (``cut_error``)."""
DRAIN_CUT = "kvtide: the drain's deadline"
"""The message of the cancellation a request gets at the drain's deadline: an app tells it
from a client that went away by it."""


def check_port(host: str, port: int, flag: str = "--port") -> int:
    """The port to serve on (a free one for 0); a ConfigError naming ``flag`` when
    ``host:port`` cannot be bound (Granian would panic with a Rust backtrace instead)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"{flag}: cannot listen on {host}:{port}: {exc.strerror}") from None
        return int(probe.getsockname()[1])


class AsgiServer:
    """``serve()`` until ``shutdown()`` (or SIGTERM / SIGINT when ``handle_signals``)."""

    def __init__(
        self,
        app: App,
        host: str,
        port: int,
        *,
        on_stop: Callable[[], Awaitable[None]] | None = None,
        on_reload: Callable[[], None] | None = None,
        drain_s: float = 30.0,
        backlog: int = 1024,
        http: HttpServer = "granian",
        keep_alive_s: float = KEEP_ALIVE_S,
        cut_error: ApiError = SHUTTING_DOWN,
    ) -> None:
        self.app = app
        self.cut_error = cut_error
        self.host = host
        self.port = port
        self.on_stop = on_stop
        self.on_reload = on_reload
        self.drain_s = drain_s
        self.backlog = backlog
        self.http = http
        self.keep_alive_s = keep_alive_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: Any = None
        self._stopping: asyncio.Task[None] | None = None
        self._in_flight: set[asyncio.Task[Any]] = set()
        self._cutting = False  # the drain's deadline passed: its cancellations are ours

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _tracked(self, scope: Scope, receive: Receive, send: Send) -> None:
        # the request tasks are ours to cancel at the drain deadline (Granian's are asyncio's)
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        task = asyncio.current_task()
        assert task is not None
        sent = _Sent(send)
        self._in_flight.add(task)
        try:
            await self.app(scope, receive, sent)
        except asyncio.CancelledError:
            if not self._cutting:
                raise
            task.uncancel()
            with contextlib.suppress(Exception):  # the client may be gone too
                await sent.cut(self.cut_error, scope["path"])
        finally:
            self._in_flight.discard(task)

    async def serve(self, *, handle_signals: bool = True) -> None:
        self.loop = loop = asyncio.get_running_loop()
        signals: list[signal.Signals] = []
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.shutdown)
                signals.append(sig)
            if self.on_reload is not None:
                loop.add_signal_handler(signal.SIGHUP, self.on_reload)
                signals.append(signal.SIGHUP)
        try:
            if self.http == "uvicorn":
                await self._serve_uvicorn()
            else:
                await self._serve_granian()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)

    async def _serve_granian(self) -> None:
        from granian.constants import Interfaces
        from granian.errors import FatalError
        from granian.http import HTTP1Settings
        from granian.server.embed import Server

        self._server = Server(
            self._tracked,
            address=self.host,
            port=self.port,
            interface=Interfaces.ASGI,
            websockets=False,
            log_enabled=False,
            backlog=self.backlog,
            # hyper's header-read timer also runs while a kept-alive connection waits for its
            # next request: it is Granian's idle timeout (ms)
            http1_settings=HTTP1Settings(header_read_timeout=round(self.keep_alive_s * 1000)),
        )
        try:
            await self._server.serve()
        except FatalError as exc:  # the lifespan's startup failed: it logged why
            raise KvtideError(f"the server did not start: {exc}") from None

    async def _serve_uvicorn(self) -> None:
        import uvicorn

        config = uvicorn.Config(
            self._tracked,
            host=self.host,
            port=self.port,
            loop="none",
            http=_pipelined_protocol(),
            ws="none",
            lifespan="on",
            interface="asgi3",
            proxy_headers=False,  # no middleware between uvicorn and the app
            log_config=None,
            access_log=False,
            server_header=False,
            date_header=False,
            backlog=self.backlog,
            timeout_graceful_shutdown=int(self.drain_s) + 1,  # ours cancels at drain_s
            timeout_keep_alive=self.keep_alive_s,  # type: ignore[arg-type]  # a float works
        )
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        stopped = asyncio.Event()
        self._server = _UvicornStop(stopped)
        # startup/shutdown without serve(): its signal handlers and 0.1 s tick are not needed
        try:
            await server.startup()
        except SystemExit:  # uvicorn's answer to a failed lifespan startup: it logged why
            raise KvtideError("the server did not start: the lifespan startup failed") from None
        await stopped.wait()
        await server.shutdown()

    def shutdown(self) -> None:
        """Stops serving (idempotent): ``on_stop``, then the listener closes and the requests
        in flight get ``drain_s`` to finish."""
        if self._stopping is not None or self.loop is None:
            return
        self._stopping = self.loop.create_task(self._stop())

    async def _stop(self) -> None:
        loop = asyncio.get_running_loop()
        # one deadline for the whole drain, ``on_stop``'s own wait included: the engine's
        # waited 30 s for its requests, then this another 30 (60 s, past Kubernetes' default
        # grace period of 30)
        deadline = loop.time() + self.drain_s
        if self.on_stop is not None:
            await self.on_stop()
        self._server.stop()
        while self._in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self._in_flight:
            log.warning("drain: cancelling %d requests still in flight", len(self._in_flight))
            self._cutting = True
            for task in list(self._in_flight):
                task.cancel(DRAIN_CUT)


def _pipelined_protocol() -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, telling every request of a connection that the client
    has gone: uvicorn tells only the newest one, so a client that pipelined a second request
    behind a first and then hung up left the first running to its end (and the engine
    behind a gateway generating for no one)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class Pipelined(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.open_cycles: list[Any] = []  # this connection's requests not answered yet

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            cycles = [c for c in self.open_cycles if not c.response_complete]
            cycles.append(self.cycle)
            self.open_cycles = cycles

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            for cycle in self.open_cycles:
                if not cycle.response_complete:  # as uvicorn does for the newest
                    cycle.disconnected = True
                    cycle.message_event.set()

    return Pipelined


class _Sent:
    """A request's ``send``, noting what went out: for the answer it can still take when
    the drain's deadline cuts it (one call and three attributes a message)."""

    __slots__ = ("done", "event_stream", "send", "started", "tail")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = self.done = self.event_stream = False
        self.tail = b""  # the body's last bytes: whether it ends on an event's boundary

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.event_stream = any(
                k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                for k, v in message.get("headers", ())
            )
        elif message["type"] == "http.response.body":
            body = message.get("body", b"")
            if body:
                self.tail = stream_tail(self.tail, body)
            if not message.get("more_body", False):
                self.done = True
        await self.send(message)

    async def cut(self, err: ApiError, path: str) -> None:
        """Ends the response with ``err``, in the API of the request's ``path``."""
        if self.done:
            return
        if not self.started:
            headers = [*err.headers(), (b"connection", b"close")]
            await self.send({"type": "http.response.start", "status": err.status.http,
                             "headers": headers})  # fmt: skip
            await self.send({"type": "http.response.body", "body": error_for(path, err)})
        elif self.event_stream:
            gap = b"" if ends_event(self.tail) else b"\n\n"
            event = gap + error_event_for(path, err)
            await self.send({"type": "http.response.body", "body": event})
        else:  # a JSON body cut short: the client sees it end early
            await self.send({"type": "http.response.body", "body": b""})


class _UvicornStop:
    """``stop()`` for the uvicorn server, as Granian's server has one."""

    def __init__(self, stopped: asyncio.Event) -> None:
        self.stopped = stopped

    def stop(self) -> None:
        self.stopped.set()
