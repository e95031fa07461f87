"""A chat request's template inputs as vLLM builds them (the differential test against vLLM
itself is tests/integration/test_chat_render_peers.py): what each message keeps, tool calls'
arguments, the request's tools, the flags, and every refusal naming its field."""

from __future__ import annotations

from typing import Any

import pytest
from tests.chat_templates import tool_tokenizer

from kvtide.errors import ConfigError, RequestError
from kvtide.text import ChatTemplate
from kvtide.text.chat_request import parse_chat_request


def _one(message: dict[str, Any], media: str = "refuse") -> dict[str, Any]:
    return parse_chat_request({"messages": [message]}, media=media).messages[0]  # type: ignore[arg-type]


def test_messages_keep_what_vllm_keeps() -> None:
    parts = [
        {"type": "text", "text": "a"},
        "b",
        {"type": "input_text", "text": "c"},
        {"type": "text", "text": None},
        {"type": "refusal", "refusal": "no"},
    ]
    assert _one({"role": "user", "content": parts, "extra": 1}) == {
        "role": "user",
        "content": "a\nb\nc\nno",
    }
    assert _one({"role": "assistant", "content": None}) == {"role": "assistant", "content": ""}
    assert _one({"role": "user", "content": "x", "name": "ana", "tool_call_id": "t"}) == {
        "role": "user",
        "content": "x",
        "name": "ana",
    }
    assert _one({"role": "tool", "content": "r", "tool_call_id": "c1"})["tool_call_id"] == "c1"
    reasoned = _one({"role": "assistant", "content": "x", "reasoning": "why"})
    assert reasoned["reasoning"] == reasoned["reasoning_content"] == "why"
    old_name = _one({"role": "assistant", "content": "x", "reasoning_content": "why"})
    assert old_name["reasoning"] == "why"
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    assert _one({"role": "user", "content": [image, "caption"]}, "skip")["content"] == "caption"
    with pytest.raises(RequestError) as err:
        _one({"role": "user", "content": [image]})
    assert err.value.param == "messages[0].content"


@pytest.mark.parametrize(
    ("arguments", "parsed"),
    [
        ('{"q": 1}', {"q": 1}),
        ('{"q": ', {}),  # malformed: the conversation goes on with {}
        ("[1]", {}),  # JSON, not an object
        ("", {}),
        (None, {}),
        ({"q": 2}, {"q": 2}),
    ],
)
def test_tool_call_arguments_become_objects(arguments: object, parsed: dict) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    msg = _one({"role": "assistant", "content": None, "tool_calls": [call]})
    assert msg["tool_calls"] == [{**call, "function": {"name": "f", "arguments": parsed}}]
    assert call["function"]["arguments"] is arguments  # the client's body is not touched


def test_an_empty_tool_call_list_is_dropped() -> None:
    assert "tool_calls" not in _one({"role": "assistant", "content": "x", "tool_calls": []})


def test_tools_as_vllm_dumps_them() -> None:
    tools = [
        {"type": "function", "function": {"name": "f"}, "extra": 1},
        {"function": {"name": "g", "description": "d", "parameters": {}, "strict": True}},
        {"type": "function", "function": {"name": "h"}, "defer_loading": True},
    ]
    req = parse_chat_request({"messages": [{"role": "user", "content": "x"}], "tools": tools})
    assert req.variables["tools"] == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": None}},
        {
            "type": "function",
            "function": {"name": "g", "description": "d", "parameters": {}, "strict": True},
        },
        {
            "type": "function",
            "function": {
                "name": "h",
                "description": None,
                "parameters": None,
                "defer_loading": True,
            },
            "defer_loading": True,
        },
    ]


