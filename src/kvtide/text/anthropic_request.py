"""An Anthropic Messages request (``POST /v1/messages``) as the OpenAI chat request vLLM makes of
it before rendering.

vLLM serves Anthropic's API by converting each request to a chat completion request
(``vllm/entrypoints/anthropic/serving.py``, ``to_chat_completion_request``, vLLM 0.33) and
rendering that with the chat template: a prefix-aware gateway must convert as it does, or it
hashes another prompt than the engine caches. What the conversion does, and this module with
it:

- ``system`` (a string, or text blocks joined with nothing between) becomes one leading system
  message; a text block opening with ``x-anthropic-billing-header`` (Claude Code's
  attribution, a hash per request) is dropped, so that it does not defeat the prefix cache.
- A message's text blocks become its content (one text block: a string; more, or an image: a
  list of parts), ``thinking`` blocks its ``reasoning``, ``tool_use`` blocks its
  ``tool_calls`` (the input as JSON text), a user's ``tool_result`` blocks ``tool`` messages
  placed before it (their text parts joined with newlines; images as a user message of image
  parts after them), an assistant's ``tool_result`` a text part ``Tool result: ...``. A user
  message left with no content is dropped; an assistant's stays, without content.
- A ``system`` message inside ``messages`` (Claude Code's reminders) stays where it is, unless
  the chat template refuses a system message after the first (``merge_inline_system``): then
  its text joins the leading system prompt, as vLLM decides by rendering a probe
  conversation with the template (``template_merges_inline_system``).
- ``tools`` become function tools (``input_schema`` as ``parameters``), after the
  ``tool_addition`` and ``tool_removal`` blocks of the messages are applied in order;
  ``tool_choice`` maps (``any`` is ``required``); ``chat_template_kwargs`` and ``cache_salt``
  pass; ``max_tokens`` is also ``max_completion_tokens``.

Not modelled, as in ``chat_request``: ``thinking`` and ``output_config.effort``
(``reasoning_effort``), which the gateway does not render.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

from kvtide.errors import RequestError

BILLING_HEADER = "x-anthropic-billing-header"
"""Claude Code's attribution block, per request: left out of the prompt, as vLLM does."""

_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


