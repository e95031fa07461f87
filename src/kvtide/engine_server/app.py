"""The engine's HTTP API as a raw ASGI app: vLLM's OpenAI-compatible routes over one backend.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE streaming, one chunk per
token as the backend produces it, less the text a stop string may still claim), Anthropic's
``POST /v1/messages`` (converted as vLLM converts it, answered in its shapes: ``messages``),
``GET /v1/models``, ``GET /health``, ``GET /metrics``, ``POST /tokenize``,
``POST /detokenize``. The backend's task lives in a TaskGroup owned by the
ASGI lifespan. Every refusal is an OpenAI-style error body (``api_errors``; Anthropic's on
``/v1/messages``); an unexpected
exception is logged and answered 500 without a traceback, and the server keeps serving.
A client that disconnects has its request aborted in the backend at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from kvtide.asgi import ApiError, Disconnected, Receive, Scope, Send, read_body, respond
from kvtide.asgi.api_errors import error_for
from kvtide.asgi.messages import (
    BadContentLength,
    BodyTimeout,
    BodyTooLarge,
    header,
    send_chunk,
)
from kvtide.clock import epoch_s
from kvtide.engine_server.api_errors import (
    INTERNAL,
    METHOD_NOT_ALLOWED,
    NOT_FOUND,
    REQUEST_TIMEOUT,
    TOO_LARGE,
    UNAVAILABLE,
    bad_request,
)
from kvtide.engine_server.kv_transfer import NixlConnector, reported_cached_tokens
from kvtide.engine_server.messages import MessageFrames, anthropic_usage, message_body
from kvtide.engine_server.metrics import CONTENT_TYPE, EngineMetrics
from kvtide.engine_server.protocol import (
    Generation,
    chat_body,
    completion_body,
    models_body,
    parse_chat,
    parse_completion,
    parse_count_tokens,
    parse_detokenize,
    parse_messages,
    parse_responses,
    parse_tokenize,
    usage,
)
from kvtide.engine_server.responses import (
    ResponseEvents,
    ResponseStore,
    Stored,
    item_status,
    message_item,
    response_body,
    responses_usage,
)
from kvtide.engine_server.side_channel import SideChannel
from kvtide.engine_server.stream import RequestStream
from kvtide.errors import CapacityError, ConfigError
from kvtide.text import Tokenizer, anthropic_request
from kvtide.text.chat_request import ChatRequest
from kvtide.text.responses_request import stored_history

log = logging.getLogger("kvtide.engine_server")

JSON = [(b"content-type", b"application/json")]
GUARDED = ("/v1", "/v2", "/inference", "/cohere")  # vLLM's paths behind --api-key
SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
DONE = b"data: [DONE]\n\n"
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""vLLM's (and OpenAI's) default ``max_tokens`` for /v1/completions; chat defaults to the rest
of the context."""


