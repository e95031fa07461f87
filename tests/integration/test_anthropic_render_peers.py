"""Anthropic Messages requests rendered by kvtide as vLLM renders them, differentially: Claude
Code-like agent conversations (system blocks with the billing header, inline system reminders,
text, thinking and tool_use blocks, tool results as strings and as parts, an assistant's tool
result, tools added and removed mid-conversation, ``chat_template_kwargs``) through vLLM's own
``/v1/messages`` conversion, request class, message parser and template call (the
peer-libraries venv) and through ``kvtide.text.anthropic_request`` and kvtide's chat parser.
Skipped when that interpreter or a module is absent."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pytest
from tests.chat_templates import tool_tokenizer
from tests.integration.test_chat_render_peers import _vllm, _words, compare_with_vllm

from kvtide.text import ChatTemplate, Tokenizer, smollm2
from kvtide.text.anthropic_request import (
    BILLING_HEADER,
    chat_body,
    template_merges_inline_system,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _tool(rng: random.Random, i: int) -> dict[str, Any]:
    tool: dict[str, Any] = {
        "name": f"tool_{i}",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
    if rng.random() < 0.7:
        tool["description"] = _words(rng, 8)
    if rng.random() < 0.3:
        tool["defer_loading"] = rng.random() < 0.5
    return tool


def _blocks(rng: random.Random, n: int) -> Any:
    if rng.random() < 0.4:
        return _words(rng, 12)
    return [{"type": "text", "text": _words(rng, 6)} for _ in range(rng.randint(1, n))]


def _turn(rng: random.Random, k: int, tools: int) -> list[dict[str, Any]]:
    """A user message (perhaps with the results of the last turn's calls), an assistant
    reply (perhaps thinking, perhaps calling a tool)."""
    user = {"role": "user", "content": _blocks(rng, 2)}
    reply: list[dict[str, Any]] = []
    if rng.random() < 0.3:
        reply.append({"type": "thinking", "thinking": _words(rng, 5), "signature": "s"})
    if rng.random() < 0.6:
        reply.append({"type": "text", "text": _words(rng, 8)})
    if tools and rng.random() < 0.5:
        reply.append(
            {"type": "tool_use", "id": f"toolu_{k}", "name": "tool_0",
             "input": {"q": _words(rng, 3), "n": k}}
        )  # fmt: skip
    if rng.random() < 0.1:
        reply.append({"type": "tool_result", "tool_use_id": "x", "content": "inline"})
    return [user, {"role": "assistant", "content": reply or _words(rng, 4)}]


def _results(rng: random.Random, k: int) -> dict[str, Any]:
    """The user's turn after a tool call: its result, then perhaps more text."""
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": f"toolu_{k}"}
    result["content"] = rng.choice(
        [_words(rng, 6), [{"type": "text", "text": _words(rng, 4)} for _ in range(2)], ""]
    )
    blocks = [result]
    if rng.random() < 0.5:
        blocks.append({"type": "text", "text": _words(rng, 5)})
    return {"role": "user", "content": blocks}


def _conversations(seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    bodies = []
    for c in range(n):
        base: dict[str, Any] = {"model": "m", "max_tokens": 64}
        tools = rng.randint(0, 2)
        if tools:
            base["tools"] = [_tool(rng, i) for i in range(tools)]
        system: Any = f"agent {c % 3}: " + _words(rng, 6)
        if rng.random() < 0.5:  # Claude Code: its attribution block, then the prompt
            system = [
                {"type": "text", "text": f"{BILLING_HEADER}: cc_version=1; cch={rng.random()}"},
                {"type": "text", "text": system},
                {"type": "text", "text": " More rules."},
            ]
        base["system"] = system
        if rng.random() < 0.3:
            base["chat_template_kwargs"] = {"enable_thinking": rng.random() < 0.5}
        history: list[dict[str, Any]] = []
        for k in range(rng.randint(1, 4)):
            user, reply = _turn(rng, k, tools)
            if rng.random() < 0.2:  # a per-turn reminder, as Claude Code sends
                history.append({"role": "system", "content": "<reminder>" + _words(rng, 3)})
            bodies.append({**base, "messages": [*history, user]})
            history += [user, reply]
            uses = [b for b in reply["content"] if isinstance(reply["content"], list)]
            if any(b.get("type") == "tool_use" for b in uses):
                history.append(_results(rng, k))
                bodies.append({**base, "messages": list(history)})
        if tools and rng.random() < 0.3:  # a tool withdrawn, another defined, mid-way
            change = {"role": "user", "content": [
                {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "tool_0"}},
                {"type": "tool_addition", "tool": {"type": "tool_definition",
                                                   "definition": _tool(rng, 7)}},
                {"type": "text", "text": "carry on"},
            ]}  # fmt: skip
            bodies.append({**base, "messages": [*history, change]})
    return bodies


GUARD = (
    "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}{% endfor %}"
)
"""Qwen's guard: a system message after the first is refused (vLLM then merges them)."""


def _tokenizer(template: str) -> Tokenizer:
    if template == "tools":
        return tool_tokenizer()
    tok = smollm2()
    if template == "guarded":
        tok = copy.copy(tok)
        assert tok.chat_template is not None
        tok.chat_template = ChatTemplate(GUARD + tok.chat_template.source, tok.special_tokens)
    return tok


@pytest.mark.parametrize("template", ["tools", "smollm2", "guarded"])
def test_kvtide_renders_messages_requests_as_vllm(template: str, tmp_path: Path) -> None:
    tok = _tokenizer(template)
    assert tok.chat_template is not None
    source = tok.chat_template.source
    merge = template_merges_inline_system(source)
    assert merge == (template == "guarded")
    bodies = _conversations(seed=5, n=40)
    expected = _vllm(tok, source, bodies, tmp_path, anthropic=True)
    rendered = compare_with_vllm(tok, bodies, expected, lambda body: chat_body(body, merge))
    assert rendered >= len(bodies) * 0.9
    joined = "".join(w.get("text", "") for w in expected)
    assert BILLING_HEADER not in joined and "<reminder>" in joined
    if template == "tools":
        for piece in ("Tools:", '<call>tool_0 {"q"', "<think>", "Tool result: inline"):
            assert piece in joined, piece


def test_the_inline_system_merge_follows_the_template() -> None:
    """vLLM merges inline system messages for a template that refuses a system message
    after the first (Qwen's guard), or for none; kvtide's probe agrees."""
    assert template_merges_inline_system(GUARD + "{{ messages[0].content }}")
    assert template_merges_inline_system(None)
    assert not template_merges_inline_system("{% for m in messages %}{{ m.content }}{% endfor %}")
    body = {
        "system": "S",
        "messages": [
            {"role": "user", "content": "u1"},
            {"role": "system", "content": "R"},
            {"role": "user", "content": "u2"},
        ],
    }
    merged = chat_body(body, merge_inline_system=True)["messages"]
    kept = chat_body(body, merge_inline_system=False)["messages"]
    assert merged == [
        {"role": "system", "content": "SR"},
        {"role": "user", "content": "u1"},
        {"role": "user", "content": "u2"},
    ]
    assert kept[2] == {"role": "system", "content": "R"} and kept[0]["content"] == "S"
