"""What the proxy reads of an engine's answers, and how it words its own errors, per API:
OpenAI's (``/v1/chat/completions``, ``/v1/completions`` and the passed-through endpoints) and
Anthropic's Messages API (``/v1/messages``, which vLLM serves by converting each request to
a chat completion: ``kvtide.text.anthropic_request``).

The engine's usage gives the cached tokens (the index's check), the prompt and completion
tokens (the tenant's charge, the access log); the end of a stream (OpenAI's ``data: [DONE]``,
Anthropic's ``message_stop`` event) is when the client has its whole answer; an error the
gateway writes is the API's error object, so the API's own client raises the matching
exception with the gateway's message.
"""

from __future__ import annotations

import re

from kvtide.asgi.api_errors import (
    ANTHROPIC_PATH,
    anthropic_error_body,
    error_body,
    error_event_for,
    sse_error_event,
)
from kvtide.gateway.access_log import Exchange
from kvtide.gateway.status import ApiError
from kvtide.gateway.usage import USAGE_MARK


class Dialect:
    """OpenAI's: usage ``{prompt_tokens, completion_tokens, prompt_tokens_details:
    {cached_tokens}}``, streams ending ``data: [DONE]``, errors ``{"error": {message, type,
    param, code}}``."""

    name = "openai"
    usage_mark = USAGE_MARK
    """Present in every ``usage`` object, absent from a chunk's output framing."""
    takes_priority = True
    """The engine reads vLLM's ``priority`` from the body (the router's deadlines)."""
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


class AnthropicDialect(Dialect):
    """Anthropic's Messages API as vLLM serves it: usage ``{input_tokens, output_tokens,
    cache_read_input_tokens, cache_creation_input_tokens}`` (input tokens exclude the cached
    ones), in ``message_start`` and again in ``message_delta``; streams ending with a
    ``message_stop`` event; errors ``{"type": "error", "error": {type, message}}``."""

    name = "anthropic"
    usage_mark = b'"output_tokens"'
    takes_priority = False  # vLLM's Messages request has no priority field
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


OPENAI = Dialect()
ANTHROPIC = AnthropicDialect()
