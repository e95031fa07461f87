"""The error a server answers, in the OpenAI body shape both servers use.

``{"error": {"message", "type", "param", "code"}}``: each server keeps its own status table
(the gateway OpenAI's ``type``/``code`` strings, the engine vLLM's class names and numeric
codes), both as ``Status`` rows, and raises ``ApiError`` with one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from kvtide.errors import KvtideError


@dataclass(frozen=True, slots=True)
class Status:
    """A row of a server's status table: the HTTP status and the body's ``type`` and ``code``."""

    http: int
    type: str
    code: str | int


class ApiError(KvtideError):
    """A request the server refuses; ``param`` names the offending field when there is one,
    ``retry_after_s`` adds a ``Retry-After`` header (whole seconds, at least 1)."""

    def __init__(
        self,
        status: Status,
        message: str,
        param: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s

    def body(self) -> bytes:
        return error_body(self)

    def headers(self) -> list[tuple[bytes, bytes]]:
        """The ASGI response headers: JSON, and ``Retry-After`` when set."""
        out = [(b"content-type", b"application/json")]
        if self.retry_after_s is not None:
            out.append((b"retry-after", str(max(int(self.retry_after_s), 1)).encode()))
        return out


def error_body(err: ApiError) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "message": err.message,
                "type": err.status.type,
                "param": err.param,
                "code": err.status.code,
            }
        }
    )


ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
"""Anthropic's ``error.type`` by HTTP status, as vLLM's ``/v1/messages`` words it (any other
5xx ``api_error``, 4xx ``invalid_request_error``): the ``anthropic`` client reads it."""


ANTHROPIC_PATH = "/v1/messages"
"""Where a server speaks Anthropic's Messages API (and its ``count_tokens``): errors there are
Anthropic's error objects."""


def speaks_anthropic(path: str) -> bool:
    return path.startswith(ANTHROPIC_PATH)


def error_for(path: str, err: ApiError) -> bytes:
    """``err``'s body in the API of ``path``: Anthropic's on ``/v1/messages``, else OpenAI's."""
    return anthropic_error_body(err) if speaks_anthropic(path) else error_body(err)


RESPONSES_PATH = "/v1/responses"


def error_event_for(path: str, err: ApiError) -> bytes:
    """``err`` as the SSE event that ends a stream of ``path``'s API: Anthropic's ``error``
    event (the ``anthropic`` client raises it), a Responses stream's ``error`` event, or
    OpenAI's ``data:`` error object."""
    if speaks_anthropic(path):
        return b"event: error\ndata: " + anthropic_error_body(err) + b"\n\n"
    if path.startswith(RESPONSES_PATH):
        return responses_error_event(err)
    return sse_error_event(err)


def responses_error_event(err: ApiError) -> bytes:
    """An error ending a Responses stream: the API's ``error`` event (``type``, ``code``,
    ``message``, ``param``: what vLLM sends and Responses clients such as Codex read) that also
    holds OpenAI's ``error`` object, which the ``openai`` client raises as ``APIError``."""
    status = err.status
    event = {
        "type": "error",
        "code": status.code,
        "message": err.message,
        "param": err.param,
        "error": {"message": err.message, "type": status.type, "param": err.param,
                  "code": status.code},
    }  # fmt: skip
    return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"


def anthropic_error_body(err: ApiError) -> bytes:
    """``err`` as Anthropic's error object, ``{"type": "error", "error": {type, message}}``
    (what a server answers on ``/v1/messages``)."""
    status = err.status.http
    kind = ANTHROPIC_ERROR_TYPES.get(status)
    if kind is None:
        kind = "api_error" if status >= 500 else "invalid_request_error"
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": err.message}})


def sse_error_event(err: ApiError) -> bytes:
    """An error after the first byte of a stream: one SSE event the ``openai`` client raises
    as ``APIError``, then the stream ends."""
    return b"data: " + error_body(err) + b"\n\n"
