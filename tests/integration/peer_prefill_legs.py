"""Run under the peer-libraries venv: vLLM's own request classes for the four generating APIs,
asked to read each body from stdin (JSON ``[[api, body], ...]``, api one of ``completions``,
``chat``, ``messages``, ``responses``) as its server does: validated, its output-token limit
chosen as the server chooses it (``get_max_tokens`` over a 4,096-token context for a
10-token prompt), then turned into ``SamplingParams`` where the request class does that
itself. Prints ``[[{stream, max_tokens, min_tokens, kv_transfer_params}, error], ...]``; exit
3 when vLLM's modules are missing.

    echo '[["chat", {"model": "m", "messages": []}]]' | python peer_prefill_legs.py
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> int:
    try:
        from pydantic import ValidationError
        from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
        from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
        from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
    except ImportError as exc:
        print(exc, file=sys.stderr)
        return 3

    def limit(asked: int | None) -> int:
        return get_max_tokens(4096, asked, 10, {})

    out: list[list[Any]] = []
    for api, body in json.load(sys.stdin):
        try:
            if api == "completions":
                completion = CompletionRequest.model_validate(body)
                params = completion.to_sampling_params(limit(completion.max_tokens))
                stream = completion.stream
            elif api == "chat":
                chat = ChatCompletionRequest.model_validate(body)
                asked = chat.max_completion_tokens
                params = chat.to_sampling_params(
                    limit(asked if asked is not None else chat.max_tokens), {}
                )
                stream = chat.stream
            elif api == "responses":
                responses = ResponsesRequest.model_validate(body)
                params = responses.to_sampling_params(limit(None), {})
                stream = responses.stream
            elif api == "messages":
                # vLLM's Messages server turns the request into a chat completion carrying
                # these same fields: read them from the validated request
                messages = AnthropicMessagesRequest.model_validate(body)
                out.append(
                    [
                        {
                            "stream": messages.stream,
                            "max_tokens": messages.max_tokens,
                            "min_tokens": 0,
                            "kv_transfer_params": messages.kv_transfer_params,
                        },
                        None,
                    ]
                )
                continue
            else:
                raise SystemExit(f"no vLLM class named for {api}")
        except (ValidationError, ValueError) as exc:
            out.append([None, str(exc)])
            continue
        extra = params.extra_args or {}
        out.append(
            [
                {
                    "stream": stream,
                    "max_tokens": params.max_tokens,
                    "min_tokens": params.min_tokens,
                    "kv_transfer_params": extra.get("kv_transfer_params"),
                },
                None,
            ]
        )
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
