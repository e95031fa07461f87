"""Chat templates rendered as ``transformers`` renders them, so a prompt is byte-identical.

The environment follows ``transformers.utils.chat_template_utils``: an immutable sandbox with
``trim_blocks`` and ``lstrip_blocks``, the loop-controls extension, ``raise_exception``, a
``tojson`` that does not escape HTML, ``strftime_now``; the special tokens (``bos_token``,
``eos_token``, ...), ``add_generation_prompt``, ``tools`` and ``documents`` are template
variables; ``continue_final_message`` cuts the text after the last message's content, and a
message's reasoning is also given under the names templates read, as transformers does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvtide.errors import ConfigError

Message = Mapping[str, Any]


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


# types whose every instance answers the sandbox's checks alike: its answer depends only on
# isinstance tests, which for these (builtins and jinja's loop) follow ``type(obj)`` exactly
_PLAIN_TYPES = frozenset({LoopContext, dict, list, tuple, str, int, float, bool, type(None)})
_MAX_ANSWERS = 1024


class _Sandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, its attribute check remembered per (type, attribute) for
    ``_PLAIN_TYPES``. The check runs on every ``loop.first`` and ``message.content``: a dozen
    ``isinstance`` tests against ABCs each time, half of a long conversation's render."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._answers: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        kind = type(obj)
        if kind not in _PLAIN_TYPES:
            return super().is_safe_attribute(obj, attr, value)
        key = (kind, attr)
        answer = self._answers.get(key)
        if answer is None:
            answer = super().is_safe_attribute(obj, attr, value)
            if len(self._answers) < _MAX_ANSWERS:  # the template's names, or a key from data
                self._answers[key] = answer
        return answer


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"chat template line {exc.lineno}: {exc.message}") from exc


class ChatTemplate:
    """A compiled template plus the special tokens it sees as variables."""

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        self.source = source
        self._template = _compile(source)
        self._special_tokens = dict(special_tokens)

    def render(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        continue_final_message: bool = False,
        **variables: Any,
    ) -> str:
        """The prompt text; ConfigError when the template raises (``raise_exception``) or fails.

        ``continue_final_message``: the text ends where the last message's content does (no
        end-of-turn after it), found as transformers finds it, by a tag appended to the
        content before rendering."""
        chat = [_aliased(m) for m in messages]
        final = ""
        if continue_final_message:
            content = chat[-1].get("content") if chat else None
            if not isinstance(content, str):
                raise ConfigError("continue_final_message: the final message has no text")
            final = content
            chat[-1]["content"] = final + _CONTINUE_TAG
        try:
            text: str = self._template.render(
                messages=chat,
                tools=None if tools is None else list(tools),
                documents=None if documents is None else list(documents),
                add_generation_prompt=add_generation_prompt,
                **{**self._special_tokens, **variables},
            )
        except jinja2.TemplateError as exc:
            raise ConfigError(f"chat template: {exc}") from exc
        if not continue_final_message:
            return text
        tag = _CONTINUE_TAG.strip()
        if final.strip() not in text or tag not in text:
            raise ConfigError(
                "continue_final_message: the template dropped part of the final message"
            )
        at = text.rindex(tag)
        if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
            return text[:at]
        return text[:at].rstrip()  # the template trimmed the content's trailing space


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def _aliased(message: Message) -> dict[str, Any]:
    """A copy of ``message``; its reasoning, under whichever name it came, also as
    ``reasoning_content`` and ``thinking`` (the names templates read), as transformers does."""
    if len(message) <= 2 and "role" in message and "content" in message:  # the common one
        return dict(message)
    for key in _REASONING_KEYS:
        reasoning = message.get(key)
        if reasoning is not None:
            return {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return dict(message)
