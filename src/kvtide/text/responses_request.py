"""An OpenAI Responses request (``POST /v1/responses``) as the chat request vLLM renders of it.

Agents built on the Responses API (OpenAI's Codex CLI and Agents SDK among them) talk to vLLM
through ``/v1/responses``, which vLLM turns into chat messages before rendering them with the
chat template (``construct_input_messages``, ``construct_tool_dicts`` and
``ResponsesRequest.build_chat_params`` in ``vllm/entrypoints/openai/responses``, vLLM 0.33,
for templates rendered by jinja; gpt-oss's Harmony path is not modelled). A prefix-aware
gateway must convert as it does, or it hashes another prompt than the engine caches. What the
conversion does, and this module with it:

- ``instructions`` become a leading system message; ``input`` as a string one user message.
- Input items in order: a message (``type: message`` or none) with a role stays as it is
  (its ``input_text`` parts are rendered as text by the chat parser); an assistant's message
  gives its first part's text, joining the assistant message before it where that one has
  no content yet; a ``function_call`` (its name as ``namespace__name`` under a namespace) or
  ``custom_tool_call`` (its input as ``{"input": ...}`` JSON) is a tool call, added to the
  assistant message before it or opening one; a ``reasoning`` item (its first content text,
  else its first summary's) is that message's ``reasoning``, or opens one; a
  ``function_call_output`` or ``custom_tool_call_output`` a ``tool`` message. Encrypted
  reasoning and any other item type are refused, naming ``input``.
- ``tools``: function tools as chat tools; a namespace's function tools flattened to
  ``namespace__name``; a custom tool as a function taking one string ``input``; built-in tools
  (web search, file search, MCP...) are not shown to the model and are dropped.
- The generation prompt is added unless the last item is a message or reasoning item still
  ``in_progress`` or ``incomplete``: then it is continued (``continue_final_message``).
- ``chat_template_kwargs`` pass; ``reasoning.effort`` becomes the template's
  ``reasoning_effort`` and, unless the request sets it, ``enable_thinking`` (false for
  ``none``); ``max_output_tokens`` is the chat request's ``max_tokens``.

Not modelled: ``previous_response_id`` (the conversation it names lives in one engine's
store: the gateway sends such a request to that engine, ``gateway.response_homes``) and
``prompt`` templates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kvtide.errors import RequestError

NAMESPACE_SEPARATOR = "__"
"""vLLM's flat name of a namespace's tool: ``namespace__name``."""

CUSTOM_INPUT_KEY = "input"
"""The one argument of the function a custom (free-form) tool is shown as."""

_CONTINUED = ("in_progress", "incomplete")
_TOOL_CALLS = ("function_call", "custom_tool_call")
_TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output")


def chat_body(body: Mapping[str, Any], history: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """``body`` (a Responses request) as the chat request vLLM renders: ``messages``,
    ``tools`` where any is shown to the model, ``add_generation_prompt`` and
    ``continue_final_message``, ``chat_template_kwargs``, ``max_tokens``. ``history``: the
    stored conversation its ``previous_response_id`` names (``stored_history``), placed
    after the instructions. Raises ``RequestError`` naming the field that is wrong."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError("'instructions' must be a string", "instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    messages.extend(history)
    if "input" not in body:
        raise RequestError("'input' is required", "input")
    items = body["input"]
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        continued = False
    elif isinstance(items, list):
        for i, item in enumerate(items):
            _item(item, f"input[{i}]", messages)
        continued = bool(items) and _continued(items[-1])
    else:
        raise RequestError("'input' must be a string or an array of items", "input")
    if not messages:
        raise RequestError("'input' gives the model no message", "input")
    chat: dict[str, Any] = {
        "messages": messages,
        "add_generation_prompt": not continued,
        "continue_final_message": continued,
    }
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    kwargs = _template_kwargs(body)
    if kwargs:
        chat["chat_template_kwargs"] = kwargs
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    return chat


def stored_history(messages: Sequence[dict[str, Any]], output_text: str) -> list[dict[str, Any]]:
    """What an answer kept in an engine's store puts before a request continuing it: its
    conversation without system messages (instructions do not carry over), then its output
    text as the assistant's message (its reasoning and tool calls are not carried, as in
    vLLM)."""
    kept = [m for m in messages if m.get("role") != "system"]
    if output_text:
        kept.append({"role": "assistant", "content": output_text})
    return kept


