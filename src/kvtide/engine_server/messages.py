"""Anthropic's Messages API answers (``POST /v1/messages``) in the shapes vLLM's converter gives
them (``vllm/entrypoints/anthropic/serving.py``, vLLM 0.33): the whole message, or its stream of
events (``message_start`` with the first output, a text block's start, deltas and stop,
``message_delta`` with the stop reason and the usage, ``message_stop``). The usage counts the
input without its cached part, which is ``cache_read_input_tokens``."""

from __future__ import annotations

from typing import Any

import orjson


def anthropic_usage(
    prompt_tokens: int, output_tokens: int, cached_tokens: int, written_tokens: int
) -> dict[str, Any]:
    """vLLM 0.33's: the input tokens exclude those read from the cache and those written to
    it (``cache_creation_input_tokens``), as Anthropic counts them."""
    return {
        "input_tokens": max(prompt_tokens - cached_tokens - written_tokens, 0),
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cached_tokens,
        "cache_creation_input_tokens": written_tokens,
    }


def stop_reason(finish_reason: str, stop: str | None) -> tuple[str, str | None]:
    """vLLM's finish reason as Anthropic's ``stop_reason`` and ``stop_sequence``."""
    if finish_reason == "length":
        return "max_tokens", None
    if stop is not None:
        return "stop_sequence", stop
    return "end_turn", None


def message_body(
    rid: str, model: str, text: str, finish_reason: str, stop: str | None, use: dict[str, Any]
) -> dict[str, Any]:
    reason, sequence = stop_reason(finish_reason, stop)
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "model": model,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": use,
    }


def _event(kind: bytes, data: dict[str, Any]) -> bytes:
    return b"event: " + kind + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class MessageFrames:
    """The SSE events of one streamed message."""

    __slots__ = ("_model", "_rid", "_started")

    def __init__(self, rid: str, model: str) -> None:
        self._rid = rid
        self._model = model
        self._started = False

    def start(self, use: dict[str, Any]) -> bytes:
        """``message_start`` (its usage: the input, no output yet) and the text block's
        start: sent with the first output, once the prefill is done, as vLLM does."""
        self._started = True
        message: dict[str, Any] = {
            "id": self._rid,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self._model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**use, "output_tokens": 0},
        }
        block = {"type": "content_block_start", "index": 0,
                 "content_block": {"type": "text", "text": ""}}  # fmt: skip
        return _event(b"message_start", {"type": "message_start", "message": message}) + _event(
            b"content_block_start", block
        )

    @property
    def started(self) -> bool:
        return self._started

    def text(self, text: str) -> bytes:
        delta = {"type": "text_delta", "text": text}
        return _event(b"content_block_delta",
                      {"type": "content_block_delta", "index": 0, "delta": delta})  # fmt: skip

    def end(self, finish_reason: str, stop: str | None, use: dict[str, Any]) -> bytes:
        reason, sequence = stop_reason(finish_reason, stop)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        return (
            _event(b"content_block_stop", {"type": "content_block_stop", "index": 0})
            + _event(b"message_delta", {"type": "message_delta", "delta": delta, "usage": use})
            + _event(b"message_stop", {"type": "message_stop"})
        )
