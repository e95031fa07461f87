"""The stream reader agrees with the official `openai` client on the same server's streams."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from kvtide.loadgen import Outcome, stream

from .sse_server import Server


def ours(server: Server, path: str, body: dict[str, Any]) -> Outcome:
    async def go() -> Outcome:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{server.port}/v1/{path}"
            return await stream(session, url, body, {}, timeout_s=10.0)

    return asyncio.run(go())


@pytest.fixture
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"http://127.0.0.1:{server.port}/v1", api_key="k", max_retries=0
    ) as opened:
        yield opened


def test_chat_stream_text_and_usage_as_the_openai_client_reads_them(
    server: Server, client: openai.OpenAI
) -> None:
    messages = [{"role": "user", "content": " harbour master logged each vessel"}] * 3
    opts = {"include_usage": True}
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=7,
            stream=True,
            stream_options=opts,  # type: ignore[arg-type]
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    body = {"model": "tiny", "messages": messages, "max_tokens": 7, "stream": True,
            "stream_options": opts}  # fmt: skip
    out = ours(server, "chat/completions", body)
    assert out.ok and out.text == text
    assert (out.prompt_tokens, out.completion_tokens) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    # the same prompt a second time: the server reports its blocks as cached, to both readers
    assert out.cached_tokens == usage.prompt_tokens_details.cached_tokens + 16 * (
        usage.prompt_tokens // 16
    )
    assert [out.finish_reason] == finish == ["length"]
    # one text chunk per token: 7 tokens give 6 inter-token gaps
    assert (
        len(out.itl_s) == len([c for c in chunks if c.choices and c.choices[0].delta.content]) - 1
    )


def test_completions_stream_as_the_openai_client_reads_it(
    server: Server, client: openai.OpenAI
) -> None:
    stream_ = client.completions.create(
        model="tiny",
        prompt="a b c",
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream_)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    body = {"model": "tiny", "prompt": "a b c", "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    out = ours(server, "completions", body)
    usage = chunks[-1].usage
    assert usage is not None
    assert out.text == text and out.completion_tokens == usage.completion_tokens


@pytest.mark.parametrize(
    ("max_tokens", "exception", "kind"),
    [(42, openai.BadRequestError, "http_400"), (41, openai.InternalServerError, "http_503")],
)
def test_http_errors_map_as_the_openai_client_maps_them(
    server: Server, client: openai.OpenAI, max_tokens: int, exception: type[Exception], kind: str
) -> None:
    with pytest.raises(exception) as raised:
        client.completions.create(model="tiny", prompt="x", max_tokens=max_tokens, stream=True)
    out = ours(server, "completions", {"model": "tiny", "prompt": "x", "max_tokens": max_tokens})
    assert out.error == kind and out.detail in str(raised.value)
