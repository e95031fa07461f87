"""Generated request bodies, valid ones (chats with content parts, tool calls, tools,
documents, flags; completions) with up to two of their fields and two of their messages'
fields set to any JSON at all, sent over one
keep-alive connection to `kvtide serve` in token mode and to the `kvtide engine` behind it
(both with a tool-aware chat template): every answer is a success or a 4xx with an OpenAI
error object, never a 5xx or a dropped connection, and both keep serving."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tests.chat_templates import write_tokenizer_dir
from tests.integration.gateway.procs import engines_behind_gateway

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_any = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_text = st.text(max_size=30)
_part = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text"]), "text": _text}),
    _text,
)
_arguments = st.one_of(
    st.dictionaries(st.text(max_size=5), _scalar, max_size=3).map(json.dumps), _text
)
_call = st.fixed_dictionaries(
    {
        "id": st.text(max_size=5),
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": _text, "arguments": _arguments}),
    }
)
_message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user"]), "content": st.one_of(_text, st.lists(_part))},
        optional={"name": _text},
    ),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": st.one_of(_text, st.none())},
        optional={"tool_calls": st.lists(_call, max_size=2), "reasoning": _text},
    ),
    st.fixed_dictionaries({"role": st.just("tool"), "content": _text, "tool_call_id": _text}),
)
_tool = st.fixed_dictionaries(
    {"type": st.just("function"), "function": st.fixed_dictionaries({"name": _text})},
    optional={"description": _text, "parameters": st.just({"type": "object"})},
)
_optional = {
    "stream": st.booleans(),
    "tools": st.lists(_tool, max_size=2),
    "documents": st.lists(st.fixed_dictionaries({"title": _text, "text": _text}), max_size=2),
    "chat_template_kwargs": st.fixed_dictionaries({"enable_thinking": st.booleans()}),
    "add_generation_prompt": st.booleans(),
    "continue_final_message": st.booleans(),
    "cache_salt": _text,
    "priority": st.integers(-5, 5),
}
# max_tokens always set and small: a chat without one runs to the context's end
_chat = st.fixed_dictionaries(
    {
        "model": st.just("emu"),
        "messages": st.lists(_message, min_size=1, max_size=4),
        "max_tokens": st.integers(1, 3),
    },
    optional=_optional,
)
_completion = st.fixed_dictionaries(
    {
        "model": st.just("emu"),
        "prompt": st.one_of(
            _text,
            st.lists(st.integers(0, 40_000), min_size=1, max_size=12),
            st.lists(st.integers(-(2**64), 2**64), min_size=1, max_size=3),
        ),
        "max_tokens": st.integers(1, 3),
    },
    optional={"stream": st.booleans(), "cache_salt": _text, "priority": st.integers(-5, 5)},
)
# then up to two fields of the body, and up to two of its messages', set to any JSON at all
_BODY_KEYS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "stream",
    "stream_options",
    "n",
    "temperature",
    "stop",
    "tools",
    "documents",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "cache_salt",
    "priority",
]
_MESSAGE_KEYS = ["role", "content", "tool_calls", "tool_call_id", "name", "reasoning"]


def _mutate(args: tuple[dict[str, Any], list, list]) -> dict[str, Any]:
    body, top, inner = args
    body = json.loads(json.dumps(body))
    for key, value in top:
        body[key] = value
    messages = body.get("messages")
    for i, key, value in inner:
        if isinstance(messages, list) and i < len(messages) and isinstance(messages[i], dict):
            messages[i][key] = value
    return body


def _mutated(valid: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.tuples(
        valid,
        st.lists(st.tuples(st.sampled_from(_BODY_KEYS), _any), max_size=2),
        st.lists(st.tuples(st.integers(0, 3), st.sampled_from(_MESSAGE_KEYS), _any), max_size=2),
    ).map(_mutate)


_requests = st.one_of(
    _mutated(_chat).map(lambda b: ("/v1/chat/completions", b)),
    _mutated(_completion).map(lambda b: ("/v1/completions", b)),
)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    tokenizer = str(write_tokenizer_dir(tmp_path_factory.mktemp("fuzz") / "tok"))
    flags = ("--tokenizer", tokenizer)
    with engines_behind_gateway(1, flags, *flags) as (port, engines):
        yield {"gateway": port, "engine": engines[0].port}


def _check(conn: http.client.HTTPConnection, path: str, body: Any) -> None:
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"content-type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
    except (http.client.HTTPException, OSError):
        conn.close()  # the next example reconnects; this one fails
        raise
    assert resp.status < 500, (resp.status, raw[:300], body)
    if resp.status >= 400:
        error = json.loads(raw)["error"]
        assert {"message", "type", "code"} <= set(error), raw
        assert "\n" not in error["message"] and "Traceback" not in error["message"]


@pytest.mark.parametrize("server", ["gateway", "engine"])
def test_generated_bodies_get_a_success_or_a_4xx(server: str, servers: dict[str, int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", servers[server], timeout=30)

    @settings(
        max_examples=150,
        deadline=None,
        # no shrinking: each step is a request, and the body that failed is small already
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(_requests)
    def send(request: tuple[str, Any]) -> None:
        _check(conn, *request)

    try:
        send()
        # and it still serves an ordinary request on the same connection
        ok = {"model": "emu", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        conn.request("POST", "/v1/chat/completions", json.dumps(ok).encode())
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        resp.read()
    finally:
        conn.close()
