"""Run under the peer-libraries venv: chat request bodies rendered and tokenized as vLLM's
OpenAI server does (its request class, its message parser, its template call into
transformers), for a tokenizer and template given as files. Exit 3 when a module is missing.

    python peer_chat_render.py SPEC.json   # prints [{"text", "ids"} | {"error"}, ...]

SPEC: {"tokenizer_json": PATH, "special_tokens": {...}, "template": STR, "bodies": [...]}, and
``"anthropic": true`` for bodies that are Anthropic Messages requests, converted first as
vLLM's ``/v1/messages`` converts them (``to_chat_completion_request``, with the inline-system
merge vLLM decides for the template), or ``"responses": true`` for OpenAI Responses requests,
converted as vLLM's ``/v1/responses`` converts them (its input messages, tool dicts and chat
parameters). vLLM's ``ModelConfig`` is the one stand-in: the two attributes text-only parsing
reads.
"""

from __future__ import annotations

import json
import sys
import types
import warnings
from typing import Any


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    warnings.simplefilter("ignore")
    try:
        from transformers import PreTrainedTokenizerFast
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.renderers.chat_utils.chat_message import parse_chat_messages
        from vllm.renderers.hf import safe_apply_chat_template
    except ImportError as exc:
        print(exc, file=sys.stderr)
        sys.exit(3)
    tok = PreTrainedTokenizerFast(tokenizer_file=spec["tokenizer_json"], **spec["special_tokens"])
    template = spec["template"]
    model_config = types.SimpleNamespace(multimodal_config=None, enable_prompt_embeds=False)
    convert = _anthropic(template) if spec.get("anthropic") else ChatCompletionRequest
    out: list[dict[str, Any]] = []
    for body in spec["bodies"]:
        try:
            if spec.get("responses"):
                messages, tools, params = _responses(body, template)
            else:
                req = convert(**body)
                params = req.build_chat_params(template, "string")
                messages = req.messages
                tools = None if req.tools is None else [t.model_dump() for t in req.tools]
            conv, _, _ = parse_chat_messages(messages, model_config, "string")
            kwargs = dict(params.chat_template_kwargs)
            text = safe_apply_chat_template(
                model_config, tok, conv, tools=tools, chat_template=template, tokenize=False,
                **kwargs,
            )  # fmt: skip
            ids = tok.encode(text, add_special_tokens=False)
            out.append({"text": text, "ids": ids})
        except Exception as exc:  # a request vLLM refuses: the reason, for the test's message
            out.append({"error": f"{type(exc).__name__}: {exc}"[:300]})
    json.dump(out, sys.stdout)


def _anthropic(template: str) -> Any:
    """A Messages request body -> vLLM's chat request of it."""
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages as Serving

    merge = Serving._detect_merge_inline_system(template)

    def convert(**body: Any) -> Any:
        request = AnthropicMessagesRequest.model_validate(body)
        return Serving.to_chat_completion_request(request, merge_inline_system=merge)

    return convert


def _responses(body: dict[str, Any], template: str) -> tuple[Any, Any, Any]:
    """A Responses request body -> the messages, tools and chat parameters vLLM renders it
    with (``OnlineRenderer.render_responses``, no previous response)."""
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.openai.responses.utils import (
        construct_input_messages,
        construct_tool_dicts,
    )

    req = ResponsesRequest(**body)
    tools = construct_tool_dicts(req.tools, req.tool_choice)
    messages = construct_input_messages(
        request_instructions=req.instructions, request_input=req.input
    )
    return messages, tools, req.build_chat_params(template, "string")


if __name__ == "__main__":
    main()
