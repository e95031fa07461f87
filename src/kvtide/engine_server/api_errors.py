"""The engine's status table: vLLM's ``ErrorResponse`` shape, the error class name as ``type``
and the HTTP status as ``code``, which the ``openai`` client turns into ``BadRequestError``,
``NotFoundError``, ``InternalServerError``... (``ApiError`` itself is ``kvtide.asgi``'s.)
"""

from __future__ import annotations

from kvtide.asgi import ApiError, Status

BAD_REQUEST = Status(400, "BadRequestError", 400)
NOT_FOUND = Status(404, "NotFoundError", 404)
METHOD_NOT_ALLOWED = Status(405, "MethodNotAllowedError", 405)
REQUEST_TIMEOUT = Status(408, "RequestTimeoutError", 408)
TOO_LARGE = Status(413, "RequestEntityTooLargeError", 413)
INTERNAL = Status(500, "InternalServerError", 500)
UNAVAILABLE = Status(503, "ServiceUnavailableError", 503)


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(BAD_REQUEST, message, param=param)
