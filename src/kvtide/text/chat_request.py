"""A chat completion request as the engine hands it to its chat template.

vLLM does not render ``messages`` as the client sent them. It rebuilds each message
(``vllm/renderers/chat_utils/chat_message.py``, vLLM 0.33, for templates that take content as
a string): text parts joined with newlines, an assistant's ``tool_calls`` with each
``function.arguments`` parsed from its JSON string into an object, a tool result's
``tool_call_id``, a ``name``, and nothing else the client sent; for a template that never
names the ``developer`` role, developer messages as system messages, merged into one first
system message. The request's ``tools``,
``documents``, ``add_generation_prompt``, ``continue_final_message`` and
``chat_template_kwargs`` are template inputs too: a tool-calling agent's tools are rendered into
its system prompt by most tool-aware templates, ahead of every message.

The gateway must render what the engine renders, or its block hashes name a different prompt
than the engines' KV events do; the emulated engine renders the same way, so both servers
call this one parser. It raises ``RequestError`` naming the field; each server turns that into
its own error body.

Not modelled: images and other media parts (the gateway skips them, the emulated engine
refuses them: their placeholder text depends on the model), vLLM's ``"openai"`` content format
(templates that iterate over content parts), ``reasoning_effort``, and SGLang's rendering where it
differs from vLLM's (its messages are dumped by its own request class, every field present,
unset ones as null; its tools are left out under ``tool_choice: none``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from kvtide.errors import RequestError

TEXT_PART_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}
"""Content part type -> the key holding its text (vLLM's text part types)."""

RESERVED_KWARGS = frozenset({"chat_template", "tokenize", "messages", "tools"})
"""``chat_template_kwargs`` a request may not set: vLLM refuses the first two; the template's
``messages`` and ``tools`` come from the request's own fields."""

MediaParts = Literal["skip", "refuse"]


class ChatRenderer(Protocol):
    """What renders a ``ChatRequest``: ``kvtide.text.Tokenizer``'s chat template."""

    def apply_chat_template(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, **variables: Any
    ) -> str: ...


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """The template's inputs. ``messages`` are plain dicts as vLLM builds them; ``variables``
    are the rest (``tools``, ``documents``, the request's ``chat_template_kwargs``), passed to
    the template as they are."""

    messages: tuple[dict[str, Any], ...]
    add_generation_prompt: bool = True
    variables: Mapping[str, Any] = field(default_factory=dict)
    developer: bool = False
    """Whether a message has the ``developer`` role (rewritten for templates without it)."""
    continue_final_message: bool = False
    """The text ends inside the last message (an assistant prefill the model continues)."""

    def render(
        self,
        renderer: ChatRenderer,
        messages: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool | None = None,
    ) -> str:
        """The prompt text; ``messages`` and ``add_generation_prompt`` replace the request's
        (a conversation's first messages rendered alone, by the gateway's prefix cache: no
        final message of the request's to continue there)."""
        chat = self.messages if messages is None else messages
        if self.developer:
            chat = developer_as_system(chat, getattr(renderer, "chat_template", None))
        if self.continue_final_message and messages is None:
            return renderer.apply_chat_template(
                chat, False, continue_final_message=True, **self.variables
            )
        return renderer.apply_chat_template(
            chat,
            self.add_generation_prompt if add_generation_prompt is None else add_generation_prompt,
            **self.variables,
        )


def parse_chat_request(body: Mapping[str, Any], media: MediaParts = "refuse") -> ChatRequest:
    """``body``'s chat template inputs. ``media``: what a media part (an image) does: the
    gateway skips it (its text still identifies the prefix), the emulated engine refuses it."""
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RequestError("'messages' must be a non-empty array", "messages")
    messages = tuple(
        # the common message, {role, content} strings, as it came (nothing to rebuild)
        m
        if type(m) is dict and len(m) == 2 and type(m.get("content")) is str
        and type(m.get("role")) is str
        else _message(m, f"messages[{i}]", media)
        for i, m in enumerate(raw)
    )  # fmt: skip
    add_generation_prompt = _flag(body, "add_generation_prompt", True)
    continue_final = _flag(body, "continue_final_message", False)
    if add_generation_prompt and continue_final:
        raise RequestError(
            "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true",
            "continue_final_message",
        )
    variables: dict[str, Any] = {}
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise RequestError("'chat_template_kwargs' must be an object", "chat_template_kwargs")
        reserved = sorted(RESERVED_KWARGS & kwargs.keys())
        if reserved:
            raise RequestError(
                f"'chat_template_kwargs' may not set {', '.join(reserved)}",
                "chat_template_kwargs",
            )
        # the request's own fields win, as in vLLM (its merge_kwargs); ``self`` is jinja's
        # own name in a template (no template can read it), and passed on it collided with
        # the renderers' own ``self`` (a TypeError: a 500)
        variables.update(kwargs)
        for key in ("add_generation_prompt", "continue_final_message", "self"):
            variables.pop(key, None)
        if "documents" in variables:
            variables["documents"] = _documents(
                variables["documents"], "chat_template_kwargs.documents"
            )
    tools = _tools(body.get("tools"))
    if tools is not None:
        variables["tools"] = tools
    documents = body.get("documents")
    if documents is not None:
        variables["documents"] = _documents(documents, "documents")
    final = messages[-1].get("content")
    if continue_final and not (isinstance(final, str) and final):
        raise RequestError(
            "'continue_final_message' needs a final message with text to continue",
            "continue_final_message",
        )
    developer = any(m["role"] == "developer" for m in messages)
    return ChatRequest(messages, add_generation_prompt, variables, developer, continue_final)


def developer_as_system(
    messages: Sequence[Mapping[str, Any]], template: object
) -> Sequence[Mapping[str, Any]]:
    """vLLM's rewrite for a template that never names the ``developer`` role (its source has
    no quoted ``developer``): developer messages become system messages (their ``tools``
    dropped), and system messages anywhere but first, or more than one, are merged into one
    first message, their non-empty contents joined by a blank line. ``template``: the
    renderer's ``ChatTemplate`` (its ``source``); unknown, the messages stay as they are."""
    source = getattr(template, "source", None)
    if not isinstance(source, str) or '"developer"' in source or "'developer'" in source:
        return messages
    converted: list[Mapping[str, Any]] = []
    for m in messages:
        if m["role"] == "developer":
            m = {k: v for k, v in m.items() if k != "tools"} | {"role": "system"}
        converted.append(m)
    systems: list[str] = []
    rest: list[Mapping[str, Any]] = []
    merge = False
    for i, m in enumerate(converted):
        if m["role"] != "system":
            rest.append(m)
            continue
        merge = merge or i > 0 or bool(systems)
        if m["content"]:
            systems.append(m["content"])
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(systems)}, *rest]


