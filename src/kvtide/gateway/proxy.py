"""Forwarding one request to an engine: route, send, pass the answer through.

A failure before the first byte (connect error, timeout, 5xx) books a failure against the
replica and retries once on another one; after the first byte nothing is retried: the client
gets one SSE error event (which names neither the engine nor its error: the log does) and the
end of the stream. Streams are written in whole SSE events as the engine sends them (the
start of an event waits for its end); the client's stream ends at the engine's
``data: [DONE]``, and the engine's end of body is read after it, for the connection's reuse.
A client that disconnects before its answer is whole cancels the handler (``gateway.server``
watches for ``http.disconnect``), which closes the upstream connection, which aborts the
engine's request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import orjson

from kvtide.asgi import Send, respond
from kvtide.asgi.messages import (
    end_stream,
    ends_event,
    send_chunk,
    start_stream,
    stream_tail,
)
from kvtide.asgi.runner import DRAIN_CUT
from kvtide.errors import NoHealthyReplica, UpstreamTimeout, UpstreamUnavailable
from kvtide.gateway.access_log import Exchange
from kvtide.gateway.admission import Admission
from kvtide.gateway.dialects import OPENAI, Dialect
from kvtide.gateway.metrics import GatewayMetrics
from kvtide.gateway.replicas import PRIORITY_RETRY_S, Replica, ReplicaSet, Stage
from kvtide.gateway.response_homes import ResponseHomes
from kvtide.gateway.status import BAD_GATEWAY, ApiError
from kvtide.gateway.upstream import Response, UpstreamPool
from kvtide.gateway.usage import OutputCounter, UsageHider, whole_events
from kvtide.routing import RouteDecision, RouteRequest
from kvtide.routing.router import Router
from kvtide.types import ReplicaId

log = logging.getLogger(__name__)

# vLLM's 400 for a priority under FCFS ("Got priority 5 but Priority scheduling is not
# enabled."); kvtide engine's says the same
_PRIORITY_OFF = re.compile(rb"priority scheduling is not enabled", re.IGNORECASE)
_PASSED_HEADERS = (b"content-type", b"cache-control")
_AFTER_DONE_S = 2.0
"""How long an engine gets to end its body after ``[DONE]`` before its connection is closed
instead of reused (it has nothing more to send; the client's stream has ended already)."""


Chosen = tuple[Replica, RouteDecision]
"""A routing step's answer: the replica and the router's decision."""


class _Failed(Exception):
    """An attempt failed before its first byte: retry elsewhere."""

    def __init__(self, kind: str, error: Exception) -> None:
        super().__init__(kind)
        self.kind = kind
        self.error = error


class _PriorityRefused(Exception):
    """The engine answered 400 to the ``priority`` the router set: it does not schedule by
    priority. Nothing reached the client; the request is sent again without one."""


class _Booking:
    """Whether the request's prefill was reported to the router (then it completes, else
    it is cancelled), and what its stream passed on to the client."""

    __slots__ = ("prefilled", "sent")

    def __init__(self, count_output: bool) -> None:
        self.prefilled = False
        self.sent = _Sent(count_output)


class _Sent:
    """The bytes of a stream passed on to its client, as far as they matter afterwards:
    the completion tokens they carried (``OutputCounter``, kept only for a tenant held to
    tokens per minute: ~1 µs an event otherwise spent for nothing) and whether they end on
    an event boundary."""

    __slots__ = ("output", "tail")

    def __init__(self, count_output: bool) -> None:
        self.output = OutputCounter() if count_output else None
        self.tail = b""

    def take(self, data: bytes) -> bytes:
        """Notes ``data``, about to be sent; ``data``."""
        if self.output is not None:
            self.output.take(data)
        self.tail = stream_tail(self.tail, data)
        return data


class _Routed:
    """The router's part in one attempt: told when its prefill ends, what its engine
    reused, and its end (or its cancellation)."""

    __slots__ = ("decision", "route", "router")

    def __init__(self, router: Router, route: RouteRequest, decision: RouteDecision) -> None:
        self.router = router
        self.route = route
        self.decision = decision

    def prefill_done(self, cached: int | None = None, *, on_time: bool = True) -> None:
        self.router.prefill_done(self.route, self.decision, cached, on_time=on_time)

    def report(self, cached: int) -> None:
        self.router.report(self.route, self.decision, cached)

    def complete(self) -> None:
        self.router.complete(self.route, self.decision, 0)

    def cancel(self) -> None:
        self.router.cancel(self.route, self.decision)


class _Unrouted(_Routed):
    """An attempt the router did not place (a disaggregated request's decode leg, sent to the
    least loaded decoder): nothing to tell it."""

    __slots__ = ()

    def __init__(self) -> None:
        pass

    def prefill_done(self, cached: int | None = None, *, on_time: bool = True) -> None:
        pass

    def report(self, cached: int) -> None:
        pass

    def complete(self) -> None:
        pass

    def cancel(self) -> None:
        pass


_UNROUTED = _Unrouted()


class _Captured:
    """An ASGI ``send`` that keeps a whole answer (a prefill leg's) for the gateway."""

    __slots__ = ("body", "headers", "status")

    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""

    async def __call__(self, message: Any) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", ()))
        else:
            self.body += message.get("body", b"")


class Proxy:
    def __init__(
        self,
        replicas: ReplicaSet,
        router: Router,
        pool: UpstreamPool,
        metrics: GatewayMetrics,
        now_s: Callable[[], float],
        choose: Callable[
            [RouteRequest, str, ReplicaId | None, ReplicaId | None, Stage], Chosen | None
        ],
        admission: Admission,
        homes: ResponseHomes,
    ) -> None:
        self.replicas = replicas
        self.router = router
        self.pool = pool
        self.metrics = metrics
        self.now_s = now_s
        self.choose = choose
        """The gateway's routing step (``Gateway.choose``): candidates, router, metrics."""
        self.admission = admission
        self.homes = homes
        """Where each Responses answer passed on is kept (its engine)."""

    async def forward(
        self,
        send: Send,
        path: str,
        body: dict[str, Any],
        route: RouteRequest,
        model: str,
        stream: bool,
        exchange: Exchange,
        dialect: Dialect = OPENAI,
        home: ReplicaId | None = None,
        stage: Stage = None,
    ) -> int:
        """Answers the client through ``send`` (``body``: the request as the engine gets it,
        in ``dialect``'s API); the HTTP status it got. ``exchange`` has the arrival and gets
        the route taken. ``home``: the replica holding what the request builds on (its
        ``previous_response_id``), which takes it while it can. Where the model's replicas
        prefill and decode apart, the request is sent as two legs (``_disaggregated``);
        ``stage`` says which leg this is."""
        if stage is None and home is None and self.replicas.disaggregated(model):
            return await self._disaggregated(
                send, path, body, route, model, stream, exchange, dialect
            )
        arrival_s = exchange.arrival_s
        tried = None
        last: _Failed | None = None
        payload = b""
        attempt = 0
        while attempt < 2:
            # under a cap per replica: wait for room, then route at once (no await between)
            await self.admission.wait(model, tried, stage)
            chosen = self.choose(route, model, tried, home, stage)
            if chosen is None:
                break
            replica, decision = chosen
            exchange.attempts += 1
            exchange.replica = replica.replica_id
            exchange.route = decision.reason
            exchange.predicted_cached_tokens = decision.cached_tokens
            priority = decision.engine_priority(exchange.ts) if dialect.takes_priority else None
            prioritised = priority is not None and replica.takes_priority(self.now_s())
            exchange.priority = priority if prioritised else None
            if priority is not None:
                # the router orders the engines' queues (cost's deadline_k): its deadline on
                # this replica replaces any priority the client sent, and an engine that
                # refuses priorities gets none
                if prioritised:
                    body["priority"] = priority
                else:
                    body.pop("priority", None)
                payload = orjson.dumps(body)
            elif not payload:
                payload = orjson.dumps(body)
            try:
                status = await self._attempt(
                    send, replica, path, payload, _Routed(self.router, route, decision), stream,
                    exchange, prioritised, dialect, stage,
                )  # fmt: skip
                if stage is None:
                    self.metrics.duration.observe(self.now_s() - arrival_s)
                return status
            except _PriorityRefused:
                # routed again (the same replica may win), without a priority for this one
                exchange.failures.append("priority_refused")
                replica.priority_refused_s = self.now_s()
                log.warning(
                    "%s refuses request priorities (start it with --scheduling-policy "
                    "priority): none sent there for %.0f s",
                    replica.replica_id,
                    PRIORITY_RETRY_S,
                )
            except _Failed as failed:
                last = failed
                tried = replica.replica_id
                self._failed_attempt(replica, failed, exchange, attempt)
                attempt += 1
        _give_up(last, model)

    async def _disaggregated(
        self,
        send: Send,
        path: str,
        body: dict[str, Any],
        route: RouteRequest,
        model: str,
        stream: bool,
        exchange: Exchange,
        dialect: Dialect,
    ) -> int:
        """Prefill on one engine, decode on another, as vLLM's P/D proxies drive engines run
        with its ``NixlConnector``: the prefill leg (one token, whole, asked to keep its KV
        for a remote decode) goes where the router says, by prefix, among the replicas that
        prefill; its answer's ``kv_transfer_params`` go with the client's request to the
        least loaded replica that decodes, which pulls the KV it lacks and answers the
        client. The access log's ``replica`` is the prefill's, ``decode_replica`` the
        decode's; ``cached_tokens`` what the prefill reused (vLLM's decode reports it too,
        passed on as ``remote_prefill_cached_tokens``)."""
        leg = _Captured()
        status = await self.forward(
            leg,
            path,
            dialect.prefill_leg(body),
            dataclasses.replace(route, output_tokens=1),
            model,
            False,
            exchange,
            dialect,
            stage="prefill",
        )
        if status != 200:  # the client's error (a 4xx), as the engine words it
            await respond(send, status, leg.body, leg.headers)
            self.metrics.duration.observe(self.now_s() - exchange.arrival_s)
            return status
        params = dialect.kv_transfer_params(leg.body)
        if params is None:
            # an engine without a KV connector: the decode prefills again
            log.warning(
                "request %s: engine %s returned no kv_transfer_params (run it with vLLM's "
                "--kv-transfer-config): its decode prefills the prompt again",
                exchange.request_id,
                exchange.replica,
            )
        else:
            body = {**body, "kv_transfer_params": params}
        exchange.prefilled()
        payload = orjson.dumps(body)
        status = await self._decode(send, path, payload, model, stream, exchange, dialect)
        self.metrics.duration.observe(self.now_s() - exchange.arrival_s)
        return status

    async def _decode(
        self,
        send: Send,
        path: str,
        payload: bytes,
        model: str,
        stream: bool,
        exchange: Exchange,
        dialect: Dialect,
    ) -> int:
        """A disaggregated request's decode leg, on the least loaded replica that decodes;
        retried once on another before its first byte (the prefill's engine keeps the KV
        until it is pulled)."""

        async def on(replica: Replica) -> int:
            exchange.decode_replica = replica.replica_id
            return await self._attempt(
                send, replica, path, payload, _UNROUTED, stream, exchange, False, dialect, "decode"
            )

        return await self._least_loaded(model, exchange, "decode", on)

    async def _least_loaded(
        self,
        model: str,
        exchange: Exchange,
        stage: Stage,
        attempt_on: Callable[[Replica], Awaitable[int]],
    ) -> int:
        """``attempt_on`` the least loaded replica serving ``model`` (in ``stage``'s role),
        under the cap, retried once on another after a failure before its first byte; the
        HTTP status, or the error of the last failure (or of no replica at all)."""
        tried = None
        last: _Failed | None = None
        for attempt in range(2):
            await self.admission.wait(model, tried, stage)
            replica = self.replicas.least_loaded(model, tried, stage)
            if replica is None:
                break
            exchange.attempts += 1
            try:
                return await attempt_on(replica)
            except _Failed as failed:
                last = failed
                tried = replica.replica_id
                self._failed_attempt(replica, failed, exchange, attempt)
        _give_up(last, model)

    async def pass_through(
        self, send: Send, path: str, payload: bytes, model: str, exchange: Exchange
    ) -> int:
        """Answers a request that prefix routing has no part in (vLLM's tokenizer and
        pooling endpoints: ``/tokenize``, ``/v1/embeddings``, ``/rerank``...) through ``send``:
        sent to the least loaded replica serving ``model``, under the same cap, timeouts
        and failover as a completion (retried once elsewhere before its first byte), and
        passed back whole (none of them streams); the HTTP status."""

        async def on(replica: Replica) -> int:
            exchange.replica = replica.replica_id
            exchange.route = "least_loaded"
            return await self._pass_once(send, replica, path, payload, exchange)

        status = await self._least_loaded(model, exchange, None, on)
        self.metrics.duration.observe(self.now_s() - exchange.arrival_s)
        return status

    async def stored(
        self, send: Send, replica: Replica, method: str, path: str, exchange: Exchange
    ) -> int:
        """Answers a request about a stored answer from ``replica``, the one holding it: no
        failover (no other engine has it)."""
        exchange.attempts += 1
        exchange.replica = replica.replica_id
        exchange.route = "previous_response"
        try:
            return await self._pass_once(send, replica, path, b"", exchange, method.encode())
        except _Failed as failed:
            self._failed_attempt(replica, failed, exchange, 1)
            _give_up(failed, exchange.model or "")

    async def _pass_once(
        self,
        send: Send,
        replica: Replica,
        path: str,
        payload: bytes,
        exchange: Exchange,
        method: bytes = b"POST",
    ) -> int:
        replica.in_flight += 1
        gauge = self.metrics.child(self.metrics.in_flight, replica.replica_id)
        gauge.inc()
        resp: Response | None = None
        try:
            resp = await self._send(replica, path, payload, exchange, method)
            try:
                body = await resp.read()
            except (TimeoutError, OSError) as exc:
                raise _Failed("read", exc) from exc
            replica.succeeded()
            if resp.status == 200:
                OPENAI.usage(exchange, body)  # a pooling answer's prompt tokens, for the tenant
            self.metrics.first_byte.observe(self.now_s() - exchange.arrival_s)
            await respond(send, resp.status, body, _answer_headers(resp, exchange))
            return resp.status
        finally:
            replica.in_flight -= 1
            gauge.dec()
            self.admission.release()
            if resp is not None:
                resp.close()

    async def _send(
        self,
        replica: Replica,
        path: str,
        payload: bytes,
        exchange: Exchange,
        method: bytes = b"POST",
    ) -> Response:
        """The engine's response head, or ``_Failed`` for a failure before it that another
        replica may not have: no answer in time, no connection, a 5xx or a 401."""
        try:
            resp = await self.pool.request(
                method, replica.url, path, payload, headers=exchange.upstream_headers
            )
        except TimeoutError as exc:
            raise _Failed("timeout", exc) from exc
        except (OSError, ValueError) as exc:
            raise _Failed("connect", exc) from exc
        if resp.status >= 500 or resp.status == 401:
            # a 401 is the engine refusing the gateway's key (``engine_key``), which the
            # gateway has already checked the client's against: an engine failure, not
            # the client's
            try:
                text = await _read_error(resp)
            finally:
                resp.close()
            raise _Failed(f"http_{resp.status}", RuntimeError(f"HTTP {resp.status}: {text}"))
        return resp

    def _failed_attempt(
        self, replica: Replica, failed: _Failed, exchange: Exchange, attempt: int
    ) -> None:
        """Books an attempt that failed before its first byte (the next goes elsewhere)."""
        exchange.failures.append(failed.kind)
        self.metrics.upstream_errors.labels(replica.replica_id, failed.kind).inc()
        log.warning(
            "request %s: engine %s failed (%s): %s",
            exchange.request_id,
            replica.replica_id,
            failed.kind,
            failed.error,
        )
        self._book_failure(replica)
        if attempt == 0:
            self.metrics.retries.inc()

    async def _attempt(
        self,
        send: Send,
        replica: Replica,
        path: str,
        payload: bytes,
        routed: _Routed,
        stream: bool,
        exchange: Exchange,
        prioritised: bool,
        dialect: Dialect,
        stage: Stage = None,
    ) -> int:
        """One try of a request on ``replica``; ``_Failed`` where it failed before its first
        byte. ``stage``: the part of a disaggregated request it is (a prefill leg's answer
        is for the gateway, not the client: no client metrics, no stored answer's home)."""
        replica.in_flight += 1
        gauge = self.metrics.child(self.metrics.in_flight, replica.replica_id)
        gauge.inc()
        booking = _Booking(exchange.count_output)
        resp: Response | None = None
        if exchange.attempts == 1:
            self.metrics.overhead.observe(self.now_s() - exchange.arrival_s)
        try:
            resp = await self._send(replica, path, payload, exchange)
            headers = _answer_headers(resp, exchange)
            if not stream or resp.status != 200:
                try:
                    body = await resp.read()
                except (TimeoutError, OSError) as exc:
                    raise _Failed("read", exc) from exc
                if prioritised and resp.status == 400 and _PRIORITY_OFF.search(body):
                    raise _PriorityRefused
                # the whole answer: its first token came earlier, when is not known (but
                # for a prefill leg, whose one token is its answer)
                cached = dialect.cached(body)
                if stage != "decode":
                    exchange.cached_tokens = cached
                dialect.usage(exchange, body)
                if resp.status == 200 and stage is None:
                    self._note_home(dialect, body, replica, exchange)
                routed.prefill_done(cached, on_time=stage == "prefill")
                booking.prefilled = True
                replica.succeeded()
                if stage != "prefill":
                    self.metrics.first_byte.observe(self.now_s() - exchange.arrival_s)
                await respond(send, resp.status, body, headers)
                return resp.status
            return await self._stream(
                send, replica, resp, headers, routed, booking, exchange, dialect
            )
        finally:
            replica.in_flight -= 1
            gauge.dec()
            self.admission.release()
            if resp is not None:
                resp.close()  # mid-stream (cancelled, failed): the engine sees it go away
            if booking.prefilled:
                routed.complete()
                streamed = stream and resp is not None and resp.status == 200
                output = booking.sent.output
                if streamed and exchange.completion_tokens is None and output is not None:
                    # no usage event came (the client hung up, the engine failed): what
                    # the tenant is charged is the tokens it was sent
                    exchange.completion_tokens = output.tokens
            else:
                routed.cancel()

    async def _stream(
        self,
        send: Send,
        replica: Replica,
        resp: Response,
        headers: list[tuple[bytes, bytes]],
        routed: _Routed,
        booking: _Booking,
        exchange: Exchange,
        dialect: Dialect,
    ) -> int:
        first = True
        hider = UsageHider() if exchange.hide_usage else None
        # the start of an event not ended yet: the client gets whole events, so that an
        # error event after a failure never lands inside one (which the client could parse
        # only as one broken event)
        held = b""
        sent = booking.sent
        try:
            while chunk := await resp.read_chunk():
                chunk, held = whole_events(held + chunk)
                if not chunk:  # the start of an event: wait for the rest of it
                    continue
                if first:
                    await start_stream(send, 200, headers)
                    first = False
                    self.metrics.first_byte.observe(self.now_s() - exchange.arrival_s)
                    self._note_home(dialect, chunk, replica, exchange)
                if not booking.prefilled and not dialect.no_output(chunk):
                    routed.prefill_done()
                    booking.prefilled = True
                    exchange.first_token_s = self.now_s()
                if dialect.usage_mark in chunk:  # usage: the last chunk, or every chunk
                    dialect.usage(exchange, chunk)
                    if exchange.cached_tokens is None:  # the same in each: reported once
                        cached = dialect.cached(chunk)
                        if cached is not None:
                            exchange.cached_tokens = cached
                            routed.report(cached)
                    if hider is not None:
                        chunk = hider.hide(chunk)
                if dialect.done(chunk):  # the client has it all: end its stream now
                    exchange.answered_s = self.now_s()
                    await end_stream(send, sent.take(chunk))
                    break
                if chunk:
                    await send_chunk(send, sent.take(chunk))
            if exchange.answered:
                # The engine's end of body follows its [DONE]: read it, so that the
                # connection goes back to the pool. A client that closes meanwhile (the
                # openai client does at [DONE]) cancels nothing (gateway.server).
                while await resp.read_chunk(_AFTER_DONE_S):
                    pass
            elif held:
                if first:  # the engine ended inside an event: pass on what it sent
                    await start_stream(send, 200, headers)
                    first = False
                await send_chunk(send, sent.take(held))
        except (TimeoutError, OSError) as exc:
            if first:
                raise _Failed("read", exc) from exc
            if exchange.answered:  # the answer was whole: only its connection is lost
                replica.succeeded()
                return 200
            await self._failed_mid_stream(send, replica, exchange, sent, exc, dialect)
            return 200
        except asyncio.CancelledError as exc:
            # after the answer, or at the drain's deadline: not the client going away
            if not exchange.answered and exc.args != (DRAIN_CUT,):
                self.metrics.client_disconnects.inc()
            raise
        replica.succeeded()
        if exchange.answered:
            return 200
        if first:  # an empty 200 stream: pass it on as such
            await start_stream(send, 200, headers)
        elif not booking.prefilled:  # no output chunk at all, yet the engine finished
            routed.prefill_done(on_time=False)
            booking.prefilled = True
        await end_stream(send)
        return 200

    async def _failed_mid_stream(
        self,
        send: Send,
        replica: Replica,
        exchange: Exchange,
        sent: _Sent,
        exc: Exception,
        dialect: Dialect,
    ) -> None:
        """Ends a stream its engine broke off with one SSE error event. The client learns
        that the engine failed, not which one or how: that goes to the log."""
        self._book_failure(replica)
        exchange.failures.append("mid_stream")
        self.metrics.upstream_errors.labels(replica.replica_id, "mid_stream").inc()
        log.warning(
            "request %s: engine %s failed mid-stream: %r",
            exchange.request_id,
            replica.replica_id,
            exc,
        )
        err = ApiError(BAD_GATEWAY, "the engine failed mid-stream")
        # an event the engine broke off (one over MAX_HELD_BYTES, passed on unended) is
        # ended first, so that the error is an event of its own
        gap = b"" if ends_event(sent.tail) else b"\n\n"
        await end_stream(send, gap + dialect.error_event(err))

    def _note_home(
        self, dialect: Dialect, data: bytes, replica: Replica, exchange: Exchange
    ) -> None:
        """Where the answer opening with ``data`` is kept, for its tenant's requests naming
        it later."""
        if not exchange.stored:
            return  # an agent sending its whole history each turn asks for no store
        response_id = dialect.response_id(data)
        if response_id is not None:
            self.homes.record(response_id, replica.replica_id, exchange.tenant or "")

    def _book_failure(self, replica: Replica) -> None:
        """A failed attempt on ``replica``; its health gauge drops when that ejects it."""
        if replica.failed(self.now_s()):
            self.metrics.healthy.labels(replica.replica_id).set(0)


def _give_up(last: _Failed | None, model: str) -> NoReturn:
    """The error a request gets when no attempt went through: no replica at all, or the
    last attempt's failure (the client's message names no engine and quotes none of its
    words: the log does)."""
    if last is None:
        raise NoHealthyReplica(f"no healthy replica serves model {model!r}")
    if last.kind == "timeout":
        raise UpstreamTimeout("the engine timed out") from last.error
    raise UpstreamUnavailable("the engine failed") from last.error


def _answer_headers(resp: Response, exchange: Exchange) -> list[tuple[bytes, bytes]]:
    """The engine's headers the client gets, and the request's id."""
    got = resp.headers
    headers = [(h, got[h]) for h in _PASSED_HEADERS if h in got]
    headers.append((b"x-request-id", exchange.request_id_bytes))
    return headers


async def _read_error(resp: Response) -> str:
    try:
        return (await resp.read(2048)).decode(errors="replace")
    except (TimeoutError, OSError):
        return ""
