"""Run under the peer-libraries venv: a chat stream as vLLM and SGLang serialize it, built with
their own protocol classes, and whether their request classes take the ``stream_options``
kvtide's gateway sends. Prints one JSON object; exit 3 when a module is missing.

    python peer_stream_chunks.py   # {"vllm": {...}, "sglang": {...}}
"""

from __future__ import annotations

import json
import sys
from typing import Any

ASKED = {"include_usage": True, "continuous_usage_stats": False}  # what the gateway sends
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
           "stream_options": ASKED}  # fmt: skip


def _vllm() -> dict[str, Any]:
    from vllm.entrypoints.openai.chat_completion import protocol as p
    from vllm.entrypoints.serve.engine.protocol import PromptTokenUsageInfo

    def chunk(choices: list[Any], usage: Any = None) -> str:
        # usage left unset unless given, as vLLM leaves it when it is not streamed per chunk
        extra = {"usage": usage} if usage is not None else {}
        c = p.ChatCompletionStreamResponse(
            id="chatcmpl-1", created=1, model="m", choices=choices, **extra
        )
        # vLLM's own serialization of a stream chunk (chat_completion/serving.py)
        data = c.model_dump_json(exclude_unset=True, exclude_none=not c.choices)
        return f"data: {data}\n\n"

    def token(text: str, finish: str | None = None, role: str | None = None) -> Any:
        delta = p.DeltaMessage(role=role, content=text) if role else p.DeltaMessage(content=text)
        return p.ChatCompletionResponseStreamChoice(index=0, delta=delta, finish_reason=finish)

    usage = p.UsageInfo(prompt_tokens=7, completion_tokens=2, total_tokens=9,
                        prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=4))  # fmt: skip
    plain = [chunk([token("", role="assistant")]), chunk([token("a")]), chunk([token("b", "stop")])]
    forced = [chunk([token("a")], usage), chunk([token("b", "stop")], usage)]
    request = p.ChatCompletionRequest.model_validate(REQUEST)
    assert request.stream_options is not None
    return {
        "plain": plain,
        "usage": chunk([], usage),
        "forced": forced,
        "accepted": request.stream_options.model_dump(),
    }


def _sglang() -> dict[str, Any]:
    from sglang.srt.entrypoints.openai import protocol as s

    def chunk(choices: list[Any], usage: Any = None) -> str:
        c = s.ChatCompletionStreamResponse(
            id="1", created=1, model="m", choices=choices, usage=usage
        )
        return f"data: {c.model_dump_json()}\n\n"  # SGLang's (serving_chat.py): nulls kept

    def token(text: str, finish: str | None = None) -> Any:
        return s.ChatCompletionResponseStreamChoice(
            index=0, delta=s.DeltaMessage(content=text), finish_reason=finish
        )

    usage = s.UsageInfo(prompt_tokens=7, completion_tokens=2, total_tokens=9,
                        prompt_tokens_details={"cached_tokens": 4})  # fmt: skip
    request = s.ChatCompletionRequest.model_validate(REQUEST)
    assert request.stream_options is not None
    return {
        "plain": [chunk([token("a")]), chunk([token("b", "stop")])],
        "usage": chunk([], usage),
        "forced": [],
        "accepted": request.stream_options.model_dump(),
    }


def main() -> None:
    out = {}
    for name, build in (("vllm", _vllm), ("sglang", _sglang)):
        try:
            out[name] = build()
        except ImportError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            sys.exit(3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
