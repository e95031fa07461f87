"""A streamed answer's ``usage``, asked of the engine for every stream and hidden again from a
client that did not ask for it.

The engine's ``usage`` is what the gateway learns what it served from: the cached tokens the
router's index health compares with its prediction (``Router.report``), the access log's
``cached_tokens`` and the engine's prompt token count. An engine sends it in a stream only
under ``stream_options.include_usage``, which the ``openai`` client does not set by default,
so without this the gateway would be blind on most streamed chat traffic. The gateway sets
it upstream, reads the usage event, and drops it from what the client gets: the client sees
the stream it asked for.

To drop an event, the gateway must see it whole before passing any of it on. Every stream
goes to the client in whole SSE events (``whole_events``, in ``gateway.proxy``): bytes after
the last event boundary wait for the rest of their event (a client cannot act on half an
event either, and an error event after a failure must not land inside one). Past
``MAX_HELD_BYTES`` without a boundary the bytes go through as they are.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from kvtide.gateway.status import BAD_REQUEST, ApiError

MAX_HELD_BYTES = 1 << 20
"""An event longer than this is no OpenAI chunk: pass it through rather than hold it."""

USAGE_MARK = b'"completion_tokens"'
"""Present in every ``usage`` object, absent from a text chunk's JSON framing."""

_OUTPUT = re.compile(rb'"(?:text|content|reasoning_content|arguments)"\s*:\s*"[^"]')
"""A choice's non-empty output string (an empty one, ``""``, is no token)."""


def ask_usage(body: dict[str, Any]) -> bool:
    """Sets ``stream_options.include_usage`` in a streamed request's ``body``; whether the
    client had not asked for it (then its usage event is the gateway's, not the client's)."""
    opts = body.get("stream_options")
    if opts is None:
        body["stream_options"] = {"include_usage": True}
        return True
    if not isinstance(opts, dict):
        raise ApiError(BAD_REQUEST, "'stream_options' must be an object", "stream_options")
    wanted = opts.get("include_usage", False)
    if not isinstance(wanted, bool):
        raise ApiError(
            BAD_REQUEST, "'stream_options.include_usage' must be a boolean", "stream_options"
        )
    if wanted:
        return False
    opts = {**opts, "include_usage": True}
    if opts.get("continuous_usage_stats"):
        # it had no effect without include_usage (vLLM): usage in every chunk is not asked
        opts["continuous_usage_stats"] = False
    body["stream_options"] = opts
    return True


class UsageHider:
    """One stream on its way to a client that did not ask for usage: ``hide`` the usage of
    each run of whole events (the proxy frames the stream: ``whole_events``)."""

    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active = True
        """False once the engine turned out to send usage unasked: the rest passes as is."""

    def hide(self, events: bytes) -> bytes:
        if not self.active:
            return events
        hidden = without_usage(events)
        if hidden is not None:
            return hidden
        self.active = False
        return events


class OutputCounter:
    """The completion tokens a stream has passed on, counted from its SSE events: what a
    tenant is charged for a stream that ended before the engine's usage event (a client
    that hung up, an engine that failed mid-stream).

    One token per choice whose ``text`` (completions) or ``delta`` content, reasoning or
    tool-call ``arguments`` (chat) is not empty: vLLM streams an event per token, and so
    does kvtide engine (``engine_server.app``; its role event and a last event with only
    the finish reason carry none). An engine that puts several tokens in one event (a stop
    string held back, speculative decoding, vLLM's ``--stream-interval``) is undercounted:
    a lower bound, not a bill."""

    __slots__ = ("held", "tokens")

    def __init__(self) -> None:
        self.tokens = 0
        self.held = b""
        """The start of an event not ended yet: counted once it is whole."""

    def take(self, data: bytes) -> None:
        events, self.held = whole_events(self.held + data)
        if events:
            self.tokens += len(_OUTPUT.findall(events))


def whole_events(data: bytes) -> tuple[bytes, bytes]:
    """``data`` split after its last SSE event boundary (a blank line): the whole events, and
    the start of the next one, to be held until its end arrives."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\n\r\n")
    if lf < 0 and crlf < 0:
        return (data, b"") if len(data) > MAX_HELD_BYTES else (b"", data)
    cut = max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)
    return data[:cut], data[cut:]


def without_usage(events: bytes) -> bytes | None:
    """``events`` (whole SSE events) less the engine's usage event (vLLM's and SGLang's last,
    with ``choices: []``); events without a usage object are passed on byte for byte. None
    when an event with choices carries a usage object: the engine sends usage whatever the
    request says (vLLM's ``--enable-force-include-usage``: in every chunk), so the client
    would get it without the gateway too, and the stream is to be passed on as it comes."""
    if USAGE_MARK not in events:
        return events
    sep = b"\r\n\r\n" if b"\r\n\r\n" in events else b"\n\n"
    out: list[bytes] = []
    for event in events.split(sep):
        if USAGE_MARK in event:
            usage_only = _usage_only(event)
            if usage_only is None:
                return None
            if usage_only:
                continue
        out.append(event)
    return sep.join(out)


def _usage_only(event: bytes) -> bool | None:
    """Whether ``event`` is a usage-only ``data:`` event; None when it is one with choices
    and a usage object."""
    head, colon, payload = event.partition(b":")
    if head.strip() != b"data" or not colon or b"\n" in payload.strip():
        return False  # not a one-line data event (SGLang's sglext events): not ours
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(obj, dict) or not isinstance(obj.get("usage"), dict):
        return False
    return None if obj.get("choices") else True
