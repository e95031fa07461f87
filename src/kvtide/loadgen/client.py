"""One streamed OpenAI request over aiohttp, timed as vLLM's ``benchmark_serving`` times it.

TTFT is the first chunk that carries generated text (a role-only or empty chunk is not a token),
each later text chunk adds one inter-token latency (ITL) since the previous one, and E2E ends at
the last text chunk. ``usage`` (``stream_options.include_usage``) gives the token counts and
``prompt_tokens_details.cached_tokens``. Every failure becomes an error kind, never an exception.
An Anthropic Messages stream is read the same way: its text deltas are the chunks, its
``message_start`` and ``message_delta`` usage the counts (the prompt is the input and the cached
input together), its ``message_stop`` the end.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from kvtide.clock import WallClock
from kvtide.workloads.rows import fastest_loads

_CLOCK = WallClock()
_loads = fastest_loads()


@dataclass(slots=True)
class Outcome:
    """What one request did. Times in seconds from the moment it was sent."""

    error: str | None = None
    """None when it succeeded; else ``http_<status>``, ``connect``, ``timeout``,
    ``disconnected``, ``stream_error`` (an error object in the stream) or ``protocol``."""
    detail: str = ""
    status: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _chunk_text(choice: Mapping[str, Any]) -> str:
    delta = choice.get("delta")
    if isinstance(delta, dict):  # chat
        parts = (delta.get("content"), delta.get("reasoning_content"), delta.get("reasoning"))
        return "".join(p for p in parts if isinstance(p, str))
    text = choice.get("text")  # completions
    return text if isinstance(text, str) else ""


def _read_usage(out: Outcome, usage: object) -> None:
    if not isinstance(usage, dict):
        return
    for key in ("prompt_tokens", "completion_tokens"):
        value = usage.get(key)
        if isinstance(value, int):
            setattr(out, key, value)
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        out.cached_tokens = details["cached_tokens"]


def _took_text(out: Outcome, text: str, elapsed_s: float, last_s: float) -> float:
    """A chunk's ``text`` (OpenAI's or Anthropic's) into ``out``: the first is the TTFT, each
    later one an ITL; returns the time of the latest text chunk (an empty one is none)."""
    if not text:
        return last_s
    if out.ttft_s is None:
        out.ttft_s = elapsed_s
    else:
        out.itl_s.append(elapsed_s - last_s)
    out.text += text
    return elapsed_s


def _read_anthropic_usage(out: Outcome, usage: object) -> None:
    if not isinstance(usage, dict):
        return
    parts = [usage.get(k) for k in ANTHROPIC_INPUT]
    if isinstance(parts[0], int):
        out.prompt_tokens = sum(p for p in parts if isinstance(p, int))
    if isinstance(usage.get("cache_read_input_tokens"), int):
        out.cached_tokens = usage["cache_read_input_tokens"]
    if isinstance(usage.get("output_tokens"), int):
        out.completion_tokens = usage["output_tokens"]


ANTHROPIC_INPUT = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
"""Anthropic's input counts: the uncached, the cached and the newly cached."""


def _anthropic_event(
    out: Outcome, data: Mapping[str, Any], elapsed_s: float, last_s: float
) -> float:
    """Folds one event of an Anthropic Messages stream into ``out``."""
    kind = data.get("type")
    if kind == "content_block_delta":
        delta = data.get("delta")
        text = ""
        if isinstance(delta, dict):
            parts = (delta.get("text"), delta.get("thinking"), delta.get("partial_json"))
            text = "".join(p for p in parts if isinstance(p, str))
        last_s = _took_text(out, text, elapsed_s, last_s)
    elif kind == "message_start":
        message = data.get("message")
        if isinstance(message, dict):
            _read_anthropic_usage(out, message.get("usage"))
    elif kind == "message_delta":
        _read_anthropic_usage(out, data.get("usage"))
        delta = data.get("delta")
        if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
            out.finish_reason = delta["stop_reason"]
    return last_s


_RESPONSE_TEXT = frozenset(
    ("response.output_text.delta", "response.reasoning_text.delta",
     "response.function_call_arguments.delta", "response.custom_tool_call_input.delta")
)  # fmt: skip
"""The Responses events that carry output."""
_RESPONSE_ENDS = frozenset(("response.completed", "response.incomplete", "response.failed"))
_STREAM_ENDS = frozenset(("message_stop", *_RESPONSE_ENDS))
"""The typed events after which nothing is sent: Anthropic's and the Responses API's [DONE]."""


