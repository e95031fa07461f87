"""Run under the peer-libraries venv: vLLM's own ``AuthenticationMiddleware`` (its
``--api-key``) in front of an app that answers 200, asked each case read from stdin as JSON
``[[method, path, authorization or null], ...]`` with ``key`` as its one key. Prints
``[[status, body], ...]``; exit 3 when vLLM's module is missing.

    echo '{"key": "k", "cases": [["GET", "/v1/models", null]]}' | python peer_auth_middleware.py
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any


async def _ask(app: Any, method: str, path: str, authorization: str | None) -> list[Any]:
    headers = [] if authorization is None else [(b"authorization", authorization.encode())]
    scope = {"type": "http", "method": method, "path": path, "root_path": "",
             "headers": headers, "query_string": b""}  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return [status, body.decode()]


async def _passed(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"passed"})


def main() -> int:
    try:
        from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware
    except ImportError as exc:
        print(exc, file=sys.stderr)
        return 3
    asked = json.load(sys.stdin)
    app = AuthenticationMiddleware(_passed, [asked["key"]])

    async def run() -> list[Any]:
        return [await _ask(app, *case) for case in asked["cases"]]

    print(json.dumps(asyncio.run(run())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
