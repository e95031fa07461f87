"""One status table: every error the gateway answers, as an OpenAI-style body.

``{"error": {"message", "type", "param", "code"}}`` with the HTTP status and ``type`` the
``openai`` client maps to its exception classes (400 BadRequestError, 401
AuthenticationError, 404 NotFoundError, 413 and 422 APIStatusError, 429 RateLimitError,
5xx InternalServerError).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from kvtide.errors import (
    ConfigError,
    KvtideError,
    NoHealthyReplica,
    StateStoreError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)


@dataclass(frozen=True, slots=True)
class Status:
    http: int
    type: str
    code: str


BAD_REQUEST = Status(400, "invalid_request_error", "invalid_request")
UNAUTHORIZED = Status(401, "authentication_error", "invalid_api_key")
FORBIDDEN = Status(403, "permission_error", "forbidden")
NOT_FOUND = Status(404, "invalid_request_error", "not_found")
MODEL_NOT_FOUND = Status(404, "invalid_request_error", "model_not_found")
METHOD_NOT_ALLOWED = Status(405, "invalid_request_error", "method_not_allowed")
TOO_LARGE = Status(413, "invalid_request_error", "request_too_large")
RATE_LIMITED = Status(429, "rate_limit_error", "rate_limit_exceeded")
INTERNAL = Status(500, "internal_error", "internal_error")
BAD_GATEWAY = Status(502, "upstream_error", "upstream_error")
UNAVAILABLE = Status(503, "service_unavailable", "no_healthy_replica")
GATEWAY_TIMEOUT = Status(504, "upstream_error", "upstream_timeout")

_BY_HTTP = {
    s.http: s
    for s in (
        BAD_REQUEST,
        UNAUTHORIZED,
        FORBIDDEN,
        NOT_FOUND,
        METHOD_NOT_ALLOWED,
        TOO_LARGE,
        RATE_LIMITED,
        INTERNAL,
        BAD_GATEWAY,
        UNAVAILABLE,
        GATEWAY_TIMEOUT,
    )
}


class ApiError(KvtideError):
    """An error answered to the client; ``retry_after_s`` adds a ``Retry-After`` header."""

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


def status_for_http(code: int) -> Status:
    """The table's row for an HTTP status (aiohttp's own 404/405/413 go through here)."""
    found = _BY_HTTP.get(code)
    if found is not None:
        return found
    return BAD_REQUEST if code < 500 else INTERNAL


def as_api_error(exc: BaseException) -> ApiError:
    """Every exception a handler may raise, as the one row of the table it belongs to."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, NoHealthyReplica):
        return ApiError(UNAVAILABLE, str(exc) or "no healthy replica", retry_after_s=1.0)
    if isinstance(exc, UpstreamTimeout):
        return ApiError(GATEWAY_TIMEOUT, str(exc))
    if isinstance(exc, UpstreamUnavailable | UpstreamError):
        return ApiError(BAD_GATEWAY, str(exc))
    if isinstance(exc, StateStoreError):
        return ApiError(UNAVAILABLE, str(exc), retry_after_s=1.0)
    if isinstance(exc, ConfigError):
        return ApiError(BAD_REQUEST, str(exc))
    return ApiError(INTERNAL, "internal error")


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


def sse_error_event(err: ApiError) -> bytes:
    """An error after the first byte of a stream: one SSE event the ``openai`` client raises
    as ``APIError``, then the stream ends."""
    return b"data: " + error_body(err) + b"\n\n"