def _item(item: object, where: str, out: list[dict[str, Any]]) -> None:
    """Appends ``item`` to ``out`` as vLLM does: a new message, or merged into the
    assistant message before it."""
    if not isinstance(item, dict):
        raise RequestError(f"'{where}' must be an object", where)
    kind = item.get("type", "message")
    last = out[-1] if out and out[-1].get("role") == "assistant" else None
    if kind in _TOOL_CALLS:
        call = _tool_call(item, kind, where)
        if last is None:
            out.append({"role": "assistant", "tool_calls": [call]})
        else:
            last.setdefault("tool_calls", []).append(call)
        return
    if kind == "reasoning":
        reasoning = _reasoning(item, where)
        if last is not None and last.get("reasoning") is None:
            last["reasoning"] = reasoning
        else:
            out.append({"role": "assistant", "reasoning": reasoning})
        return
    if kind in _TOOL_OUTPUTS:
        out.append(
            {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
        )
        return
    role = item.get("role")
    if kind == "message" and role == "assistant":
        text = _assistant_text(item.get("content"), where)
        if text is not None:
            if last is not None and last.get("content") is None:
                last["content"] = text
            else:
                out.append({"role": "assistant", "content": text})
            return
    if "role" in item:
        out.append(item)  # as sent: the chat parser rebuilds it as vLLM's does
        return
    raise RequestError(f"Unsupported input item type: {kind}", "input")


def _tool_call(item: Mapping[str, Any], kind: str, where: str) -> dict[str, Any]:
    call_id, name = item.get("call_id"), item.get("name")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise RequestError(f"'{where}' needs a string 'call_id' and 'name'", where)
    if kind == "custom_tool_call":
        payload = item.get("input") or ""
        arguments = json.dumps({CUSTOM_INPUT_KEY: payload}, ensure_ascii=False)
    else:
        given = item.get("arguments")
        if not isinstance(given, str):
            raise RequestError(f"'{where}.arguments' must be a string", where)
        arguments = given
        namespace = item.get("namespace")
        if namespace:
            name = f"{namespace}{NAMESPACE_SEPARATOR}{name}"
    return {"id": call_id, "function": {"name": name, "arguments": arguments}, "type": "function"}


def _reasoning(item: Mapping[str, Any], where: str) -> str:
    """A reasoning item's text: its first content part's, else its first summary's."""
    if item.get("encrypted_content"):
        raise RequestError("Encrypted content is not supported.", "input")
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list) and parts:
            first = parts[0]
            text = first.get("text") if isinstance(first, dict) else None
            if not isinstance(text, str):
                raise RequestError(f"'{where}.{key}[0].text' must be a string", where)
            return text
    return ""


def _assistant_text(content: object, where: str) -> str | None:
    """The text of an assistant's message: the string, or its first part's text (later parts
    are not rendered, as in vLLM); None where it has none (the message then stays as sent)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        first = content[0]
        text = first.get("text") if isinstance(first, dict) else None
        if text is not None and not isinstance(text, str):
            raise RequestError(f"'{where}.content[0].text' must be a string", where)
        return text
    return None


def _continued(item: object) -> bool:
    """Whether the last input item is a message or reasoning left unfinished, which the
    model then continues (vLLM's ``should_continue_final_message``)."""
    return (
        isinstance(item, dict)
        and item.get("type", "message") in ("message", "reasoning")
        and item.get("status") in _CONTINUED
    )


def _tools(tools: object) -> list[dict[str, Any]]:
    """The tools the model is shown, as chat tools, in request order."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError("'tools' must be an array", "tools")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise RequestError(f"'{where}' must be an object", where)
        kind = tool.get("type")
        if kind == "function":
            out.append(_function(tool, where))
        elif kind == "custom":
            out.append(_function(_custom_as_function(tool, where), where))
        elif kind == "namespace":
            namespace, inner = tool.get("name"), tool.get("tools")
            if not isinstance(namespace, str) or not isinstance(inner, list):
                raise RequestError(f"'{where}' needs a string 'name' and a 'tools' array", where)
            for j, t in enumerate(inner):
                if isinstance(t, dict) and t.get("type") == "function":
                    flat = {**t, "name": f"{namespace}{NAMESPACE_SEPARATOR}{t.get('name')}"}
                    out.append(_function(flat, f"{where}.tools[{j}]"))
        # anything else is a built-in tool the engine runs, if any: never rendered
    return out


def _function(tool: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A flat Responses function tool as the chat tool vLLM renders (the chat parser drops
    what its function definition does not hold)."""
    if not isinstance(tool.get("name"), str):
        raise RequestError(f"'{where}' needs a string 'name'", where)
    function = {k: tool.get(k) for k in ("name", "description", "parameters")}
    for key in ("strict", "defer_loading"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _custom_as_function(tool: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A custom tool as the one-string function vLLM shows the model instead."""
    if not isinstance(tool.get("name"), str):
        raise RequestError(f"'{where}' needs a string 'name'", where)
    parameters = {
        "type": "object",
        "properties": {
            CUSTOM_INPUT_KEY: {
                "type": "string",
                "description": "The freeform text payload for this tool.",
            }
        },
        "required": [CUSTOM_INPUT_KEY],
        "additionalProperties": False,
    }
    return {"name": tool["name"], "description": tool.get("description"), "parameters": parameters}


def _template_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request's ``chat_template_kwargs`` with ``reasoning.effort`` added as vLLM adds it."""
    given = body.get("chat_template_kwargs")
    if given is not None and not isinstance(given, dict):
        raise RequestError("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    kwargs = dict(given or {})
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise RequestError("'reasoning' must be an object", "reasoning")
    effort = (reasoning or {}).get("effort")
    if effort is not None:
        if not isinstance(effort, str):
            raise RequestError("'reasoning.effort' must be a string", "reasoning")
        kwargs["reasoning_effort"] = effort
        if "enable_thinking" not in (given or {}):
            kwargs["enable_thinking"] = effort != "none"
    return kwargs