def _responses_event(
    out: Outcome, data: Mapping[str, Any], elapsed_s: float, last_s: float
) -> float:
    """Folds one event of an OpenAI Responses stream into ``out``."""
    kind = data.get("type")
    if kind in _RESPONSE_TEXT:
        delta = data.get("delta")
        return _took_text(out, delta if isinstance(delta, str) else "", elapsed_s, last_s)
    if kind == "error":
        out.error, out.detail = "stream_error", str(data.get("message"))[:200]
    elif kind in _RESPONSE_ENDS:
        response = data.get("response")
        response = response if isinstance(response, dict) else {}
        if kind == "response.failed":
            out.error, out.detail = "stream_error", str(response.get("error"))[:200]
        out.finish_reason = str(response.get("status"))
        usage = response.get("usage")
        if isinstance(usage, dict):
            for key, field_ in (("input_tokens", "prompt_tokens"),
                                ("output_tokens", "completion_tokens")):  # fmt: skip
                if isinstance(usage.get(key), int):
                    setattr(out, field_, usage[key])
            details = usage.get("input_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                out.cached_tokens = details["cached_tokens"]
    return last_s


def _error_message(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body[:200]
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])[:200]
    return body[:200]


def _apply_event(out: Outcome, data: Mapping[str, Any], elapsed_s: float, last_s: float) -> float:
    """Folds one SSE data object into ``out``; returns the time of the latest text chunk."""
    if "error" in data:
        err = data["error"]
        out.error = "stream_error"
        out.detail = str(err.get("message") if isinstance(err, dict) else err)[:200]
        return last_s
    if "type" in data:  # Anthropic's and the Responses API's events are typed; chunks not
        kind = data["type"]
        if isinstance(kind, str) and (kind.startswith("response.") or kind == "error"):
            return _responses_event(out, data, elapsed_s, last_s)
        return _anthropic_event(out, data, elapsed_s, last_s)
    choices = data.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        last_s = _took_text(out, _chunk_text(choice), elapsed_s, last_s)
        if isinstance(choice.get("finish_reason"), str):
            out.finish_reason = choice["finish_reason"]
    if data.get("usage") is not None:
        _read_usage(out, data["usage"])
    return last_s


async def stream(
    session: aiohttp.ClientSession,
    url: str,
    payload: Mapping[str, Any] | bytes,
    headers: Mapping[str, str],
    timeout_s: float,
) -> Outcome:
    """POSTs ``payload`` (with ``stream: true``; bytes: JSON already encoded) and reads the SSE
    stream to its end."""
    out = Outcome()
    body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    headers = {**headers, "Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, 10.0))
    last_s = 0.0
    start = _CLOCK.now()
    try:
        async with session.post(url, data=body, headers=headers, timeout=timeout) as resp:
            out.status = resp.status
            if resp.status >= 400:
                out.error = f"http_{resp.status}"
                out.detail = _error_message(await resp.text(errors="replace"))
                return out
            done = False
            pending = b""
            # whole network reads split here: a fraction of the calls of line-by-line reading
            async for data in resp.content.iter_any():
                *lines, pending = (pending + data).split(b"\n")
                now = _CLOCK.now() - start
                for raw in lines:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue  # blank separators, comments (": ping"), event: lines
                    body = line[5:].strip()
                    if body == b"[DONE]":
                        done = True
                        break
                    try:
                        event = _loads(body)
                    except ValueError:
                        out.error, out.detail = "protocol", f"not JSON: {body[:80]!r}"
                        return out
                    if isinstance(event, dict):
                        last_s = _apply_event(out, event, now, last_s)
                        if out.error is not None:
                            return out
                        if event.get("type") in _STREAM_ENDS:
                            done = True
                            break
                if done:
                    break
            done = done or pending.strip() in (b"data: [DONE]", b"data:[DONE]")
            if out.ttft_s is None:
                out.error, out.detail = "protocol", "the stream ended without a text chunk"
            elif not done:
                out.error, out.detail = "disconnected", "the stream ended without its end event"
            out.e2e_s = last_s
            return out
    except TimeoutError:
        out.error, out.detail = "timeout", f"no complete answer within {timeout_s:g} s"
    except aiohttp.ClientConnectorError as exc:
        out.error, out.detail = "connect", str(exc)[:200]
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        out.error, out.detail = "disconnected", str(exc)[:200] or type(exc).__name__
    except aiohttp.ClientError as exc:
        out.error, out.detail = "client", f"{type(exc).__name__}: {exc}"[:200]
    return out
