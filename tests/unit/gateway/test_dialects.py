"""What the proxy reads of OpenAI's and Anthropic's answers, and the errors it words in each."""

from __future__ import annotations

import json

from kvtide.gateway.access_log import Exchange
from kvtide.gateway.dialects import ANTHROPIC, OPENAI
from kvtide.gateway.status import (
    BAD_REQUEST,
    GATEWAY_TIMEOUT,
    MODEL_NOT_FOUND,
    UNAVAILABLE,
    ApiError,
)


def _event(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def test_anthropic_usage_adds_the_cached_input_back_to_the_prompt() -> None:
    opening = {"input_tokens": 30, "output_tokens": 0, "cache_read_input_tokens": 96}
    start = _event("message_start", {"type": "message_start", "message": {"usage": opening}})
    delta = {"type": "text_delta", "text": "hi"}
    text = _event("content_block_delta", {"type": "content_block_delta", "delta": delta})
    final = {"input_tokens": 30, "output_tokens": 7, "cache_read_input_tokens": 96,
             "cache_creation_input_tokens": 4}  # fmt: skip
    end = _event("message_delta", {"type": "message_delta", "usage": final})
    stop = _event("message_stop", {"type": "message_stop"})
    exchange = Exchange("messages", 0.0, 0.0)
    assert ANTHROPIC.usage_mark in start and ANTHROPIC.usage_mark not in text
    ANTHROPIC.usage(exchange, start)
    assert (exchange.engine_prompt_tokens, exchange.completion_tokens) == (126, 0)
    assert ANTHROPIC.cached(start) == 96
    ANTHROPIC.usage(exchange, start + text + end)  # one read holding both: the last counts
    assert (exchange.engine_prompt_tokens, exchange.completion_tokens) == (130, 7)
    assert not ANTHROPIC.done(start + text + end) and ANTHROPIC.done(end + stop)
    assert ANTHROPIC.cached(_event("message_start", {"usage": {"input_tokens": 3}})) is None


def test_openai_usage_and_end() -> None:
    chunk = b'data: {"usage": {"prompt_tokens": 10, "completion_tokens": 2, ' \
        b'"prompt_tokens_details": {"cached_tokens": 8}}}\n\n'  # fmt: skip
    exchange = Exchange("chat", 0.0, 0.0)
    OPENAI.usage(exchange, chunk)
    assert (exchange.engine_prompt_tokens, exchange.completion_tokens) == (10, 2)
    assert OPENAI.cached(chunk) == 8
    assert OPENAI.done(chunk + b"data: [DONE]\n\n") and not OPENAI.done(chunk)


def test_anthropic_errors_use_its_types_as_vllm_words_them() -> None:
    cases = [(BAD_REQUEST, "invalid_request_error"), (MODEL_NOT_FOUND, "not_found_error"),
             (UNAVAILABLE, "overloaded_error"), (GATEWAY_TIMEOUT, "api_error")]  # fmt: skip
    for status, kind in cases:
        body = json.loads(ANTHROPIC.error_body(ApiError(status, "why")))
        assert body == {"type": "error", "error": {"type": kind, "message": "why"}}
    event = ANTHROPIC.error_event(ApiError(GATEWAY_TIMEOUT, "late"))
    assert event.startswith(b"event: error\ndata: ") and event.endswith(b"\n\n")
    assert json.loads(OPENAI.error_body(ApiError(BAD_REQUEST, "why", "x")))["error"]["param"] == "x"
