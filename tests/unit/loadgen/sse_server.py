"""A tiny OpenAI-compatible server for the load generator's tests: real aiohttp over a real
loopback socket, streaming SSE the way vLLM does (a role chunk, one chunk per token, a finish
chunk, a usage chunk with ``prompt_tokens_details.cached_tokens``, ``data: [DONE]``).

Prompts are tokenized with kvtide's tokenizer (chat messages through the chat template; a
token-id prompt is taken as it is) and
``cached_tokens`` counts the 16-token blocks shared with any earlier prompt, so prefix sharing
in the text shows as it would on a prefix-caching engine. ``max_tokens`` picks a fault:
41 answers 503, 42 answers 400 with an OpenAI error body, 43 stalls past any short timeout,
44 drops the connection mid-stream, 45 sends an error object in the stream.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kvtide.text import Tokenizer

BLOCK = 16
TTFT_S = 0.02
ITL_S = 0.002


@dataclass
class Server:
    tokenizer: Tokenizer
    port: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)
    _blocks: set[tuple[int, ...]] = field(default_factory=set)

    def cached_blocks(self, ids: list[int]) -> int:
        hits = 0
        for end in range(BLOCK, len(ids) + 1, BLOCK):
            if tuple(ids[:end]) not in self._blocks:
                break
            hits += 1
        for end in range(BLOCK, len(ids) + 1, BLOCK):
            self._blocks.add(tuple(ids[:end]))
        return hits

    async def models(self, request: web.Request) -> web.Response:
        self.auth.append(request.headers.get("Authorization", ""))
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.auth.append(request.headers.get("Authorization", ""))
        max_tokens = int(body.get("max_tokens", 16))
        if max_tokens == 41:
            return web.json_response({"error": {"message": "busy", "type": "x"}}, status=503)
        if max_tokens == 42:
            error = {"message": "bad field", "type": "invalid_request_error", "param": "x"}
            return web.json_response({"error": error}, status=400)
        chat = "messages" in body
        if chat:
            ids = self.tokenizer.apply_chat_template(body["messages"], tokenize=True)
        elif isinstance(body["prompt"], list):  # token ids, taken as they are
            ids = list(body["prompt"])
        else:
            ids = self.tokenizer.encode(body["prompt"])
        self.prompts.append(ids)
        cached = self.cached_blocks(ids) * BLOCK
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(obj: object) -> None:
            await resp.write(f"data: {json.dumps(obj)}\n\n".encode())

        kind = "chat.completion.chunk" if chat else "text_completion"
        await asyncio.sleep(TTFT_S if max_tokens != 43 else 30.0)
        if chat:
            await send(
                {
                    "object": kind,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                }
            )
        for i in range(max_tokens):
            if i:
                await asyncio.sleep(ITL_S)
            if max_tokens == 44 and i == 3:
                assert request.transport is not None
                request.transport.close()
                return resp
            if max_tokens == 45 and i == 3:
                await send({"error": {"message": "engine died", "code": 500}})
                return resp
            piece = {"delta": {"content": f" t{i}"}} if chat else {"text": f" t{i}"}
            await send({"object": kind, "choices": [{"index": 0, **piece, "finish_reason": None}]})
        last = {"delta": {}} if chat else {"text": ""}
        await send({"object": kind, "choices": [{"index": 0, **last, "finish_reason": "length"}]})
        usage = {
            "prompt_tokens": len(ids),
            "completion_tokens": max_tokens,
            "total_tokens": len(ids) + max_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        await send({"object": kind, "choices": [], "usage": usage})
        await resp.write(b"data: [DONE]\n\n")
        return resp


@contextmanager
def serving(tokenizer: Tokenizer) -> Iterator[Server]:
    """The server on a free loopback port in a thread of its own; stopped on exit."""
    server = Server(tokenizer)
    app = web.Application()
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/chat/completions", server.complete)
    app.router.add_post("/v1/completions", server.complete)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    server.port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
