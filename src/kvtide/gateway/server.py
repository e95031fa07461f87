"""The gateway's HTTP side: a raw ASGI app over a ``Gateway``, served by ``kvtide.asgi``.

Routes: the OpenAI endpoints (``/v1/responses`` and its stored answers among them),
Anthropic's ``/v1/messages``, vLLM's tokenizer and pooling endpoints (passed through),
``/health``, ``/ready``, ``/metrics`` and the admin API. Every
refusal is an error body from one handler and one status table (``gateway.status``), in the
route's API's wording (OpenAI's; Anthropic's on ``/v1/messages``); the lifespan runs
``Gateway.lifespan`` (its ``TaskGroup`` owns the background loops). SIGTERM/SIGINT drain: new
connections are refused at once, requests in flight get ``timeouts.drain_s``; SIGHUP reloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from kvtide.asgi import (
    ApiError,
    AsgiServer,
    Disconnected,
    Receive,
    Scope,
    Send,
    check_port,
    header,
    read_body,
    respond,
    watch_disconnect,
)
from kvtide.asgi.api_errors import error_for, speaks_anthropic
from kvtide.asgi.messages import (
    BadContentLength,
    BodyTimeout,
    BodyTooLarge,
    discard_body,
    expects_continue,
)
from kvtide.errors import ConfigError, KvtideError
from kvtide.gateway.access_log import Exchange
from kvtide.gateway.app import PASSED_THROUGH, Api, Gateway, json_object
from kvtide.gateway.config import (
    REPLICA_OPTIONS,
    GatewayConfig,
    ReplicaSpec,
    check_replica_option,
)
from kvtide.gateway.replicas import Replica
from kvtide.gateway.status import (
    BAD_REQUEST,
    METHOD_NOT_ALLOWED,
    NOT_FOUND,
    REQUEST_TIMEOUT,
    SHUTTING_DOWN,
    TOO_LARGE,
    as_api_error,
)

log = logging.getLogger("kvtide.gateway")

JSON = [(b"content-type", b"application/json")]
PROMETHEUS = [(b"content-type", b"text/plain; charset=utf-8")]
ADMIN_REPLICAS = "/admin/replicas"

Handler = Callable[[Scope, Receive, Send], Awaitable[int]]
"""A route: answers through ``send``, returns the HTTP status (for the requests counter)."""
Answer = Callable[[bytes, Exchange], Awaitable[int]]
"""What answers a request the engines answer, given its body and its record; the status."""


_REQUEST_ID = "kvtide.request_id"
"""The scope key a completion's id is kept under, for the error answer ``_http`` writes."""


def _client_id(scope: Scope) -> str | None:
    """The client's ``X-Request-Id`` when it is 1-128 printable ASCII characters (it goes
    into a JSON log line: no control characters, no unbounded size)."""
    value = header(scope, b"x-request-id")
    if value is None or not 0 < len(value) <= 128 or not value.isascii():
        return None
    text = value.decode("ascii")
    return text if text.isprintable() else None


RESPONSES = "/v1/responses"


def _authorization(scope: Scope) -> str | None:
    value = header(scope, b"authorization")
    if value is None and speaks_anthropic(scope["path"]):
        # Anthropic's clients send their key as X-Api-Key (``ANTHROPIC_API_KEY``), Bearer
        # only as an auth token: either is the tenant's key here
        key = header(scope, b"x-api-key")
        return None if key is None else "Bearer " + key.decode("latin-1")
    return value.decode("latin-1") if value is not None else None


async def _json(send: Send, status: int, obj: Any) -> int:
    await respond(send, status, orjson.dumps(obj), JSON)
    return status


