"""OpenAI Responses API answers (``POST /v1/responses``) in the shapes vLLM 0.33 gives them
(``vllm/entrypoints/openai/responses/serving.py``), for text output: the whole response, or
its stream of named events (``response.created`` and ``response.in_progress`` at once, the
message's item and part opened with the first output, text deltas, then the text, part and
item closed and ``response.completed``, or ``response.incomplete`` at the token limit, holding
the usage), and the store behind ``previous_response_id``.

vLLM keeps answers only with ``VLLM_ENABLE_RESPONSES_API_STORE=1`` (``kvtide engine
--responses-store``); without it a request's ``store`` is quietly off and a
``previous_response_id`` is a 404, as there.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

STORE_CAPACITY = 10_000
"""Answers kept (vLLM keeps every one until it restarts: its own FIXME says so)."""


def responses_usage(
    prompt_tokens: int, output_tokens: int, cached_tokens: int, written_tokens: int
) -> dict[str, Any]:
    """vLLM 0.33's ``ResponseUsage``: the input tokens include the cached ones; the per-turn
    lists are empty for a plain (not tool-looping) request, as vLLM's ``SimpleContext``
    leaves them."""
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": cached_tokens,
            "cache_write_tokens": written_tokens,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": output_tokens,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": prompt_tokens + output_tokens,
    }


def _given(request: dict[str, Any], key: str, default: Any) -> Any:
    value = request.get(key)
    return default if value is None else value


def response_body(
    rid: str,
    created: int,
    model: str,
    request: dict[str, Any],
    output: list[dict[str, Any]],
    status: str,
    use: dict[str, Any] | None,
    max_tokens: int,
) -> dict[str, Any]:
    """A response object as vLLM's ``ResponsesResponse.from_request`` fills it: its id first
    (a gateway reads the first ``id`` as the answer's), the request's settings echoed, and
    where vLLM echoes the sampling parameters it ran with, those: the defaults where the
    request left them out, and ``max_output_tokens`` as the limit the request ran under
    (``max_tokens``: what the context left, where that is less than asked)."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": rid,
        "created_at": created,
        "incomplete_details": incomplete,
        "instructions": request.get("instructions"),
        "metadata": request.get("metadata"),
        "model": model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": _given(request, "parallel_tool_calls", True),
        "temperature": _given(request, "temperature", 1.0),
        "tool_choice": _given(request, "tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": _given(request, "top_p", 1.0),
        "background": _given(request, "background", False),
        "max_output_tokens": max_tokens,
        "max_tool_calls": request.get("max_tool_calls"),
        "previous_response_id": request.get("previous_response_id"),
        "prompt": request.get("prompt"),
        "prompt_cache_key": request.get("prompt_cache_key"),
        "prompt_cache_retention": request.get("prompt_cache_retention"),
        "reasoning": request.get("reasoning"),
        "safety_identifier": request.get("safety_identifier"),
        "service_tier": _given(request, "service_tier", "auto"),
        "status": status,
        "text": request.get("text"),
        "top_logprobs": None,  # the engine gives no logprobs
        "truncation": _given(request, "truncation", "disabled"),
        "usage": use,
        "user": request.get("user"),
        "presence_penalty": _given(request, "presence_penalty", 0.0),
        "frequency_penalty": _given(request, "frequency_penalty", 0.0),
    }


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "content": [_text_part(text)],
        "role": "assistant",
        "status": status,
        "type": "message",
    }


def item_status(finish_reason: str) -> str:
    """The status of the response and its item: ``incomplete`` when the token limit cut it."""
    return "incomplete" if finish_reason == "length" else "completed"


def _text_part(text: str) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}


class ResponseEvents:
    """The SSE events of one streamed response, numbered in order."""

    __slots__ = ("_item", "_opened", "_seq", "_text")

    def __init__(self, item_id: str) -> None:
        self._item = item_id
        self._seq = 0
        self._opened = False
        self._text: list[str] = []

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        data = {"type": kind, **data, "sequence_number": self._seq}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def start(self, response: dict[str, Any]) -> bytes:
        """``response.created`` and ``response.in_progress``: sent at once, before any work."""
        return self._event("response.created", {"response": response}) + self._event(
            "response.in_progress", {"response": response}
        )

    @property
    def text_sent(self) -> str:
        """The output text the deltas carried so far."""
        return "".join(self._text)

    def text(self, text: str) -> bytes:
        """A delta; the message's item and part are opened before the first."""
        out = b""
        if not self._opened:
            self._opened = True
            item = {"id": self._item, "content": [], "role": "assistant",
                    "status": "in_progress", "type": "message"}  # fmt: skip
            out = self._event("response.output_item.added", {"item": item, "output_index": 0})
            out += self._event(
                "response.content_part.added",
                {"content_index": 0, "item_id": self._item, "output_index": 0,
                 "part": _text_part("")},
            )  # fmt: skip
        self._text.append(text)
        return out + self._event(
            "response.output_text.delta",
            {"content_index": 0, "delta": text, "item_id": self._item, "logprobs": [],
             "output_index": 0},
        )  # fmt: skip

    def end(self, response: dict[str, Any]) -> bytes:
        """The text, part and item closed (where any output came), then the terminal event
        with the whole ``response``."""
        out = b""
        if self._opened:
            text = "".join(self._text)
            where = {"content_index": 0, "item_id": self._item, "output_index": 0}
            out = self._event("response.output_text.done", {**where, "logprobs": [], "text": text})
            out += self._event("response.content_part.done", {**where, "part": _text_part(text)})
            item = message_item(self._item, text, response["status"])
            out += self._event("response.output_item.done", {"item": item, "output_index": 0})
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, {"response": response})


@dataclass(frozen=True, slots=True)
class Stored:
    """An answer kept for later requests: its conversation, its output text, its body."""

    messages: tuple[dict[str, Any], ...]
    output_text: str
    body: bytes


class ResponseStore:
    """Answers by id, the oldest dropped past ``capacity``."""

    def __init__(self, capacity: int = STORE_CAPACITY) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[str, Stored] = OrderedDict()

    def put(self, rid: str, stored: Stored) -> None:
        self._kept[rid] = stored
        if len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    def get(self, rid: str) -> Stored | None:
        return self._kept.get(rid)
