"""OpenAI Responses requests rendered by kvtide as vLLM renders them, differentially: Codex-
and Agents SDK-shaped conversations (instructions, the whole history sent again each turn,
``input_text`` and ``output_text`` parts, reasoning items with content or only a summary,
function calls under a namespace or not, custom tool calls, their outputs, an assistant
message continued, function, namespace, custom and built-in tools, ``reasoning.effort`` and
``chat_template_kwargs``) through vLLM's own conversion (``construct_input_messages``,
``construct_tool_dicts``, ``ResponsesRequest.build_chat_params``), message parser and template
call (the peer-libraries venv) and through ``kvtide.text.responses_request`` and kvtide's chat
parser. Skipped when that interpreter or a module is absent."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from tests.chat_templates import tool_tokenizer
from tests.integration.test_chat_render_peers import _vllm, _words, compare_with_vllm

from kvtide.errors import RequestError
from kvtide.text import smollm2
from kvtide.text.responses_request import chat_body

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

_PARAMS = {"type": "object", "properties": {"cmd": {"type": "string"}}}


def _tools(rng: random.Random) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = [{"type": "function", "name": "shell", "parameters": _PARAMS}]
    if rng.random() < 0.6:
        tools[0]["description"] = _words(rng, 6)
    if rng.random() < 0.3:
        tools[0]["strict"] = rng.random() < 0.5
    if rng.random() < 0.5:  # Codex's free-form apply_patch
        tools.append({"type": "custom", "name": "apply_patch", "description": _words(rng, 4)})
    if rng.random() < 0.4:
        tools.append(
            {"type": "namespace", "name": "mcp", "description": "servers", "tools": [
                {"type": "function", "name": "fetch", "parameters": _PARAMS},
                {"type": "function", "name": "list", "description": _words(rng, 3)},
            ]}
        )  # fmt: skip
    if rng.random() < 0.3:
        tools.append({"type": "web_search_preview"})
    return tools


def _user(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.3:
        return {"role": "user", "content": _words(rng, 10)}
    parts = [{"type": "input_text", "text": _words(rng, 8)} for _ in range(rng.randint(1, 2))]
    return {"type": "message", "role": "user", "content": parts}


def _reply(rng: random.Random, k: int, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model's output items for one turn, as the client sends them back next turn."""
    items: list[dict[str, Any]] = []
    if rng.random() < 0.4:
        reasoning: dict[str, Any] = {"type": "reasoning", "id": f"rs_{k}", "summary": []}
        if rng.random() < 0.7:
            reasoning["content"] = [{"type": "reasoning_text", "text": _words(rng, 6)}]
        else:
            reasoning["summary"] = [{"type": "summary_text", "text": _words(rng, 4)}]
        items.append(reasoning)
    if rng.random() < 0.6:
        items.append(
            {"type": "message", "id": f"msg_{k}", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": _words(rng, 8), "annotations": []}]}
        )  # fmt: skip
    if len(items) == 2 and rng.random() < 0.4:  # reasoning after the text: it joins it
        items.reverse()
    names = {t.get("name") for t in tools}
    for c in range(rng.choice([0, 0, 1, 2])):
        call_id = f"call_{k}_{c}"
        if "apply_patch" in names and rng.random() < 0.3:
            items.append({"type": "custom_tool_call", "call_id": call_id, "name": "apply_patch",
                          "input": "*** Begin Patch\n" + _words(rng, 5)})  # fmt: skip
        elif "mcp" in names and rng.random() < 0.3:
            items.append({"type": "function_call", "call_id": call_id, "name": "fetch",
                          "namespace": "mcp", "arguments": '{"cmd": "ls"}'})  # fmt: skip
        else:
            items.append({"type": "function_call", "call_id": call_id, "name": "shell",
                          "arguments": '{"cmd": "' + _words(rng, 2) + '"}'})  # fmt: skip
    return items


def _outputs(items: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for item in items:
        if item["type"] == "function_call":
            out.append({"type": "function_call_output", "call_id": item["call_id"],
                        "output": _words(rng, 7)})  # fmt: skip
        elif item["type"] == "custom_tool_call":
            out.append({"type": "custom_tool_call_output", "call_id": item["call_id"],
                        "output": "Done!"})  # fmt: skip
    return out


def _conversations(seed: int, n: int) -> list[dict[str, Any]]:
    """Every request of ``n`` agent sessions, each sending its whole history again."""
    rng = random.Random(seed)
    bodies = []
    for c in range(n):
        base: dict[str, Any] = {"model": "m", "store": False}
        if rng.random() < 0.8:
            base["instructions"] = f"agent {c % 3}: " + _words(rng, 8)
        if rng.random() < 0.8:
            base["tools"] = _tools(rng)
        if rng.random() < 0.4:
            base["reasoning"] = {"effort": rng.choice(["low", "medium", "high", "none"])}
        if rng.random() < 0.3:
            base["chat_template_kwargs"] = {"enable_thinking": rng.random() < 0.5}
        if rng.random() < 0.2:
            base["max_output_tokens"] = 128
        if rng.random() < 0.15:  # a bare string: one user message
            bodies.append({**base, "input": _words(rng, 9)})
            continue
        history: list[dict[str, Any]] = []
        for k in range(rng.randint(1, 4)):
            history.append(_user(rng))
            bodies.append({**base, "input": list(history)})
            reply = _reply(rng, k, base.get("tools", []))
            history += reply
            results = _outputs(reply, rng)
            if results:
                history += results
                bodies.append({**base, "input": list(history)})
        if rng.random() < 0.2:  # an unfinished answer, to be continued
            partial = {
                "type": "message",
                "role": "assistant",
                "status": "incomplete",
                "content": [{"type": "output_text", "text": "Sure, the", "annotations": []}],
            }
            bodies.append({**base, "input": [*history, _user(rng), partial]})
    return bodies


@pytest.mark.parametrize("template", ["tools", "smollm2"])
def test_kvtide_renders_responses_requests_as_vllm(template: str, tmp_path: Path) -> None:
    tok = tool_tokenizer() if template == "tools" else smollm2()
    assert tok.chat_template is not None
    bodies = _conversations(seed=7, n=40)
    expected = _vllm(tok, tok.chat_template.source, bodies, tmp_path, responses=True)
    assert not [w for w in expected if "error" in w]  # every case reached the template
    assert compare_with_vllm(tok, bodies, expected, chat_body) == len(bodies)
    joined = "".join(w["text"] for w in expected)
    if template == "tools":  # what each kind of item and tool put into the prompt
        pieces = (
            "Tools:",
            '"name": "mcp__fetch"',
            '"name": "apply_patch"',
            "<call>shell ",
            "<call>mcp__fetch ",
            '<call>apply_patch {"input": "*** Begin Patch',
            "<think>",
            "[call_",
        )
        for piece in pieces:  # fmt: skip
            assert piece in joined, piece
        assert "web_search" not in joined
    assert any(not w["text"].rstrip().endswith("assistant") for w in expected)  # continued


def test_what_vllm_refuses_kvtide_refuses() -> None:
    """Encrypted reasoning and unknown item types are 400s naming ``input`` in vLLM."""
    for item in (
        {"type": "reasoning", "id": "r", "summary": [], "encrypted_content": "gAAA"},
        {"type": "item_reference", "id": "msg_1"},
    ):
        with pytest.raises(RequestError) as err:
            chat_body({"input": [{"role": "user", "content": "hi"}, item]})
        assert err.value.param == "input"
    with pytest.raises(RequestError) as err:
        chat_body({"input": 3})
    assert err.value.param == "input"