def chat_body(body: Mapping[str, Any], merge_inline_system: bool = False) -> dict[str, Any]:
    """``body`` (a Messages request) as the chat request vLLM renders: ``messages``,
    ``tools`` and ``tool_choice`` where set, ``chat_template_kwargs``, ``max_tokens``.
    Raises ``RequestError`` naming the field that is wrong."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise RequestError("'messages' must be an array", "messages")
    checked = [_message(m, i) for i, m in enumerate(messages)]
    out: list[dict[str, Any]] = []
    system = _system_parts(body.get("system"))
    if merge_inline_system:
        for m in checked:
            if m["role"] == "system":
                text = _system_text(m["content"], "messages")
                if text:
                    system.append(text)
    if system:
        out.append({"role": "system", "content": "".join(system)})
    for m in checked:
        role, content = m["role"], m["content"]
        if role == "system":
            text = None if merge_inline_system else _system_text(content, "messages")
            if text:
                out.append({"role": "system", "content": text})
            continue
        message: dict[str, Any] = {"role": role}
        if isinstance(content, str):
            message["content"] = content
        else:
            _blocks(content, role, message, out)
        if not (role == "user" and "content" not in message):
            out.append(message)
    chat: dict[str, Any] = {"messages": out}
    max_tokens = body.get("max_tokens")
    if max_tokens is not None:
        chat["max_tokens"] = chat["max_completion_tokens"] = max_tokens
    if body.get("chat_template_kwargs") is not None:
        chat["chat_template_kwargs"] = body["chat_template_kwargs"]
    choice = body.get("tool_choice")
    if choice is not None:
        chat["tool_choice"] = _tool_choice(choice)
    tools = _resolved_tools(body.get("tools"), checked)
    if tools is not None:
        chat["tools"] = [_tool(t, i) for i, t in enumerate(tools)]
        chat.setdefault("tool_choice", "auto")
    return chat


def template_merges_inline_system(template: str | None) -> bool:
    """Whether vLLM merges the inline system messages of a Messages request into the leading
    one for this chat template: a template that fails to render [system, user, system,
    user] (Qwen's ``loop.first`` guard raising), or no template at all. The same probe as
    vLLM's, in a bare sandbox (no ``raise_exception``: calling it fails the render too)."""
    if not template:
        return True
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    probe = [
        {"role": "system", "content": "t"},
        {"role": "user", "content": "t"},
        {"role": "system", "content": "t"},
        {"role": "user", "content": "t"},
    ]
    try:
        env.from_string(template).render(messages=probe, add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    return False


def _message(m: object, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise RequestError(f"'{where}' must be an object", where)
    role = m.get("role")
    if role not in ("user", "assistant", "system"):
        raise RequestError(f"'{where}.role' must be user, assistant or system", f"{where}.role")
    content = m.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise RequestError(
            f"'{where}.content' must be a string or an array of content blocks",
            f"{where}.content",
        )
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise RequestError(
                f"'{where}.content[{j}]' must be a content block with a 'type'",
                f"{where}.content[{j}]",
            )
    return {"role": role, "content": content}


def _system_parts(system: object) -> list[str]:
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [system]
    if not isinstance(system, list):
        raise RequestError("'system' must be a string or an array of text blocks", "system")
    parts = []
    for j, block in enumerate(system):
        if not isinstance(block, dict):
            raise RequestError(f"'system[{j}]' must be a content block", f"system[{j}]")
        text = _text(block, f"system[{j}]")
        if block.get("type") == "text" and text and not text.startswith(BILLING_HEADER):
            parts.append(text)
    return parts


def _system_text(content: str | list[dict[str, Any]], where: str) -> str | None:
    """An inline system message's text, its billing header left out."""
    if isinstance(content, str):
        return None if content.startswith(BILLING_HEADER) else content
    parts = []
    for block in content:
        text = _text(block, where)
        if block["type"] == "text" and text and not text.startswith(BILLING_HEADER):
            parts.append(text)
    return "".join(parts) if parts else None


def _text(block: Mapping[str, Any], where: str) -> str | None:
    text = block.get("text")
    if text is not None and not isinstance(text, str):
        raise RequestError(f"'{where}.text' must be a string", where)
    return text


def _blocks(
    blocks: list[dict[str, Any]], role: str, message: dict[str, Any], out: list[dict[str, Any]]
) -> None:
    """A message's content blocks into ``message`` (a user's tool results into ``out``,
    ahead of it)."""
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in blocks:
        kind = block["type"]
        if kind == "text":
            text = _text(block, "text block")
            if text:
                parts.append({"type": "text", "text": text})
        elif kind == "image" and block.get("source"):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(str(block["thinking"]))
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id") or f"call_{int(time.time())}",
                    "type": "function",
                    "function": {
                        "name": block.get("name") or "",
                        "arguments": json.dumps(block.get("input") or {}),
                    },
                }
            )
        elif kind == "tool_result":
            if role == "user":
                _tool_result(block, out)
            else:
                result = str(block["content"]) if block.get("content") else ""
                parts.append({"type": "text", "text": f"Tool result: {result}"})
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    if parts:
        one_text = len(parts) == 1 and parts[0]["type"] == "text"
        message["content"] = parts[0]["text"] if one_text else parts


def _tool_result(block: Mapping[str, Any], out: list[dict[str, Any]]) -> None:
    content = block.get("content")
    text, images, references = "", [], []
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for item in content:
            if not isinstance(item, dict):
                continue
            kind = item.get("type")
            if kind == "text":
                texts.append(str(item.get("text", "")))
            elif kind == "image":
                url = _image_url(item.get("source") or {})
                if url:
                    images.append(url)
            elif kind == "tool_reference":
                name = item.get("tool_name") or item.get("name")
                if name:
                    references.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    call_id = block.get("tool_use_id") or ""
    out.append({"role": "tool", "tool_call_id": call_id, "content": text or ""})
    if images:
        parts = [{"type": "image_url", "image_url": {"url": url}} for url in images]
        out.append({"role": "user", "content": parts})
    if references:
        out.append({"role": "tool", "tool_call_id": call_id, "content": references})


def _image_url(source: Mapping[str, Any]) -> str:
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _tool_choice(choice: object) -> Any:
    if not isinstance(choice, dict) or choice.get("type") not in (*_TOOL_CHOICE, "tool"):
        raise RequestError(
            "'tool_choice' must be an object of type auto, any, tool or none", "tool_choice"
        )
    if choice["type"] == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return _TOOL_CHOICE[choice["type"]]


def _resolved_tools(tools: object, messages: list[dict[str, Any]]) -> list[Any] | None:
    """The tools in effect at the end of the conversation: ``tools`` with the messages'
    ``tool_addition`` (by reference: no longer deferred; by definition: declared) and
    ``tool_removal`` blocks applied in order."""
    if tools is not None and not isinstance(tools, list):
        raise RequestError("'tools' must be an array", "tools")
    changes = [
        block
        for m in messages
        if not isinstance(m["content"], str)
        for block in m["content"]
        if block["type"] in ("tool_addition", "tool_removal")
    ]
    if not changes:
        return tools
    by_name: dict[str, Any] = {}
    for i, tool in enumerate(tools or []):
        by_name[_tool_name(tool, f"tools[{i}]")] = tool
    removed: set[str] = set()
    for block in changes:
        change = block.get("tool")
        if not isinstance(change, dict):
            raise RequestError(f"a {block['type']} block needs a 'tool' object", "messages")
        if change.get("type") == "tool_definition":
            definition = change.get("definition")
            name = _tool_name(definition, "messages")
            by_name[name] = definition
        else:
            named = change.get("name")
            if not isinstance(named, str) or named not in by_name:
                raise RequestError(
                    f"{block['type']} references tool {named!r}, which is not declared in tools",
                    "messages",
                )
            name = named
            if block["type"] == "tool_addition":
                by_name[name] = {**by_name[name], "defer_loading": None}
        if block["type"] == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    return [tool for name, tool in by_name.items() if name not in removed]


def _tool_name(tool: object, where: str) -> str:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise RequestError(f"'{where}' must be a tool with a string 'name'", where)
    return str(tool["name"])


def _tool(tool: object, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    name = _tool_name(tool, where)
    assert isinstance(tool, dict)
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise RequestError(f"'{where}.input_schema' must be an object", f"{where}.input_schema")
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": tool.get("description"),
            "parameters": schema,
            "strict": tool.get("strict"),
            "defer_loading": tool.get("defer_loading"),
        },
    }