class Backend(Protocol):
    """What serves the tokens: the emulated engine or the real model."""

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_in_flight(self) -> int: ...

    def submit(
        self,
        request_id: str,
        token_ids: list[int],
        max_tokens: int,
        cache_salt: str | None,
        priority: int = 0,
        remote_tokens: int = 0,
        hold_kv: bool = False,
    ) -> RequestStream: ...

    def abort(self, request_id: str) -> None: ...

    async def run(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ApiLimits:
    served_model_name: str
    max_model_len: int
    max_body_bytes: int = 4 << 20
    body_s: float = 30.0
    """Longest a client may take to send a request body (then a 408): a stalled one held its
    handler, and the drain, for as long as it stayed connected."""
    max_waiting: int = 1024
    """Requests allowed to wait for admission; more get 503 with Retry-After."""
    retry_after_s: int = 1
    priority_scheduling: bool = False
    """``--scheduling-policy priority``: a request's ``priority`` orders the waiting queue
    (otherwise a nonzero one is refused, as vLLM refuses it)."""
    api_keys: tuple[str, ...] = ()
    """vLLM's ``--api-key``: a request under ``/v1`` without one of them as its bearer token
    gets vLLM's 401 (``/health``, ``/metrics`` and ``/tokenize`` stay open, as vLLM's)."""
    responses_store: bool = False
    """Keep ``/v1/responses`` answers for ``previous_response_id`` and ``GET
    /v1/responses/{id}`` (vLLM's ``VLLM_ENABLE_RESPONSES_API_STORE``)."""


class EngineApp:
    """The ASGI callable. ``draining`` (set on SIGTERM) refuses new generations with 503 while
    the ones in flight finish."""

    def __init__(
        self,
        backend: Backend,
        tokenizer: Tokenizer,
        metrics: EngineMetrics,
        limits: ApiLimits,
        connector: NixlConnector | None = None,
        side_channel: SideChannel | None = None,
    ) -> None:
        """``connector``: vLLM's NixlConnector (``--kv-transfer-config``), which takes a
        request's ``kv_transfer_params``; without it they are read and ignored, as vLLM
        ignores them without a connector. ``side_channel``: its messages to and from the
        other engines (a prefill's blocks held until its decode engine has read them)."""
        self.backend = backend
        self.connector = connector
        self.side_channel = side_channel
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.limits = limits
        self.draining = False
        self.started = asyncio.Event()
        self._ids = itertools.count()
        self._id_prefix = os.urandom(4).hex()
        self._created = epoch_s()
        self._model_json = orjson.dumps(limits.served_model_name)
        self._key_digests = [hashlib.sha256(k.encode()).digest() for k in limits.api_keys]
        self._routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/messages"): self._messages,
            ("POST", "/v1/messages/count_tokens"): self._count_tokens,
            ("POST", RESPONSES): self._responses,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/metrics"): self._metrics,
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/detokenize"): self._detokenize,
        }
        self._paths = {path for _, path in self._routes}
        template = tokenizer.chat_template
        # vLLM's choice for its /v1/messages: inline system messages merged into the first
        # where the template refuses them (the gateway decides the same for its prompts)
        self._merge_inline_system = anthropic_request.template_merges_inline_system(
            None if template is None else template.source
        )
        self._store = ResponseStore() if limits.responses_store else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        if kind != "http":
            return
        if self._key_digests and scope["path"].startswith(GUARDED) and not self._authorized(scope):
            # vLLM's AuthenticationMiddleware: this body, not an OpenAI error object
            await respond(send, 401, b'{"error":"Unauthorized"}', JSON)
            return
        handler = self._routes.get((scope["method"], scope["path"]))
        if handler is None and scope["path"].startswith(RESPONSES + "/"):
            handler = self._stored
        try:
            if handler is None:
                if scope["path"] in self._paths:
                    raise ApiError(METHOD_NOT_ALLOWED, f"method {scope['method']} not allowed")
                raise ApiError(NOT_FOUND, f"no route {scope['path']}")
            await handler(scope, receive, send)
        except ApiError as exc:
            # a Messages client gets Anthropic's error object, as vLLM answers it
            await respond(send, exc.status.http, error_for(scope["path"], exc), exc.headers())
        except Disconnected:
            return
        except Exception:  # a bug: log it, answer 500 without a traceback, keep serving
            log.exception("unexpected error on %s %s", scope["method"], scope["path"])
            with contextlib.suppress(Exception):  # the response had started, or no client
                err = ApiError(INTERNAL, "internal server error")
                await respond(send, 500, error_for(scope["path"], err), JSON)

    def _authorized(self, scope: Scope) -> bool:
        """A bearer token among ``api_keys``, compared by digest in constant time (every key
        compared, as vLLM does)."""
        scheme, _, token = (header(scope, b"authorization") or b"").partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        digest = hashlib.sha256(token).digest()
        found = False
        for key in self._key_digests:
            found |= hmac.compare_digest(digest, key)
        return found

    # --- lifespan -------------------------------------------------------------------------

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        msg = await receive()
        if msg["type"] != "lifespan.startup":
            return
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self.backend.run(), name="kvtide-engine")
                channel = None
                if self.side_channel is not None:
                    channel = tasks.create_task(self.side_channel.run(), name="kvtide-side-channel")
                await send({"type": "lifespan.startup.complete"})
                self.started.set()
                while (await receive())["type"] != "lifespan.shutdown":
                    pass
                await self.drain()
                self.backend.close()
                if channel is not None:
                    channel.cancel()
        except Exception as exc:
            log.exception("engine task failed")
            if not self.started.is_set():
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
        await send({"type": "lifespan.shutdown.complete"})

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Refuses new work and waits (up to ``timeout_s``) for the requests in flight."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.backend.num_in_flight and loop.time() < deadline:
            await asyncio.sleep(0.01)

    # --- plain routes ---------------------------------------------------------------------

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, b"", [])

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        lim = self.limits
        body = models_body(lim.served_model_name, self._created, lim.max_model_len)
        await respond(send, 200, orjson.dumps(body), JSON)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, self.metrics.render(), [(b"content-type", CONTENT_TYPE.encode())])

    async def _tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        req = parse_tokenize(await self._json(scope, receive))
        self._check_model(req.model)
        if req.prompt is not None:
            ids = self.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        else:
            assert req.chat is not None
            ids = self._render_chat(req.chat)
        body = {
            "count": len(ids),
            "max_model_len": self.limits.max_model_len,
            "tokens": ids,
            # vLLM's convert_ids_to_tokens: the vocabulary's strings, not decoded text
            "token_strs": [self.tokenizer.id_to_token(i) for i in ids]
            if req.return_token_strs
            else None,
        }
        await respond(send, 200, orjson.dumps(body), JSON)

    async def _detokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        model, ids = parse_detokenize(await self._json(scope, receive))
        self._check_model(model)
        self._check_ids(ids, "tokens")
        body = {"prompt": self.tokenizer.decode(ids)}
        await respond(send, 200, orjson.dumps(body), JSON)

    # --- generation -----------------------------------------------------------------------

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate(parse_completion(await self._json(scope, receive)), receive, send)

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate(parse_chat(await self._json(scope, receive)), receive, send)

    async def _messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await self._json(scope, receive)
        await self._generate(parse_messages(body, self._merge_inline_system), receive, send)

    async def _count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A Messages request's input tokens, as vLLM counts them: rendered as it would be
        served (``{"input_tokens", "context_management": {"original_input_tokens"}}``)."""
        body = await self._json(scope, receive)
        model, chat = parse_count_tokens(body, self._merge_inline_system)
        self._check_model(model)
        n = len(self._render_chat(chat))
        answer = {"input_tokens": n, "context_management": {"original_input_tokens": n}}
        await respond(send, 200, orjson.dumps(answer), JSON)

    async def _responses(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await self._json(scope, receive)
        history: list[dict[str, Any]] = []
        previous = body.get("previous_response_id") if isinstance(body, dict) else None
        if previous is not None:
            stored = self._stored_answer(previous)
            history = stored_history(stored.messages, stored.output_text)
        if isinstance(body, dict) and body.get("background"):
            raise bad_request(
                "This engine does not support the background mode (kvtide engine answers "
                "/v1/responses in the request)",
                "background",
            )
        await self._generate(parse_responses(body, history), receive, send, body)

    def _stored_answer(self, response_id: object) -> Stored:
        """The answer kept under ``response_id``: vLLM's 404 where there is none (the store
        off, as vLLM's is by default, or the id unknown)."""
        stored = None
        if self._store is not None and isinstance(response_id, str):
            stored = self._store.get(response_id)
        if stored is None:
            raise ApiError(
                NOT_FOUND, f"Response with id '{response_id}' not found.", param="response_id"
            )
        return stored

    async def _stored(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET /v1/responses/{id}`` (the answer as it was given) and ``POST
        /v1/responses/{id}/cancel`` (vLLM's refusal: only background answers cancel, and
        this engine answers none in the background)."""
        rest = scope["path"][len(RESPONSES) + 1 :]
        cancel = rest.endswith("/cancel")
        response_id = rest.removesuffix("/cancel")
        if not response_id or "/" in response_id:
            raise ApiError(NOT_FOUND, f"no route {scope['path']}")
        if scope["method"] != ("POST" if cancel else "GET"):
            raise ApiError(METHOD_NOT_ALLOWED, f"method {scope['method']} not allowed")
        stored = self._stored_answer(response_id)
        if cancel:
            raise bad_request("Cannot cancel a synchronous response.", "response_id")
        await respond(send, 200, stored.body, JSON)

    async def _generate(
        self,
        gen: Generation,
        receive: Receive,
        send: Send,
        request: dict[str, Any] | None = None,
    ) -> None:
        lim = self.limits
        self._check_model(gen.model)
        if self.draining:
            raise ApiError(
                UNAVAILABLE, "the server is shutting down", retry_after_s=lim.retry_after_s
            )
        max_len = lim.max_model_len
        if gen.max_tokens is not None and gen.max_tokens > max_len:
            raise bad_request(
                f"{gen.max_tokens_param}={gen.max_tokens} cannot be greater than "
                f"max_model_len={max_len}. Please request fewer output tokens.",
                gen.max_tokens_param,
            )
        ids = self._prompt_ids(gen)
        if len(ids) > max_len:
            raise bad_request(
                f"This model's maximum context length is {max_len} tokens. However, your "
                f"prompt contains {len(ids)} input tokens, which exceeds this limit even "
                "without any output tokens. Please reduce the length of the input prompt.",
                "input_tokens",
            )
        if len(ids) == max_len:
            raise bad_request(
                f"The decoder prompt (length {len(ids)}) plus the number of requested output "
                f"tokens (at least 1) is longer than the maximum model length of {max_len}. "
                "Make sure that `max_model_len` is no smaller than the number of text tokens "
                "(prompt + requested output tokens)."
            )
        # vLLM's get_max_tokens: a request asking for more than the context has left gets
        # what is left, not a refusal
        max_tokens = gen.max_tokens
        if max_tokens is None and gen.kind == "completion":
            max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
        room = max_len - len(ids)
        max_tokens = room if max_tokens is None else min(max_tokens, room)
        if gen.priority and not lim.priority_scheduling:
            raise bad_request(
                f"Got priority {gen.priority} but priority scheduling is not enabled "
                "(kvtide engine --scheduling-policy priority)",
                "priority",
            )
        backend = self.backend
        if backend.num_waiting >= lim.max_waiting:
            raise ApiError(
                UNAVAILABLE,
                f"the engine's queue is full ({backend.num_waiting} requests waiting)",
                retry_after_s=lim.retry_after_s,
            )
        prefix = _ID_PREFIXES[gen.kind]
        rid = f"{prefix}{self._id_prefix}{next(self._ids)}"
        connector, params = self.connector, gen.kv_transfer
        remote = 0 if connector is None else connector.remote_tokens(params, len(ids))
        # a prefill for a remote decode keeps its blocks for the decode engine to read
        hold = connector is not None and params is not None and params.do_remote_decode
        try:
            stream = backend.submit(rid, ids, max_tokens, gen.cache_salt, gen.priority,
                                    remote_tokens=remote, hold_kv=hold)  # fmt: skip
        except CapacityError as exc:
            raise bad_request(str(exc), "prompt") from exc
        # before the first await: no token can have been pushed yet
        stream.stop_at(gen.stop, gen.include_stop_str)
        read = None
        if remote and self.side_channel is not None and params is not None and params.remote:
            # the prefill engine holds this KV until told it is read (or the request ends)
            read = stream.on_first_token = self.side_channel.reading(params.remote)
        echo = self._echo(gen, ids)
        watcher = asyncio.ensure_future(_watch_disconnect(receive, backend, rid))
        try:
            if gen.kind == "messages":
                await self._message(gen, rid, stream, send)
            elif gen.kind == "responses":
                assert request is not None
                await self._response(gen, rid, stream, send, request)
            elif gen.stream:
                await self._stream(gen, rid, stream, send, echo)
            else:
                await self._unary(gen, rid, stream, send, echo)
        finally:
            watcher.cancel()
            if not stream.is_finished or stream.stop_reason is not None:
                # a stop string finished the stream, not the backend (the emulated engine
                # has let it go already; the real model is still generating)
                backend.abort(rid)
            if read is not None:
                read()  # ended before its KV arrived: the prefill engine may free it all the same

    async def _unary(
        self, gen: Generation, rid: str, stream: RequestStream, send: Send, echo: str
    ) -> None:
        text = await _whole_text(stream)
        if text is None:
            return  # the client went away
        build = completion_body if gen.kind == "completion" else chat_body
        use = _usage(gen, stream)
        model = self.limits.served_model_name
        body = build(rid, epoch_s(), model, echo + text, _finish(stream), stream.stop_reason, use)
        body["kv_transfer_params"] = self._kv_answer(gen, rid, stream)
        await respond(send, 200, orjson.dumps(body), JSON)

    async def _stream(
        self, gen: Generation, rid: str, stream: RequestStream, send: Send, echo: str
    ) -> None:
        frame = _Frames(gen.kind, rid, epoch_s(), self._model_json)
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        # vLLM sends a chat stream's role chunk with the first output, once the prefill is
        # done, not with the headers: a gateway that reads the first chunk as the end of the
        # prefill (kvtide's, for its queue estimate) must see it then
        role = frame.role() if gen.kind == "chat" else None
        while True:
            # the stream holds back the text a stop string may still claim, so what it hands
            # over is final: a streamed text equals the unary one
            texts = await stream.take()
            finish: str | None = None
            if stream.is_finished:
                if stream.finish_reason == "abort":
                    return  # the client went away; nothing more to say
                finish = _finish(stream)
            if echo and (texts or finish is not None):  # with the first output, as vLLM
                texts = [echo + (texts[0] if texts else ""), *texts[1:]]
                echo = ""
            stop = stream.stop_reason
            # vLLM's final chunk carries the prefill's kv_transfer_params
            kv = None if finish is None else self._kv_answer(gen, rid, stream)
            out = [frame.token(t) for t in texts[:-1]] if texts else []
            if texts:
                out.append(frame.token(texts[-1], finish, stop, kv))
            elif finish is not None:
                out.append(frame.token("", finish, stop, kv))
            if out and role is not None:
                out.insert(0, role)
                role = None
            if finish is not None:
                if gen.include_usage:
                    use = _usage(gen, stream)
                    out.append(frame.usage(use))
                out.append(DONE)
                await send({"type": "http.response.body", "body": b"".join(out)})
                return
            if out:
                await send_chunk(send, b"".join(out))

    async def _message(self, gen: Generation, rid: str, stream: RequestStream, send: Send) -> None:
        """A Messages request's answer: whole, or streamed as Anthropic's events."""
        model = self.limits.served_model_name
        if not gen.stream:
            text = await _whole_text(stream)
            if text is None:
                return  # the client went away
            use = _anthropic_usage(gen, stream, stream.num_generated)
            body = message_body(rid, model, text, _finish(stream), stream.stop_reason, use)
            kv = self._kv_answer(gen, rid, stream)
            if kv is not None:  # vLLM leaves out a message's null fields
                body["kv_transfer_params"] = kv
            await respond(send, 200, orjson.dumps(body), JSON)
            return
        frames = MessageFrames(rid, model)
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        while True:
            taken = await stream.take()
            # read once: the stream may finish while a chunk below is being sent
            finished = stream.is_finished
            if stream.finish_reason == "abort":
                return  # the client went away
            out = [frames.text(t) for t in taken if t]
            if (out or finished) and not frames.started:  # with the first output, as vLLM
                use = _anthropic_usage(gen, stream, 0)
                out.insert(0, frames.start(use))
            if finished:
                use = _anthropic_usage(gen, stream, stream.num_generated)
                out.append(frames.end(_finish(stream), stream.stop_reason, use))
                await send({"type": "http.response.body", "body": b"".join(out)})
                return
            if out:
                await send_chunk(send, b"".join(out))

    async def _response(
        self,
        gen: Generation,
        rid: str,
        stream: RequestStream,
        send: Send,
        request: dict[str, Any],
    ) -> None:
        """A Responses request's answer: whole, or streamed as the Responses events; kept
        in the store where it is on and the request does not opt out."""
        model, created = self.limits.served_model_name, int(epoch_s())
        item_id = f"msg_{rid}"
        events: ResponseEvents | None = None
        if gen.stream:
            events = ResponseEvents(item_id)
            opening = response_body(
                rid, created, model, request, [], "in_progress", None, stream.max_tokens
            )
            await send({"type": "http.response.start", "status": 200, "headers": SSE})
            await send_chunk(send, events.start(opening))  # at once, as vLLM: before any work
            while True:
                taken = await stream.take()
                finished = stream.is_finished  # read once, as in _message
                if stream.finish_reason == "abort":
                    return  # the client went away
                out = b"".join(events.text(t) for t in taken if t)
                if finished:
                    break
                if out:
                    await send_chunk(send, out)
            text = events.text_sent
        else:
            out = b""
            whole = await _whole_text(stream)
            if whole is None:
                return  # the client went away
            text = whole
        status = item_status(_finish(stream))
        output = [message_item(item_id, text, status)] if text else []
        use = responses_usage(
            stream.prompt_tokens, stream.num_generated, _cached(gen, stream), stream.written_tokens
        )
        final = response_body(rid, created, model, request, output, status, use, stream.max_tokens)
        final["kv_transfer_params"] = self._kv_answer(gen, rid, stream)
        dumped = orjson.dumps(final)
        if self._store is not None and request.get("store", True) is not False:
            assert gen.chat is not None
            self._store.put(rid, Stored(gen.chat.messages, text, dumped))
        if events is None:
            await respond(send, 200, dumped, JSON)
        else:
            body = out + events.end(final)
            await send({"type": "http.response.body", "body": body})

    def _kv_answer(self, gen: Generation, rid: str, stream: RequestStream) -> dict[str, Any] | None:
        """The ``kv_transfer_params`` a finished request answers with: a prefill's for the
        decode engine (vLLM's ``request_finished``) when it asked for a remote decode and the
        engine finished it, not a stop string or the client; else None, as vLLM."""
        connector, params = self.connector, gen.kv_transfer
        if connector is None or params is None or not params.do_remote_decode:
            return None
        if not stream.is_length_capped:
            return None
        # its prefill's figures went out with its first token, and vLLM adds them only then
        cached = stream.cached_tokens if stream.num_generated == 1 else None
        # vLLM's num_computed_tokens: the last token sampled has no KV yet
        computed = stream.prompt_tokens + stream.num_generated - 1
        return connector.prefill_answer(rid, computed, cached)

    def _echo(self, gen: Generation, ids: list[int]) -> str:
        """What a completion with ``echo`` puts before its output, as vLLM: the prompt's text
        as sent, or its token ids decoded."""
        if not gen.echo:
            return ""
        if gen.prompt_text is not None:
            return gen.prompt_text
        return self.tokenizer.decode(ids)

    # --- helpers --------------------------------------------------------------------------

    async def _json(self, scope: Scope, receive: Receive) -> Any:
        limit = self.limits.max_body_bytes
        try:
            raw = await read_body(scope, receive, limit, self.limits.body_s)
        except BadContentLength:
            raise bad_request("bad Content-Length header") from None
        except BodyTimeout as exc:
            raise ApiError(
                REQUEST_TIMEOUT, f"the request body did not arrive within {exc.timeout_s:g} s"
            ) from None
        except BodyTooLarge as exc:
            size = f"of {exc.declared} bytes " if exc.declared is not None else ""
            raise ApiError(TOO_LARGE, f"request body {size}exceeds {limit} bytes") from None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"malformed JSON body: {exc}") from None

    def _check_model(self, model: str | None) -> None:
        name = self.limits.served_model_name
        if model is not None and model != name:
            raise ApiError(NOT_FOUND, f"The model `{model}` does not exist.", param="model")

    def _check_ids(self, ids: tuple[int, ...] | list[int], param: str) -> None:
        vocab = self.tokenizer.vocab_size
        if ids and max(ids) >= vocab:
            t = next(t for t in ids if t >= vocab)
            raise bad_request(f"token id {t} is out of vocabulary (size {vocab})", param)

    def _render_chat(self, chat: ChatRequest) -> list[int]:
        try:
            return self.tokenizer.encode(chat.render(self.tokenizer), add_special_tokens=False)
        except ConfigError as exc:
            raise bad_request(f"chat template: {exc}", "messages") from exc

    def _prompt_ids(self, gen: Generation) -> list[int]:
        if gen.prompt_ids is not None:
            self._check_ids(gen.prompt_ids, "prompt")
            return list(gen.prompt_ids)
        reused = gen.kv_transfer.prompt_token_ids if gen.kv_transfer is not None else None
        if reused is not None:  # a decode leg takes its prefill's rendering, as vLLM
            self._check_ids(reused, "kv_transfer_params.prompt_token_ids")
            return list(reused)
        if gen.prompt_text is not None:
            ids = self.tokenizer.encode(gen.prompt_text, gen.add_special_tokens)
        else:
            assert gen.chat is not None
            ids = self._render_chat(gen.chat)
        if not ids:
            raise bad_request("the prompt is empty after tokenization", "prompt")
        return ids


_ID_PREFIXES = {
    "completion": "cmpl-",
    "chat": "chatcmpl-",
    "responses": "resp_",
    "messages": "msg_",
}
RESPONSES = "/v1/responses"


async def _whole_text(stream: RequestStream) -> str | None:
    """The whole output of a request answered at once; None when it was aborted (its
    client went away)."""
    texts: list[str] = []
    while True:
        texts.extend(await stream.take())
        if stream.is_finished:
            break
    return None if stream.finish_reason == "abort" else "".join(texts)


def _cached(gen: Generation, stream: RequestStream) -> int:
    """``usage``'s cached tokens: the engine's, or a remote prefill's own (``kv_transfer``)."""
    return reported_cached_tokens(gen.kv_transfer, stream.cached_tokens)


def _usage(gen: Generation, stream: RequestStream) -> dict[str, Any]:
    """A completion's or chat's ``usage`` (only a chat's counts the cache writes, as vLLM)."""
    written = stream.written_tokens if gen.kind == "chat" else None
    return usage(stream.prompt_tokens, stream.num_generated, _cached(gen, stream), written)


def _anthropic_usage(gen: Generation, stream: RequestStream, output: int) -> dict[str, Any]:
    return anthropic_usage(
        stream.prompt_tokens, output, _cached(gen, stream), stream.written_tokens
    )


def _finish(stream: RequestStream) -> str:
    reason = stream.finish_reason
    return "length" if reason is None else reason


class _Frames:
    """SSE frames of one stream in vLLM's chunk shapes, built from byte templates."""

    __slots__ = ("_chat", "_head", "_tail")

    def __init__(self, kind: str, rid: str, created: int, model_json: bytes) -> None:
        self._chat = kind == "chat"
        obj = b"chat.completion.chunk" if self._chat else b"text_completion"
        self._head = (
            b'data: {"id":"' + rid.encode() + b'","object":"' + obj + b'","created":'
            + str(created).encode() + b',"model":' + model_json + b',"choices":['
        )  # fmt: skip
        self._tail = b"]}\n\n"

    def role(self) -> bytes:
        return (
            self._head
            + b'{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
            + b'"finish_reason":null}'
            + self._tail
        )

    def token(
        self,
        text: str,
        finish: str | None = None,
        stop: str | None = None,
        kv: dict[str, Any] | None = None,
    ) -> bytes:
        t = orjson.dumps(text)
        f = b"null" if finish is None else b'"' + finish.encode() + b'"'
        tail = (
            self._tail if kv is None else b'],"kv_transfer_params":' + orjson.dumps(kv) + b"}\n\n"
        )
        if self._chat:
            choice = b'{"index":0,"delta":{"content":' + t + b'},"logprobs":null,"finish_reason":'
            if finish is None:
                return self._head + choice + f + b"}" + tail
            # vLLM sets a chat chunk's stop_reason on the final one only
            s = orjson.dumps(stop)
            return self._head + choice + f + b',"stop_reason":' + s + b"}" + tail
        s = orjson.dumps(stop)
        choice = b'{"index":0,"text":' + t + b',"logprobs":null,"finish_reason":' + f
        return self._head + choice + b',"stop_reason":' + s + b"}" + tail

    def usage(self, use: dict[str, Any]) -> bytes:
        return self._head + b'],"usage":' + orjson.dumps(use) + b"}\n\n"


async def _watch_disconnect(receive: Receive, backend: Backend, rid: str) -> None:
    """Aborts ``rid`` in the backend when its client disconnects."""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            backend.abort(rid)
            return
