"""HTTP errors as OpenAI-style bodies: one exception, one status table, one body shape.

The body is vLLM's ``ErrorResponse``: ``{"error": {"message", "type", "param", "code"}}`` with
the status as ``code`` and the error class name as ``type``, which the official ``openai``
client turns into ``BadRequestError``, ``NotFoundError``, ``InternalServerError``...
"""

from __future__ import annotations

import orjson

ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestEntityTooLargeError",
    503: "ServiceUnavailableError",
    500: "InternalServerError",
}


class ApiError(Exception):
    """A request the server refuses; ``param`` names the offending field when there is one.
    ``retry_after_s`` becomes a ``Retry-After`` header (503 when the queue is full)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.param)

    def headers(self) -> list[tuple[bytes, bytes]]:
        if self.retry_after_s is None:
            return []
        return [(b"retry-after", str(self.retry_after_s).encode())]


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": ERROR_TYPES.get(status, "BadRequestError"),
                "param": param,
                "code": status,
            }
        }
    )


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)
