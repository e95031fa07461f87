"""A tiny vLLM-shaped OpenAI server for the gateway's tests: a real aiohttp server on a real
socket, run as its own process (so a test can kill -9 it).

It answers /v1/models, /health, /metrics (vLLM's gauge names), /v1/completions and
/v1/chat/completions (streamed or not), Anthropic's /v1/messages (streamed or not) and
/v1/messages/count_tokens as vLLM serves them, a pooling model's /v1/embeddings and /rerank,
and /tokenize (a byte per token), and reports ``prompt_tokens_details.cached_tokens`` as
vLLM would with prefix caching: the longest prefix, in whole 16-character blocks, shared with
an earlier prompt under the same ``cache_salt``. Not a fake of an engine's timing: the
emulated engine (``kvtide engine``) is that. Modes (``--mode``): ok, fail500 (every
completion is a 500), stall (never answers). ``--prefill-delay S`` holds the first token S
seconds; ``--role-first`` sends a chat stream's role chunk with the headers, before that delay
(vLLM sends it with the first token); ``--usage-every-chunk`` puts usage in every streamed
chunk, asked or not (vLLM's ``--enable-force-include-usage``); ``--tail-delay S`` holds a
stream's end of body S seconds after its ``data: [DONE]``. /stats shows what it saw,
including aborts and each request's ``X-Request-Id``.

    python backend.py --port 8101 --model m [--tokens 8] [--token-delay 0.01] [--mode ok]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import struct
import time
from collections.abc import Iterator

from aiohttp import web

BLOCK = 16


class Backend:
    def __init__(
        self,
        model: str,
        tokens: int,
        delay_s: float,
        mode: str,
        prefill_s: float = 0.0,
        role_first: bool = False,
        usage_every_chunk: bool = False,
        tail_s: float = 0.0,
    ) -> None:
        self.tail_s = tail_s
        self.usage_every_chunk = usage_every_chunk
        self.prefill_s = prefill_s
        self.role_first = role_first
        self.model = model
        self.tokens = tokens
        self.delay_s = delay_s
        self.mode = mode
        self.prompts: dict[str | None, list[str]] = {}
        self.stats = {
            "requests": 0, "aborted": 0, "running": 0, "max_running": 0, "salts": [], "bodies": [],
            "request_ids": [],
        }  # fmt: skip

    def took(self, request: web.Request, body: dict, *dropped: str) -> None:
        """Counts a request the engine runs: its salt, its id and its body less ``dropped``."""
        self.stats["requests"] += 1
        self.stats["salts"].append(body.get("cache_salt"))
        self.stats["request_ids"].append(request.headers.get("X-Request-Id"))
        self.stats["bodies"].append({k: v for k, v in body.items() if k not in dropped})

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """One request running; counted aborted where its client went away."""
        self.stats["running"] += 1
        self.stats["max_running"] = max(self.stats["max_running"], self.stats["running"])
        try:
            yield
        except asyncio.CancelledError:
            self.stats["aborted"] += 1
            raise
        finally:
            self.stats["running"] -= 1

    def cached(self, salt: str | None, text: str) -> int:
        best = 0
        for old in self.prompts.get(salt, []):
            n = 0
            limit = min(len(old), len(text))
            while n < limit and old[n] == text[n]:
                n += 1
            best = max(best, n // BLOCK * BLOCK)
        self.prompts.setdefault(salt, []).append(text)
        return best // 4  # "tokens": 4 characters each


def prompt_text(body: dict) -> str:
    if "messages" in body:
        return "".join(f"{m['role']}:{m.get('content') or ''}\n" for m in body["messages"])
    p = body.get("prompt", "")
    return p if isinstance(p, str) else " ".join(map(str, p))


def embedding(text: str, dims: int = 8) -> list[float]:
    """A text's vector: its bytes' digest, scaled into [0, 1) (exact in float32)."""
    digest = hashlib.sha256(text.encode()).digest()
    return [digest[i] / 256 for i in range(dims)]


def build(b: Backend) -> web.Application:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": b.model, "object": "model"}]})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(request: web.Request) -> web.Response:
        text = (
            f'vllm:num_requests_running{{model_name="{b.model}"}} {b.stats["running"]}\n'
            f'vllm:num_requests_waiting{{model_name="{b.model}"}} 0\n'
            f'vllm:kv_cache_usage_perc{{model_name="{b.model}"}} 0.25\n'
        )
        return web.Response(text=text)

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(b.stats)

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        b.took(request, body, "messages", "prompt")
        if b.mode == "fail500":
            return web.json_response({"error": {"message": "boom", "type": "x"}}, status=500)
        if b.mode == "stall":
            await asyncio.sleep(3600)
        if body.get("model") != b.model:
            err = {"message": "no such model", "type": "NotFoundError", "param": None, "code": 404}
            return web.json_response({"error": err}, status=404)
        is_chat = request.path.endswith("chat/completions")
        text = prompt_text(body)
        prompt_tokens = max(len(text) // 4, 1)
        cached = b.cached(body.get("cache_salt"), text)
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or b.tokens)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n,
            "total_tokens": prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        kind = "chat.completion" if is_chat else "text_completion"
        created = int(time.time())
        with b.running():
            if not body.get("stream"):
                await asyncio.sleep(b.prefill_s + b.delay_s * n)
                if is_chat:
                    choice = {
                        "index": 0,
                        "message": {"role": "assistant", "content": "tok " * n},
                        "finish_reason": "length",
                    }
                else:
                    choice = {"index": 0, "text": "tok " * n, "finish_reason": "length"}
                return web.json_response(
                    {
                        "id": "cmpl-1",
                        "object": kind,
                        "created": created,
                        "model": b.model,
                        "choices": [choice],
                        "usage": usage,
                    }
                )
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            include_usage = (body.get("stream_options") or {}).get("include_usage")
            if is_chat and b.role_first:
                opening = {"index": 0, "delta": {"role": "assistant", "content": ""}}
                chunk = {
                    "id": "cmpl-1",
                    "object": kind + ".chunk",
                    "created": created,
                    "model": b.model,
                    "choices": [{**opening, "finish_reason": None}],
                }
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(b.prefill_s)
            for i in range(n):
                await asyncio.sleep(b.delay_s)
                last = i == n - 1
                if is_chat:
                    choice = {
                        "index": 0,
                        "delta": {"content": "tok "},
                        "finish_reason": "length" if last else None,
                    }
                else:
                    choice = {
                        "index": 0,
                        "text": "tok ",
                        "finish_reason": "length" if last else None,
                    }
                chunk = {
                    "id": "cmpl-1",
                    "object": kind + ".chunk" if is_chat else kind,
                    "created": created,
                    "model": b.model,
                    "choices": [choice],
                }
                if b.usage_every_chunk:  # vLLM's --enable-force-include-usage
                    chunk["usage"] = {**usage, "completion_tokens": i + 1}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if include_usage or b.usage_every_chunk:
                chunk = {
                    "id": "cmpl-1",
                    "object": kind + ".chunk" if is_chat else kind,
                    "created": created,
                    "model": b.model,
                    "choices": [],
                    "usage": usage,
                }
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await asyncio.sleep(b.tail_s)
            await resp.write_eof()
            return resp

    async def pooling(request: web.Request) -> web.Response:
        """vLLM's /v1/embeddings and /rerank (a pooling model's): a vector per input from
        its text's bytes (float or base64, as vLLM answers the openai client's default), a
        relevance per document; ``--prefill-delay`` holds the answer."""
        body = await request.json()
        b.took(request, body)
        if b.mode == "fail500":
            return web.json_response({"error": {"message": "boom", "type": "x"}}, status=500)
        if body.get("model", b.model) != b.model:
            err = {"message": "no such model", "type": "NotFoundError", "param": None, "code": 404}
            return web.json_response({"error": err}, status=404)
        with b.running():
            await asyncio.sleep(3600 if b.mode == "stall" else b.prefill_s)
        if request.path.endswith("rerank"):
            docs = body["documents"]
            results = [
                {"index": i, "relevance_score": embedding(d)[0], "document": {"text": d}}
                for i, d in enumerate(docs)
            ]
            tokens = sum(len(d) // 4 + 1 for d in docs)
            return web.json_response(
                {"id": "rerank-1", "model": b.model, "results": results,
                 "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
            )  # fmt: skip
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = []
        for i, text in enumerate(inputs):
            vector = embedding(text)
            value: object = vector
            if body.get("encoding_format") == "base64":
                value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": value})
        tokens = sum(len(t) // 4 + 1 for t in inputs)
        return web.json_response(
            {"id": "embd-1", "object": "list", "created": int(time.time()), "model": b.model,
             "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        )  # fmt: skip

    def anthropic_error(status: int, kind: str, message: str) -> web.Response:
        error = {"type": "error", "error": {"type": kind, "message": message}}
        return web.json_response(error, status=status)

    async def messages(request: web.Request) -> web.StreamResponse:
        """vLLM's /v1/messages (Anthropic's Messages API): the reply and usage as vLLM's
        converter words them, ``cache_read_input_tokens`` as the cached prefix."""
        body = await request.json()
        b.took(request, body, "messages", "system")
        if b.mode == "fail500":
            return anthropic_error(500, "api_error", "boom")
        if b.mode == "stall":
            await asyncio.sleep(3600)
        if body.get("model") != b.model:
            return anthropic_error(404, "not_found_error", "no such model")
        if not isinstance(body.get("max_tokens"), int):
            return anthropic_error(400, "invalid_request_error", "max_tokens: Field required")
        text = json.dumps([body.get("system"), body["messages"]])[:-1]  # open: turns extend it
        prompt_tokens = max(len(text) // 4, 1)
        cached = b.cached(body.get("cache_salt"), text)
        n = body["max_tokens"]
        usage = {"input_tokens": prompt_tokens - cached, "output_tokens": n,
                 "cache_read_input_tokens": cached}  # fmt: skip
        reply = {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                 "model": b.model, "stop_reason": None, "stop_sequence": None}  # fmt: skip
        with b.running():
            await asyncio.sleep(b.prefill_s)
            if not body.get("stream"):
                await asyncio.sleep(b.delay_s * n)
                reply.update(content=[{"type": "text", "text": "tok " * n}],
                             stop_reason="max_tokens", usage=usage)  # fmt: skip
                return web.json_response(reply)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)

            async def event(kind: str, data: dict) -> None:
                await resp.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())

            opening = {**usage, "output_tokens": 0}
            await event("message_start", {"type": "message_start",
                                          "message": {**reply, "usage": opening}})  # fmt: skip
            block = {"type": "text", "text": ""}
            start = {"type": "content_block_start", "index": 0, "content_block": block}
            await event("content_block_start", start)
            for _ in range(n):
                await asyncio.sleep(b.delay_s)
                delta = {"type": "text_delta", "text": "tok "}
                await event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                    "delta": delta})  # fmt: skip
            await event("content_block_stop", {"type": "content_block_stop", "index": 0})
            stop = {"stop_reason": "max_tokens", "stop_sequence": None}
            await event("message_delta", {"type": "message_delta", "delta": stop, "usage": usage})
            await event("message_stop", {"type": "message_stop"})
            await asyncio.sleep(b.tail_s)
            await resp.write_eof()
            return resp

    async def count_tokens(request: web.Request) -> web.Response:
        body = await request.json()
        b.stats["request_ids"].append(request.headers.get("X-Request-Id"))
        b.stats["bodies"].append(body)
        text = json.dumps([body.get("system"), body["messages"]])
        return web.json_response({"input_tokens": max(len(text) // 4, 1)})

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        b.stats["request_ids"].append(request.headers.get("X-Request-Id"))
        b.stats["bodies"].append(body)
        tokens = list(body["prompt"].encode())
        return web.json_response({"count": len(tokens), "max_model_len": 4096, "tokens": tokens})

    app = web.Application()
    app.router.add_post("/v1/embeddings", pooling)
    app.router.add_post("/rerank", pooling)
    app.router.add_post("/v1/rerank", pooling)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/stats", stats)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="m")
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--token-delay", type=float, default=0.0)
    p.add_argument("--mode", default="ok", choices=("ok", "fail500", "stall"))
    p.add_argument("--prefill-delay", type=float, default=0.0)
    p.add_argument("--role-first", action="store_true")
    p.add_argument("--usage-every-chunk", action="store_true", help="usage asked or not (vLLM's "
                   "--enable-force-include-usage)")  # fmt: skip
    p.add_argument("--tail-delay", type=float, default=0.0)
    args = p.parse_args()
    backend = Backend(
        args.model, args.tokens, args.token_delay, args.mode, args.prefill_delay,
        args.role_first, args.usage_every_chunk, args.tail_delay,
    )  # fmt: skip
    app = build(backend)
    web.run_app(
        app,
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
        handler_cancellation=True,
    )


if __name__ == "__main__":
    main()
