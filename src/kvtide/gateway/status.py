"""The gateway's status table: every error it answers, as an OpenAI-style body
(``kvtide.asgi``'s ``ApiError`` and body shape, with OpenAI's ``type`` and ``code`` strings).

``{"error": {"message", "type", "param", "code"}}`` with the HTTP status and ``type`` the
``openai`` client maps to its exception classes (400 BadRequestError, 401
AuthenticationError, 404 NotFoundError, 413 and 422 APIStatusError, 429 RateLimitError,
5xx InternalServerError).
"""

from __future__ import annotations

from kvtide.asgi import ApiError, Status, error_body, sse_error_event
from kvtide.errors import (
    ConfigError,
    NoHealthyReplica,
    StateStoreError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)

__all__ = ["ApiError", "Status", "as_api_error", "error_body", "sse_error_event"]

BAD_REQUEST = Status(400, "invalid_request_error", "invalid_request")
UNAUTHORIZED = Status(401, "authentication_error", "invalid_api_key")
FORBIDDEN = Status(403, "permission_error", "forbidden")
NOT_FOUND = Status(404, "invalid_request_error", "not_found")
MODEL_NOT_FOUND = Status(404, "invalid_request_error", "model_not_found")
METHOD_NOT_ALLOWED = Status(405, "invalid_request_error", "method_not_allowed")
REQUEST_TIMEOUT = Status(408, "invalid_request_error", "request_timeout")
TOO_LARGE = Status(413, "invalid_request_error", "request_too_large")
RATE_LIMITED = Status(429, "rate_limit_error", "rate_limit_exceeded")
INTERNAL = Status(500, "internal_error", "internal_error")
BAD_GATEWAY = Status(502, "upstream_error", "upstream_error")
UNAVAILABLE = Status(503, "service_unavailable", "no_healthy_replica")
QUEUE_FULL = Status(503, "service_unavailable", "queue_full")
QUEUE_TIMEOUT = Status(503, "service_unavailable", "queue_timeout")
SHUTTING_DOWN = Status(503, "service_unavailable", "shutting_down")
GATEWAY_TIMEOUT = Status(504, "upstream_error", "upstream_timeout")


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
