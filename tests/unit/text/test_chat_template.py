"""The chat template's sandbox: its remembered attribute checks answer as jinja's own."""

from __future__ import annotations

from typing import Any

import jinja2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvtide.errors import ConfigError
from kvtide.text.chat_template import ChatTemplate, _Sandbox


def _loop() -> LoopContext:
    return LoopContext(iter([1, 2]), jinja2.Undefined)


OBJECTS: list[Any] = [{}, {"role": "user"}, [], [1], (), "text", 3, 2.5, True, None, _loop(), str]
# every public and dunder name these types have, the mutators the immutable sandbox refuses
# among them, plus private ones and names none has
NAMES = sorted(
    {name for obj in OBJECTS for name in dir(obj)} | {"_private", "mro", "first", "content", "x"}
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(OBJECTS), st.sampled_from(NAMES)), max_size=30))
def test_remembered_checks_answer_as_jinjas(asks: list[tuple[Any, str]]) -> None:
    ours, reference = _Sandbox(), ImmutableSandboxedEnvironment()
    for obj, name in asks * 2:  # the second time from what it remembered
        value = getattr(obj, name, None)
        assert ours.is_safe_attribute(obj, name, value) == reference.is_safe_attribute(
            obj, name, value
        ), (type(obj), name)


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.append(1) }}",
        "{% for m in messages %}{{ m.clear() }}{% endfor %}",
        "{{ messages[0]['content'].__class__.__mro__ }}",
        "{% for m in messages %}{{ loop.__class__.__init__.__globals__ }}{% endfor %}",
    ],
)
def test_a_template_still_cannot_reach_unsafe_attributes(source: str) -> None:
    template = ChatTemplate(source, {})
    messages = [{"role": "user", "content": "hi"}]
    for _ in range(2):  # once checked, once remembered
        with pytest.raises(ConfigError, match="chat template"):
            template.render(messages)


def test_loop_attributes_render_after_they_are_remembered() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{{ loop.index }}{% if loop.first %}^{% endif %}"
        "{{ m.role }}:{{ m['content'] }}{% if loop.last %}${% endif %};{% endfor %}",
        {},
    )
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert template.render(messages) == template.render(messages) == "1^user:a;2assistant:b$;"


def test_reasoning_is_given_under_the_names_templates_read() -> None:
    """As transformers: ``reasoning``, ``thinking`` or ``reasoning_content``, whichever came,
    also under the other two; a message of role and reasoning alone too."""
    t = ChatTemplate(
        "{% for m in messages %}[{{ m.reasoning_content }}|{{ m.thinking }}]{% endfor %}", {}
    )
    assert t.render([{"role": "assistant", "reasoning": "why"}]) == "[why|why]"
    assert t.render([{"role": "a", "content": "", "thinking": "t"}]) == "[t|t]"
    assert t.render([{"role": "a", "content": "x"}]) == "[|]"
