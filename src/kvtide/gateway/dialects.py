"""What the proxy reads of an engine's answers, and how it words its own errors, per API:
OpenAI's chat and completions (``/v1/chat/completions``, ``/v1/completions`` and the
passed-through endpoints), OpenAI's Responses API (``/v1/responses``) and Anthropic's
Messages API (``/v1/messages``); vLLM serves the last two by converting each request to a chat
completion (``kvtide.text.responses_request``, ``kvtide.text.anthropic_request``).

The engine's usage gives the cached tokens (the index's check), the prompt and completion
tokens (the tenant's charge, the access log); a stream's first events that carry no output
are not the end of the prefill; the end of a stream (OpenAI's ``data: [DONE]``, a Responses
stream's ``response.completed``, Anthropic's ``message_stop`` event) is when the client has
its whole answer; an error the gateway writes is the API's error object, so the API's own
client raises the matching exception with the gateway's message.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from kvtide.asgi.api_errors import (
    ANTHROPIC_PATH,
    anthropic_error_body,
    error_body,
    error_event_for,
    responses_error_event,
    sse_error_event,
)
from kvtide.gateway.access_log import Exchange
from kvtide.gateway.status import ApiError
from kvtide.gateway.usage import USAGE_MARK

PREFILL_LEG_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
"""A prefill leg's ``kv_transfer_params``: compute the prompt's KV and keep it for a decode
elsewhere (vLLM's ``NixlConnector`` protocol; the engine fills in the rest in its answer)."""


class Dialect:
    """OpenAI's: usage ``{prompt_tokens, completion_tokens, prompt_tokens_details:
    {cached_tokens}}``, streams ending ``data: [DONE]``, errors ``{"error": {message, type,
    param, code}}``."""

    name = "openai"
    usage_mark = USAGE_MARK
    """Present in every ``usage`` object, absent from a chunk's output framing."""
    takes_priority = True
    """The engine reads vLLM's ``priority`` from the body (the router's deadlines)."""
    limit_keys: tuple[str, ...] = ("max_tokens", "max_completion_tokens")
    """The request's limits on output tokens, the one a prefill leg always sets first."""
    _leg_drop = frozenset(("stream_options", "min_tokens"))
    """What a prefill leg leaves out: a whole answer has no stream options, and vLLM refuses
    a ``min_tokens`` above its one token."""
    _done = b"data: [DONE]\n\n"
    _cached = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
    _prompt = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
    _completion = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')

    def done(self, events: bytes) -> bool:
        """Whether ``events`` (whole SSE events) end the answer."""
        return events.endswith(self._done)

    def cached(self, data: bytes) -> int | None:
        m = self._cached.search(data)
        return int(m.group(1)) if m else None

    def no_output(self, events: bytes) -> bool:
        """Whether ``events`` (a stream's whole events) carry no output yet: SSE comments
        only (a keep-alive), or one event that only opens the assistant's message (a
        ``delta`` with its ``role`` and nothing else but empty fields). vLLM sends the role
        with the first output, after the prefill; an engine that sends it (or a keep-alive)
        before any work must not end the prefill in the router's load view (the queue the
        ``cost`` policy estimates would then read empty). Asked only until a request's
        prefill is done: one or two reads."""
        count = events.count(b"data:")
        if count == 0:
            return True
        if count != 1 or b'"role"' not in events:
            return False
        try:
            event = orjson.loads(events.partition(b"data:")[2])
        except orjson.JSONDecodeError:
            return False
        choices = event.get("choices") if isinstance(event, dict) else None
        if not isinstance(choices, list) or not choices:
            return False
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict) or choice.get("finish_reason"):
                return False
            if any(value for key, value in delta.items() if key != "role"):
                return False
        return True

    def response_id(self, data: bytes) -> str | None:
        """The id an engine keeps the answer under for later requests to name (a Responses
        answer's); None for APIs without one."""
        return None

    def usage(self, exchange: Exchange, data: bytes) -> None:
        """The engine's own counts, where ``data`` has a ``usage`` object, into the access
        log's record: its prompt tokens beside the gateway's tell whether the two tokenize
        alike. The last one in ``data`` counts: with usage in every chunk, one read may hold
        several."""
        prompt = self._prompt.findall(data)
        if prompt:
            exchange.engine_prompt_tokens = int(prompt[-1])
        completion = self._completion.findall(data)
        if completion:
            exchange.completion_tokens = int(completion[-1])

    def error_body(self, err: ApiError) -> bytes:
        return error_body(err)

    def error_event(self, err: ApiError) -> bytes:
        """An error after a stream's first byte: one SSE event, then the stream ends (the
        ``openai`` client raises it as ``APIError``)."""
        return sse_error_event(err)

    def prefill_leg(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` as a disaggregated request's prefill leg, as vLLM's P/D proxies send it:
        whole, one output token, and asking the engine to keep the prompt's KV for a remote
        decode (its answer's ``kv_transfer_params`` say where)."""
        leg = {k: v for k, v in body.items() if k not in self._leg_drop}
        leg["stream"] = False
        first, *others = self.limit_keys
        leg[first] = 1
        for key in others:
            if key in leg:
                leg[key] = 1
        leg["kv_transfer_params"] = dict(PREFILL_LEG_PARAMS)
        return leg

    def kv_transfer_params(self, data: bytes) -> dict[str, Any] | None:
        """What a prefill leg's whole answer tells its decode: its ``kv_transfer_params``
        (the same top-level field in each API's answer); None where it has none (an engine
        without a KV connector)."""
        try:
            answer = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        return params if isinstance(params, dict) and params else None


class AnthropicDialect(Dialect):
    """Anthropic's Messages API as vLLM serves it: usage ``{input_tokens, output_tokens,
    cache_read_input_tokens, cache_creation_input_tokens}`` (input tokens exclude the cached
    ones), in ``message_start`` and again in ``message_delta``; streams ending with a
    ``message_stop`` event; errors ``{"type": "error", "error": {type, message}}``."""

    name = "anthropic"
    usage_mark = b'"output_tokens"'
    takes_priority = False  # vLLM's Messages request has no priority field
    limit_keys = ("max_tokens",)
    _stop = b"event: message_stop\n"
    _cached = re.compile(rb'"cache_read_input_tokens"\s*:\s*(\d+)')
    _input = re.compile(rb'"input_tokens"\s*:\s*(\d+)')
    _created = re.compile(rb'"cache_creation_input_tokens"\s*:\s*(\d+)')
    _completion = re.compile(rb'"output_tokens"\s*:\s*(\d+)')

    def done(self, events: bytes) -> bool:
        return self._stop in events

    def usage(self, exchange: Exchange, data: bytes) -> None:
        """From the last usage object in ``data`` (its counts belong together: one read may
        hold ``message_start``'s and ``message_delta``'s): the prompt is its uncached,
        cached and newly cached input tokens together."""
        last = data[max(data.rfind(b'"usage"'), 0) :]
        prompt = self._input.search(last)
        if prompt:
            parts = (prompt, self._cached.search(last), self._created.search(last))
            exchange.engine_prompt_tokens = sum(int(m.group(1)) for m in parts if m)
        completion = self._completion.search(last)
        if completion:
            exchange.completion_tokens = int(completion.group(1))

    def error_body(self, err: ApiError) -> bytes:
        return anthropic_error_body(err)

    def error_event(self, err: ApiError) -> bytes:
        """One ``error`` event (the ``anthropic`` client raises it as ``APIStatusError``)."""
        return error_event_for(ANTHROPIC_PATH, err)


class ResponsesDialect(Dialect):
    """OpenAI's Responses API as vLLM serves it: usage ``{input_tokens, input_tokens_details:
    {cached_tokens}, output_tokens}`` (input tokens include the cached ones) in the final
    response only; streams of named events (``event: response.output_text.delta``...), the
    first two (``response.created``, ``response.in_progress``) sent before any work, the last
    ``response.completed`` (``response.incomplete`` at the token limit, ``response.failed``)
    with no ``[DONE]`` after it; errors as OpenAI's. The response's ``id`` names it for a
    later request's ``previous_response_id``."""

    name = "responses"
    limit_keys = ("max_output_tokens",)
    usage_mark = b'"input_tokens_details"'  # a final usage; response.created's is null
    _ends = (b"event: response.completed\n", b"event: response.incomplete\n",
             b"event: response.failed\n")  # fmt: skip
    _prompt = re.compile(rb'"input_tokens"\s*:\s*(\d+)')
    _completion = re.compile(rb'"output_tokens"\s*:\s*(\d+)')
    _id = re.compile(rb'"id"\s*:\s*"([^"\\]{1,256})"')
    _silent = frozenset((b"response.created", b"response.in_progress", b"response.queued"))

    def done(self, events: bytes) -> bool:
        return any(end in events for end in self._ends)

    def no_output(self, events: bytes) -> bool:
        """Only the events vLLM sends before any work (or comments)."""
        for event in events.split(b"\n\n"):
            kind = None
            for line in event.split(b"\n"):
                if line.startswith(b"event:"):
                    kind = line[6:].strip()
                elif line.startswith(b"data:") and kind is None:
                    return False  # an unnamed event: the proxy cannot tell, so output
            if kind is not None and kind not in self._silent:
                return False
        return True

    def response_id(self, data: bytes) -> str | None:
        """The response's id: the first ``id`` of a whole answer (its own, first in vLLM's
        dump) or of the ``response.created`` event a stream opens with."""
        m = self._id.search(data)
        return m.group(1).decode() if m else None

    def error_event(self, err: ApiError) -> bytes:
        """The Responses ``error`` event, with OpenAI's error object inside (the ``openai``
        client raises it)."""
        return responses_error_event(err)

    def prefill_leg(self, body: dict[str, Any]) -> dict[str, Any]:
        """As any prefill leg, and not stored: its one-token answer is no one's to continue
        (the decode's is, stored where the decode ran)."""
        leg = super().prefill_leg(body)
        leg["store"] = False
        return leg


OPENAI = Dialect()
RESPONSES = ResponsesDialect()
ANTHROPIC = AnthropicDialect()