def _documents(documents: object, param: str) -> list[dict[str, Any]] | None:
    """A template's ``documents``: an array of objects (null: none)."""
    if documents is None:
        return None
    if not isinstance(documents, list) or not all(isinstance(d, dict) for d in documents):
        raise RequestError(f"'{param}' must be an array of objects", param)
    return documents


def _flag(body: Mapping[str, Any], key: str, default: bool) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise RequestError(f"'{key}' must be a boolean", key)
    return v


def _message(m: object, where: str, media: MediaParts) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise RequestError(f"'{where}' must be an object", where)
    role = m.get("role")
    if not isinstance(role, str):
        raise RequestError(f"'{where}.role' must be a string", f"{where}.role")
    content = m.get("content")
    out: dict[str, Any] = {
        "role": role,
        "content": content if isinstance(content, str) else _content(content, where, media),
    }
    if role == "assistant":
        calls = m.get("tool_calls")
        if calls is not None:
            calls = _tool_calls(calls, f"{where}.tool_calls")
            if calls:  # an empty list is dropped: the template takes the plain path
                out["tool_calls"] = calls
        key = "reasoning" if m.get("reasoning") is not None else "reasoning_content"
        reasoning = m.get(key)  # the deprecated name where the new one is absent, as vLLM
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise RequestError(f"'{where}.{key}' must be a string", f"{where}.{key}")
            out["reasoning"] = out["reasoning_content"] = reasoning
    elif role == "tool" and "tool_call_id" in m:
        out["tool_call_id"] = m["tool_call_id"]
    for key in ("name", "task"):
        if isinstance(m.get(key), str):
            out[key] = m[key]
    if role == "developer":
        out["tools"] = m.get("tools")
    return out


