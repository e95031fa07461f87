"""What both asyncio servers share below them: raw ASGI messages, the OpenAI error shape, and
the runner that serves an ASGI app on Granian's embedded server in our own event loop.

Imports only the leaves (``errors``); ``gateway`` and ``engine_server`` import it, never each
other.
"""

from kvtide.asgi.api_errors import ApiError, Status, error_body, sse_error_event
from kvtide.asgi.messages import (
    Disconnected,
    Message,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    respond,
    watch_disconnect,
)
from kvtide.asgi.runner import AsgiServer, check_port

__all__ = [
    "ApiError",
    "AsgiServer",
    "Disconnected",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "Status",
    "check_port",
    "error_body",
    "header",
    "read_body",
    "respond",
    "sse_error_event",
    "watch_disconnect",
]
