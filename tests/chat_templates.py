"""A tool-aware chat template for tests, written for kvtide (ChatML markup, as SmolLM2's):
tools and documents in the system prompt, an assistant's tool calls with their arguments as
JSON, a tool result's call id, a message's name, its reasoning under ``enable_thinking`` (a
``chat_template_kwargs`` variable). SmolLM2's own template renders role and content only, so
it cannot tell whether the rest reached the template."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import tokenizers
import tokenizers.processors

from kvtide.text import ChatTemplate, Tokenizer, smollm2

TOOL_TEMPLATE = (
    "{%- if tools or documents %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{%- if tools %}{{- 'Tools:\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}{%- endif %}"
    "{%- if documents %}{{- 'Documents:\\n' }}"
    "{%- for doc in documents %}{{- doc | tojson }}{{- '\\n' }}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] }}"
    "{%- if message.name %}{{- ' name=' + message.name }}{%- endif %}"
    "{{- '\\n' }}"
    "{%- if enable_thinking and message.reasoning_content %}"
    "{{- '<think>' + message.reasoning_content + '</think>\\n' }}{%- endif %}"
    "{{- message['content'] }}"
    "{%- for call in message.tool_calls or [] %}"
    "{{- '\\n<call>' + call.function.name + ' ' }}{{- call.function.arguments | tojson }}"
    "{{- '</call>' }}{%- endfor %}"
    "{%- if message['role'] == 'tool' %}{{- ' [' + message.tool_call_id | string + ']' }}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking %}{{- '<think>' }}{%- endif %}{%- endif %}"
)


def tool_tokenizer() -> Tokenizer:
    """SmolLM2's tokenizer with ``TOOL_TEMPLATE`` as its chat template."""
    tok = copy.copy(smollm2())
    tok.chat_template = ChatTemplate(TOOL_TEMPLATE, tok.special_tokens)
    return tok


def _backend(bos: bool) -> tokenizers.Tokenizer:
    """SmolLM2's vocabulary; with ``bos``, a BOS added to every encoding (as Llama's
    tokenizers do; SmolLM2's adds nothing)."""
    tok = smollm2()
    backend = tokenizers.Tokenizer.from_str(tok.backend.to_str())
    if bos:
        start = tok.special_tokens["bos_token"]
        backend.post_processor = tokenizers.processors.TemplateProcessing(
            single=f"{start} $A", special_tokens=[(start, backend.token_to_id(start))]
        )
    return backend


def bos_tokenizer() -> Tokenizer:
    """SmolLM2's tokenizer adding a BOS to every encoding."""
    base = smollm2()
    return Tokenizer(_backend(bos=True), base.special_tokens)


def write_tokenizer_dir(root: Path, bos: bool = False) -> Path:
    """A tokenizer directory (``tokenizer.json``, ``tokenizer_config.json``) of SmolLM2's
    vocabulary with ``TOOL_TEMPLATE``, for ``--tokenizer DIR`` of both servers."""
    root.mkdir()
    (root / "tokenizer.json").write_text(_backend(bos).to_str())
    config = {**smollm2().special_tokens, "chat_template": TOOL_TEMPLATE}
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root
