"""A tool-aware chat template for tests, written for kvtide (ChatML markup, as SmolLM2's):
tools and documents in the system prompt, an assistant's tool calls with their arguments as
JSON, a tool result's call id, a message's name, its reasoning under ``enable_thinking`` (a
``chat_template_kwargs`` variable). SmolLM2's own template renders role and content only, so
it cannot tell whether the rest reached the template."""

from __future__ import annotations

import copy

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