def _content(content: object, where: str, media: MediaParts) -> str:
    """A message's content as a string: none is empty, text parts join with newlines."""
    if content is None:
        return ""
    if not isinstance(content, list):
        raise RequestError(
            f"'{where}.content' must be a string or an array of content parts",
            f"{where}.content",
        )
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise RequestError(
                f"'{where}.content' parts must be objects or strings", f"{where}.content"
            )
        kind = part.get("type")
        key = TEXT_PART_KEYS.get(kind) if isinstance(kind, str) else None
        if key is None:
            if media == "skip":
                continue
            raise RequestError(f"'{where}.content' parts must be text parts", f"{where}.content")
        text = part.get(key)
        if text is None:
            continue  # vLLM skips a text part without text
        if not isinstance(text, str):
            raise RequestError(
                f"'{where}.content' text parts need a string '{key}'", f"{where}.content"
            )
        texts.append(text)
    return "\n".join(texts)


def _tool_calls(calls: object, where: str) -> list[dict[str, Any]]:
    """An assistant's calls, each ``function.arguments`` an object as tool-aware templates
    expect (vLLM parses the JSON string; one that is not a JSON object becomes ``{}``, so a
    conversation with a malformed call in its history can go on)."""
    if not isinstance(calls, list):
        raise RequestError(f"'{where}' must be an array", where)
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or call.get("type", "function") != "function":
            raise RequestError(f"'{where}[{i}]' must be a function call object", f"{where}[{i}]")
        if not isinstance(fn, dict):
            raise RequestError(f"'{where}[{i}].function' must be an object", f"{where}[{i}]")
        out.append({**call, "function": {**fn, "arguments": _arguments(fn.get("arguments"))}})
    return out


def _arguments(arguments: object) -> dict[str, Any]:
    if not arguments:
        return {}
    if isinstance(arguments, dict):
        return arguments
    parsed = arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return {}
    return parsed if isinstance(parsed, dict) else {}


def _tools(tools: object) -> list[dict[str, Any]] | None:
    """``tools`` as vLLM hands them to the template (its ``ChatCompletionToolsParam``
    dumped): ``{"type", "function": {"name", "description", "parameters"}}``, absent fields
    as null, ``strict`` and ``defer_loading`` only where set, anything else dropped."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RequestError("'tools' must be an array", "tools")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise RequestError(f"'{where}' must be a function tool object", where)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"'{where}.function' needs a string 'name'", f"{where}.function")
        description, parameters = fn.get("description"), fn.get("parameters")
        if description is not None and not isinstance(description, str):
            raise RequestError(f"'{where}.function.description' must be a string", where)
        if parameters is not None and not isinstance(parameters, dict):
            raise RequestError(f"'{where}.function.parameters' must be an object", where)
        defer = tool.get("defer_loading")
        dumped: dict[str, Any] = {
            "name": fn["name"],
            "description": description,
            "parameters": parameters,
        }
        for key in ("strict", "defer_loading"):
            value = fn.get(key)
            if key == "defer_loading" and value is None:
                value = defer  # the tool's own flag, carried down as vLLM does
            if value is not None:
                if not isinstance(value, bool):
                    raise RequestError(f"'{where}.function.{key}' must be a boolean", where)
                dumped[key] = value
        entry: dict[str, Any] = {"type": "function", "function": dumped}
        if defer is not None:
            if not isinstance(defer, bool):
                raise RequestError(f"'{where}.defer_loading' must be a boolean", where)
            entry["defer_loading"] = defer
        out.append(entry)
    return out