class GatewayApp:
    """The ASGI callable over one ``Gateway``."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/messages"): self._messages,
            ("POST", "/v1/responses"): self._responses,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/ready"): self._ready,
            ("GET", "/metrics"): self._metrics,
            ("GET", ADMIN_REPLICAS): self._list_replicas,
            ("POST", ADMIN_REPLICAS): self._add_replica,
        }
        for path in PASSED_THROUGH:
            self._routes["POST", path] = self._pass_through
        self._paths = {path for _, path in self._routes}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    def _route(self, scope: Scope) -> tuple[str, Handler]:
        """The route's canonical name (the requests counter's label) and its handler."""
        method, path = scope["method"], scope["path"]
        handler = self._routes.get((method, path))
        if handler is not None:
            return path, handler
        if path.startswith(ADMIN_REPLICAS + "/"):
            rest = path[len(ADMIN_REPLICAS) + 1 :]
            if rest.endswith("/drain") and "/" not in rest[: -len("/drain")]:
                name = ADMIN_REPLICAS + "/{replica}/drain"
                if method == "POST":
                    return name, self._drain_replica
                return name, _refuse(METHOD_NOT_ALLOWED, f"method {method} not allowed")
            if rest and "/" not in rest:
                name = ADMIN_REPLICAS + "/{replica}"
                if method == "DELETE":
                    return name, self._remove_replica
                return name, _refuse(METHOD_NOT_ALLOWED, f"method {method} not allowed")
        if path.startswith(RESPONSES + "/"):
            rest = path[len(RESPONSES) + 1 :]
            cancel = rest.endswith("/cancel")
            if rest and "/" not in (rest[: -len("/cancel")] if cancel else rest):
                name = RESPONSES + ("/{response}/cancel" if cancel else "/{response}")
                if method == ("POST" if cancel else "GET"):
                    return name, self._stored_response
                return name, _refuse(METHOD_NOT_ALLOWED, f"method {method} not allowed")
        if path in self._paths:
            return path, _refuse(METHOD_NOT_ALLOWED, f"method {method} not allowed")
        return "other", _refuse(NOT_FOUND, "Not Found")

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        metrics = self.gateway.metrics
        endpoint, handler = self._route(scope)
        try:
            status = await handler(scope, receive, send)
        except Disconnected:
            return
        except Exception as exc:
            err = as_api_error(exc)
            if err.status.http >= 500 and not isinstance(exc, KvtideError):
                log.exception("unexpected error on %s", scope["path"])
            if 400 <= err.status.http < 500:
                metrics.rejected.labels(err.status.code).inc()
            status = err.status.http
            headers = err.headers()
            request_id = scope.get(_REQUEST_ID)
            if request_id:  # a refused completion keeps its id: the access log's line has it
                headers.append((b"x-request-id", request_id))
            # a Messages client gets Anthropic's error object (its exception classes read it)
            with contextlib.suppress(Exception):  # the response had started, or no client
                await respond(send, status, error_for(scope["path"], err), headers)
        metrics.child(metrics.requests, endpoint, str(status)).inc()

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        config = self.gateway.config  # read per request: a reload may change the limit
        body_s, limit = config.timeouts.body_s, config.limits.max_body_bytes
        try:
            return await read_body(scope, receive, limit, body_s)
        except BadContentLength:
            raise ApiError(BAD_REQUEST, "bad Content-Length header") from None
        except BodyTimeout as exc:
            raise _ClosingError(
                REQUEST_TIMEOUT, f"the request body did not arrive within {exc.timeout_s:g} s"
            ) from None
        except BodyTooLarge as exc:
            message = f"the request body exceeds {exc.limit} bytes"
            if exc.declared is not None and expects_continue(scope):
                # nothing received, so no "100 Continue" sent: the client has not uploaded,
                # and a receive() would tell it to; the 413 goes at once, closing
                raise _ClosingError(TOO_LARGE, message, "body") from None
            if exc.has_more:  # once the last part is in, receive() waits for a disconnect
                # read (and drop) a bounded tail: a connection closed on an unread body
                # resets, and a client still sending (urllib, curl) would see a broken pipe,
                # not the 413
                await discard_body(receive, 2 * limit, body_s)
            raise ApiError(TOO_LARGE, message, "body") from None

    # --- lifespan -----------------------------------------------------------------------------

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "lifespan.startup":
            return
        started = False
        try:
            async with self.gateway.lifespan():
                await send({"type": "lifespan.startup.complete"})
                started = True
                while (await receive())["type"] != "lifespan.shutdown":
                    pass
        except Exception as exc:
            log.exception("gateway lifespan failed")
            if not started:
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
        await send({"type": "lifespan.shutdown.complete"})

    # --- completions --------------------------------------------------------------------------

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._complete(scope, receive, send, "/v1/chat/completions", "chat")

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._complete(scope, receive, send, "/v1/completions", "completions")

    async def _messages(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._complete(scope, receive, send, "/v1/messages", "messages")

    async def _responses(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._complete(scope, receive, send, RESPONSES, "responses")

    async def _stored_response(self, scope: Scope, receive: Receive, send: Send) -> int:
        """``GET /v1/responses/{id}`` or ``POST /v1/responses/{id}/cancel``: answered by the
        engine that holds the response."""
        gateway, path = self.gateway, scope["path"]
        response_id = path[len(RESPONSES) + 1 :].removesuffix("/cancel")
        query = scope.get("query_string") or b""
        upstream = path + "?" + query.decode("latin-1") if query else path

        def answer(raw: bytes, exchange: Exchange) -> Awaitable[int]:
            return gateway.stored_response(
                send, scope["method"], upstream, response_id, _authorization(scope), exchange
            )

        return await self._exchange(scope, receive, "responses_stored", answer)

    async def _complete(
        self, scope: Scope, receive: Receive, send: Send, path: str, api: Api
    ) -> int:
        gateway = self.gateway

        def answer(raw: bytes, exchange: Exchange) -> Awaitable[int]:
            return gateway.complete(send, path, api, _authorization(scope), raw, exchange)

        return await self._exchange(scope, receive, api, answer)

    async def _pass_through(self, scope: Scope, receive: Receive, send: Send) -> int:
        gateway, path = self.gateway, scope["path"]

        def answer(raw: bytes, exchange: Exchange) -> Awaitable[int]:
            return gateway.pass_through(send, path, _authorization(scope), raw, exchange)

        return await self._exchange(scope, receive, PASSED_THROUGH[path], answer)

    async def _exchange(self, scope: Scope, receive: Receive, endpoint: str, answer: Answer) -> int:
        """A request the engines answer: given its id, answered by ``answer`` once its body
        is in, logged (``--access-log``)."""
        gateway = self.gateway
        exchange = gateway.exchange(endpoint, _client_id(scope))
        scope[_REQUEST_ID] = exchange.request_id_bytes
        access_log = gateway.access_log
        if access_log is None:
            return await self._answer(scope, receive, answer, exchange)
        status, error = 500, None
        try:
            status = await self._answer(scope, receive, answer, exchange)
        except Exception as exc:  # _http answers it; the log says what it answered
            err = as_api_error(exc)
            status, error = err.status.http, err.status.code
            raise
        except asyncio.CancelledError:  # the drain's deadline passed: no answer went back
            error = "cancelled"
            raise
        finally:
            access_log.record(exchange, status, error, gateway.clock.now())
        return status

    async def _answer(
        self, scope: Scope, receive: Receive, answer: Answer, exchange: Exchange
    ) -> int:
        raw = await self._body(scope, receive)
        # a client that goes away cancels this handler, which closes the upstream connection
        task = asyncio.current_task()
        assert task is not None
        gone = False

        def disconnected() -> None:
            nonlocal gone
            if exchange.answered:  # the client closed after its answer (the openai client
                return  # does at a stream's [DONE]) while the engine's connection drains
            gone = True
            task.cancel()

        watcher = watch_disconnect(receive, disconnected)
        try:
            return await answer(raw, exchange)
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()
            return 499  # nginx's "client closed request", for the requests counter
        finally:
            watcher.cancel()

    # --- plain routes -------------------------------------------------------------------------

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> int:
        gateway = self.gateway
        gateway.tenants.authenticate(_authorization(scope))
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "kvtide"}
            for m in gateway.replicas.models()
        ]
        return await _json(send, 200, {"object": "list", "data": data})

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await _json(send, 200, {"status": "ok"})

    async def _ready(self, scope: Scope, receive: Receive, send: Send) -> int:
        gateway = self.gateway
        ok, body = gateway.ready(detail=gateway.sees_detail(_authorization(scope)))
        return await _json(send, 200 if ok else 503, body)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> int:
        gateway, metrics = self.gateway, self.gateway.metrics
        # Degraded is decided wherever a Redis call fails, not only in the maintenance tick:
        # read it at scrape time so the gauge never disagrees with /ready.
        if gateway.shared is not None:
            metrics.state_degraded.set(1 if gateway.shared.degraded else 0)
        cache = gateway.prompts.prefix_cache
        metrics.prefix_cache_tokens.set(cache.tokens)
        metrics.prefix_cache_entries.set(len(cache))
        memo = getattr(gateway.prompts.tokenizer, "memo", None)
        if memo is not None:
            metrics.export_chunk_memo(memo.tokens, memo.hits, memo.misses)
        await respond(send, 200, metrics.render(), PROMETHEUS)
        return 200

    # --- admin --------------------------------------------------------------------------------

    async def _list_replicas(self, scope: Scope, receive: Receive, send: Send) -> int:
        self.gateway.check_admin(_authorization(scope))
        return await _json(send, 200, self.gateway.ready()[1]["replicas"])

    async def _add_replica(self, scope: Scope, receive: Receive, send: Send) -> int:
        self.gateway.check_admin(_authorization(scope))
        body = json_object(await self._body(scope, receive))
        url = body.get("url")
        if not isinstance(url, str):
            raise ApiError(BAD_REQUEST, "'url' must be a string", "url")
        # all checked before anything is added: a model of 5 once added broke /v1/models
        for key in REPLICA_OPTIONS:
            try:
                check_replica_option(key, body.get(key), key)
            except ConfigError as exc:
                raise ApiError(BAD_REQUEST, str(exc), key) from exc
        try:
            spec = ReplicaSpec.parse(url, "url").with_options(body, "body")
        except ConfigError as exc:
            raise ApiError(BAD_REQUEST, str(exc), "url") from exc
        replica = self.gateway.add_replica(spec)
        return await _json(send, 201, {"id": replica.replica_id})

    def _replica(self, scope: Scope) -> Replica:
        self.gateway.check_admin(_authorization(scope))
        name = scope["path"][len(ADMIN_REPLICAS) + 1 :].removesuffix("/drain")
        replica = self.gateway.replicas.get(name)
        if replica is None:
            raise ApiError(NOT_FOUND, f"no replica {name}", "replica")
        return replica

    async def _drain_replica(self, scope: Scope, receive: Receive, send: Send) -> int:
        replica = self._replica(scope)
        replica.draining = True
        replica.state.healthy = False
        return await _json(send, 200, {"id": replica.replica_id, "in_flight": replica.in_flight})

    async def _remove_replica(self, scope: Scope, receive: Receive, send: Send) -> int:
        replica = self._replica(scope)
        self.gateway.remove_replica(replica.replica_id)
        return await _json(send, 200, {"id": replica.replica_id, "removed": True})


class _ClosingError(ApiError):
    """A refusal after which the connection closes: the request's body is not (all) read, so
    the connection cannot carry another request."""

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [*super().headers(), (b"connection", b"close")]


def _refuse(status: Any, message: str) -> Handler:
    async def refuse(scope: Scope, receive: Receive, send: Send) -> int:
        raise ApiError(status, message)

    return refuse


def build_app(gateway: Gateway) -> GatewayApp:
    return GatewayApp(gateway)


async def run(config: GatewayConfig, started: Callable[[str], None] | None = None) -> None:
    """Serves until SIGTERM or SIGINT, then drains (no new connections; in-flight requests get
    up to ``timeouts.drain_s``); SIGHUP reloads."""
    port = check_port(config.host, config.port)
    gateway = Gateway(config)

    async def stop() -> None:
        gateway.draining = True

    server = AsgiServer(
        build_app(gateway),
        config.host,
        port,
        on_stop=stop,
        on_reload=gateway.reload,
        drain_s=config.timeouts.drain_s,
        http="granian" if config.http_server == "granian" else "uvicorn",
        keep_alive_s=config.timeouts.keep_alive_s,
        cut_error=ApiError(SHUTTING_DOWN, "the gateway is shutting down"),
    )
    announce = started or (
        lambda u: print(f"kvtide serve: listening on {u}", file=sys.stderr, flush=True)
    )
    announce(server.url)
    await server.serve()


def serve(config: GatewayConfig) -> None:
    import uvloop

    uvloop.run(run(config))
