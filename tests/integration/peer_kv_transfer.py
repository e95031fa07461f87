"""Run under the peer-libraries venv: vLLM's own request and response classes asked to read
disaggregated-serving bodies from stdin (JSON ``[[kind, body], ...]``): a request kind
(``completions``, ``chat``, ``messages``, ``responses``) is validated as vLLM's server
validates it; a response kind (``completion``, ``chat.completion``, ``text_completion.chunk``,
``chat.completion.chunk``, ``message``, ``response``, ``response.event``: one event of a
streamed response) is an answer of kvtide's engine, read by vLLM's model of it. Prints
``[[kv_transfer_params, error], ...]`` (what the class kept of the field, a response event's
from the response it holds, or the validation error); exit 3 when vLLM's modules are
missing.

    echo '[["chat", {"model": "m", "messages": [], "kv_transfer_params": {}}]]' | python peer_kv_transfer.py
"""  # noqa: E501

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> int:
    try:
        from openai.types.responses import ResponseTextDeltaEvent, ResponseTextDoneEvent
        from pydantic import TypeAdapter, ValidationError
        from vllm.entrypoints.anthropic.protocol import (
            AnthropicMessagesRequest,
            AnthropicMessagesResponse,
        )
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionRequest,
            ChatCompletionResponse,
            ChatCompletionStreamResponse,
        )
        from vllm.entrypoints.openai.completion.protocol import (
            CompletionRequest,
            CompletionResponse,
            CompletionStreamResponse,
        )
        from vllm.entrypoints.openai.responses.protocol import (
            ResponsesRequest,
            ResponsesResponse,
            StreamingResponsesResponse,
        )
    except ImportError as exc:
        print(exc, file=sys.stderr)
        return 3
    classes: dict[str, Any] = {
        "completions": CompletionRequest,
        "chat": ChatCompletionRequest,
        "messages": AnthropicMessagesRequest,
        "responses": ResponsesRequest,
        "completion": CompletionResponse,
        "chat.completion": ChatCompletionResponse,
        "text_completion.chunk": CompletionStreamResponse,
        "chat.completion.chunk": ChatCompletionStreamResponse,
        "message": AnthropicMessagesResponse,
        "response": ResponsesResponse,
        # vLLM's alias leaves out the text events its streaming_events.py sends: openai's
        "response.event": StreamingResponsesResponse
        | ResponseTextDeltaEvent
        | ResponseTextDoneEvent,
    }
    adapters = {kind: TypeAdapter(cls) for kind, cls in classes.items()}
    out: list[list[Any]] = []
    for kind, body in json.load(sys.stdin):
        try:
            parsed = adapters[kind].validate_python(body)
        except ValidationError as exc:
            out.append([None, str(exc)])
            continue
        holder = getattr(parsed, "response", parsed)  # a response event's response
        out.append([getattr(holder, "kv_transfer_params", None), None])
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