def test_flags_and_template_kwargs() -> None:
    user = [{"role": "user", "content": "x"}]
    req = parse_chat_request({"messages": user})
    assert req.add_generation_prompt and not req.variables
    req = parse_chat_request(
        {
            "messages": [*user, {"role": "assistant", "content": "Sure,"}],
            "add_generation_prompt": False,
            "continue_final_message": True,
            "chat_template_kwargs": {"enable_thinking": True, "add_generation_prompt": True},
            "documents": [{"title": "t", "text": "d"}],
        }
    )
    # the request's own add_generation_prompt wins over chat_template_kwargs', as in vLLM
    assert not req.add_generation_prompt and req.continue_final_message
    assert req.variables == {
        "enable_thinking": True,
        "documents": [{"title": "t", "text": "d"}],
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [3]}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
            "messages[0].content",
        ),
        (
            {"messages": [{"role": "assistant", "content": "", "tool_calls": {}}]},
            "messages[0].tool_calls",
        ),
        (
            {"messages": [{"role": "assistant", "content": "", "tool_calls": ["f"]}]},
            "messages[0].tool_calls[0]",
        ),
        (
            {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": 1}]}]},
            "messages[0].tool_calls[0]",
        ),
        (
            {"messages": [{"role": "assistant", "content": "", "reasoning": 1}]},
            "messages[0].reasoning",
        ),
        ({"add_generation_prompt": "yes"}, "add_generation_prompt"),
        ({"continue_final_message": True}, "continue_final_message"),
        (
            {
                "continue_final_message": True,
                "add_generation_prompt": False,
                "messages": [{"role": "assistant", "content": ""}],
            },
            "continue_final_message",
        ),
        ({"chat_template_kwargs": []}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
        ({"tools": {}}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"tools": [{"function": {}}]}, "tools[0].function"),
        ({"tools": [{"function": {"name": "f", "parameters": "{}"}}]}, "tools[0]"),
        ({"tools": [{"function": {"name": "f", "strict": "yes"}}]}, "tools[0]"),
        ({"documents": ["d"]}, "documents"),
        ({"chat_template_kwargs": {"documents": 5}}, "chat_template_kwargs.documents"),
    ],
)
def test_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    full = {"messages": [{"role": "user", "content": "x"}], **body}
    with pytest.raises(RequestError) as err:
        parse_chat_request(full)
    assert err.value.param == param


def test_continue_final_message_ends_inside_the_last_message() -> None:
    tok = tool_tokenizer()
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer"}]
    body = {"messages": messages, "add_generation_prompt": False, "continue_final_message": True}
    text = parse_chat_request(body).render(tok)
    whole = parse_chat_request({**body, "continue_final_message": False}).render(tok)
    assert text.endswith("<|im_start|>assistant\nThe answer")
    assert whole.startswith(text) and whole[len(text) :] == "<|im_end|>\n"
    # a template that strips the content's trailing space: the cut strips it too
    strip = ChatTemplate("{% for m in messages %}[{{ m['content'] | trim }}]{% endfor %}", {})
    assert strip.render([{"content": "a b "}], continue_final_message=True) == "[a b"
    dropped = ChatTemplate("{% for m in messages %}[{{ m['role'] }}]{% endfor %}", {})
    with pytest.raises(ConfigError, match="continue_final_message"):
        dropped.render([{"role": "user", "content": "x"}], continue_final_message=True)


def test_developer_messages_become_system_ones_for_templates_without_the_role() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "hi"},
            {"role": "developer", "content": "Be terse.", "tools": []},
        ]
    }
    req = parse_chat_request(body)
    plain = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}", {})
    assert req.render(_Renderer(plain), add_generation_prompt=False) == (
        "<system>Be kind.\n\nBe terse.<user>hi"
    )
    knows = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'developer' %}!{% endif %}"
        "<{{ m.role }}>{{ m.content }}{% endfor %}",
        {},
    )
    assert req.render(_Renderer(knows), add_generation_prompt=False) == (
        "<system>Be kind.<user>hi!<developer>Be terse."
    )


class _Renderer:
    """A renderer over one ``ChatTemplate`` (what ``Tokenizer`` does for chats)."""

    def __init__(self, template: ChatTemplate) -> None:
        self.chat_template = template

    def apply_chat_template(
        self, messages: Any, add_generation_prompt: bool = True, **variables: Any
    ) -> str:
        return self.chat_template.render(messages, add_generation_prompt, **variables)


@pytest.mark.parametrize(
    "key",
    ["self", "messages", "tools", "documents", "tokenize", "chat_template", "renderer",
     "add_generation_prompt", "continue_final_message", "args", "kwargs", "bos_token"],
)  # fmt: skip
@pytest.mark.parametrize("value", [1, None, "x", [], {}])
def test_any_template_kwarg_renders_or_is_refused(key: str, value: object) -> None:
    """Keys that are also the renderers' own parameter names (``self`` among them) were
    passed on as keyword arguments: a TypeError, which both servers answered as a 500."""
    body = {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {key: value}}
    try:
        req = parse_chat_request(body)
    except RequestError as exc:
        assert exc.param is not None and exc.param.startswith("chat_template_kwargs")
        return
    assert "<|im_start|>user" in req.render(tool_tokenizer())
