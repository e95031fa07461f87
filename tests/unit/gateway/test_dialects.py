"""What the proxy reads of OpenAI's, the Responses API's and Anthropic's answers, and the errors
it words in each."""

from __future__ import annotations

import json

from kvtide.asgi.api_errors import error_event_for
from kvtide.gateway.access_log import Exchange
from kvtide.gateway.dialects import ANTHROPIC, OPENAI, RESPONSES
from kvtide.gateway.response_homes import ResponseHomes
from kvtide.gateway.status import (
    BAD_REQUEST,
    GATEWAY_TIMEOUT,
    MODEL_NOT_FOUND,
    SHUTTING_DOWN,
    UNAVAILABLE,
    ApiError,
)
from kvtide.types import ReplicaId


def _event(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def test_anthropic_usage_adds_the_cached_input_back_to_the_prompt() -> None:
    opening = {"input_tokens": 30, "output_tokens": 0, "cache_read_input_tokens": 96}
    start = _event("message_start", {"type": "message_start", "message": {"usage": opening}})
    delta = {"type": "text_delta", "text": "hi"}
    text = _event("content_block_delta", {"type": "content_block_delta", "delta": delta})
    final = {"input_tokens": 30, "output_tokens": 7, "cache_read_input_tokens": 96,
             "cache_creation_input_tokens": 4}  # fmt: skip
    end = _event("message_delta", {"type": "message_delta", "usage": final})
    stop = _event("message_stop", {"type": "message_stop"})
    exchange = Exchange("messages", 0.0, 0.0)
    assert ANTHROPIC.usage_mark in start and ANTHROPIC.usage_mark not in text
    ANTHROPIC.usage(exchange, start)
    assert (exchange.engine_prompt_tokens, exchange.completion_tokens) == (126, 0)
    assert ANTHROPIC.cached(start) == 96
    ANTHROPIC.usage(exchange, start + text + end)  # one read holding both: the last counts
    assert (exchange.engine_prompt_tokens, exchange.completion_tokens) == (130, 7)
    assert not ANTHROPIC.done(start + text + end) and ANTHROPIC.done(end + stop)
    assert ANTHROPIC.cached(_event("message_start", {"usage": {"input_tokens": 3}})) is None


def test_openai_usage_and_end() -> None:
    chunk = b'data: {"usage": {"prompt_tokens": 10, "completion_tokens": 2, ' \
        b'"prompt_tokens_details": {"cached_tokens": 8}}}\n\n'  # fmt: skip
    exchange = Exchange("chat", 0.0, 0.0)
    OPENAI.usage(exchange, chunk)
    assert (exchange.engine_prompt_tokens, exchange.completion_tokens) == (10, 2)
    assert OPENAI.cached(chunk) == 8
    assert OPENAI.done(chunk + b"data: [DONE]\n\n") and not OPENAI.done(chunk)


def test_anthropic_errors_use_its_types_as_vllm_words_them() -> None:
    cases = [(BAD_REQUEST, "invalid_request_error"), (MODEL_NOT_FOUND, "not_found_error"),
             (UNAVAILABLE, "overloaded_error"), (GATEWAY_TIMEOUT, "api_error")]  # fmt: skip
    for status, kind in cases:
        body = json.loads(ANTHROPIC.error_body(ApiError(status, "why")))
        assert body == {"type": "error", "error": {"type": kind, "message": "why"}}
    event = ANTHROPIC.error_event(ApiError(GATEWAY_TIMEOUT, "late"))
    assert event.startswith(b"event: error\ndata: ") and event.endswith(b"\n\n")
    assert json.loads(OPENAI.error_body(ApiError(BAD_REQUEST, "why", "x")))["error"]["param"] == "x"


def _response(status: str, usage: dict | None) -> dict:
    return {"id": "resp_7", "object": "response", "status": status, "output": [],
            "instructions": 'say "id": "x"', "usage": usage}  # fmt: skip


def test_a_responses_stream_opens_without_output_and_ends_at_its_terminal_event() -> None:
    """vLLM sends ``response.created`` and ``response.in_progress`` before any work: they do
    not end the prefill; the first delta does; the stream ends at ``response.completed``
    (or ``.incomplete``), whose usage counts the cached input inside the input."""
    opening = _response("in_progress", None)
    created = _event("response.created", {"type": "response.created", "response": opening})
    progress = _event("response.in_progress", {"type": "response.in_progress"})
    added = _event("response.output_item.added", {"item": {"id": "msg_1", "content": []}})
    delta = _event("response.output_text.delta", {"delta": "Hi", "item_id": "msg_1"})
    use = {"input_tokens": 130, "input_tokens_details": {"cached_tokens": 96,
           "cached_tokens_per_turn": [96]}, "output_tokens": 7,
           "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 137}  # fmt: skip
    final = _response("completed", use)
    completed = _event("response.completed", {"type": "response.completed", "response": final})
    assert RESPONSES.no_output(created) and RESPONSES.no_output(created + progress)
    assert RESPONSES.no_output(b": keep-alive\n\n")
    assert not RESPONSES.no_output(created + progress + added)
    assert not RESPONSES.no_output(delta) and not RESPONSES.no_output(b'data: {"a": 1}\n\n')
    assert RESPONSES.response_id(created) == "resp_7"
    assert RESPONSES.response_id(delta) is None or RESPONSES.response_id(delta) != "resp_7"
    assert RESPONSES.usage_mark not in created + delta and RESPONSES.usage_mark in completed
    exchange = Exchange("responses", 0.0, 0.0)
    RESPONSES.usage(exchange, completed)
    assert (exchange.engine_prompt_tokens, exchange.completion_tokens) == (130, 7)
    assert RESPONSES.cached(completed) == 96
    assert not RESPONSES.done(created + progress + delta)
    assert RESPONSES.done(completed)
    incomplete = _event("response.incomplete", {"response": _response("incomplete", use)})
    assert RESPONSES.done(incomplete) and not OPENAI.done(completed)
    assert OPENAI.response_id(created) is None and ANTHROPIC.response_id(created) is None


def test_response_homes_are_bounded_and_forget_a_removed_replica() -> None:
    homes = ResponseHomes(capacity=3)
    for i in range(3):
        homes.record(f"r{i}", ReplicaId(f"e{i % 2}"), "t")
    assert homes.get("r0") == ("e0", "t")  # used: now the newest
    homes.record("r3", ReplicaId("e1"), "u")
    assert homes.get("r1") is None and len(homes) == 3  # the least recently used went
    assert homes.get(["r0"]) is None and homes.get(None) is None  # a client's odd value
    homes.forget(ReplicaId("e0"))
    assert homes.get("r0") is None and homes.get("r2") is None
    assert homes.get("r3") == ("e1", "u")


def test_a_responses_stream_ends_with_the_apis_error_event_holding_openais_error() -> None:
    """What Responses clients read (an ``error`` event: type, code, message, param), with
    OpenAI's error object inside for the ``openai`` client, from the proxy and the drain cut
    alike."""
    err = ApiError(SHUTTING_DOWN, "the gateway is shutting down")
    event = RESPONSES.error_event(err)
    assert event == error_event_for("/v1/responses", err)
    head, _, data = event.partition(b"\ndata: ")
    assert head == b"event: error" and event.endswith(b"\n\n")
    parsed = json.loads(data)
    assert parsed["type"] == "error" and parsed["message"] == "the gateway is shutting down"
    assert parsed["code"] == parsed["error"]["code"] == "shutting_down"
    assert {"error": parsed["error"]} == json.loads(OPENAI.error_body(err))


def test_a_prefill_legs_answer_gives_its_decode_the_kv_transfer_params() -> None:
    params = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_engine_id": "e"}
    answer = {"id": "c", "choices": [], "kv_transfer_params": params}
    for dialect in (OPENAI, RESPONSES, ANTHROPIC):
        assert dialect.kv_transfer_params(json.dumps(answer).encode()) == params
    for data in (b'{"id": "c"}', b'{"kv_transfer_params": null}', b'{"kv_transfer_params": {}}',
                 b'{"kv_transfer_params": [1]}', b"[1]", b"not json"):  # fmt: skip
        assert OPENAI.kv_transfer_params(data) is None  # no connector: the decode prefills


def test_a_prefill_leg_is_one_whole_token_and_the_clients_body_is_left_alone() -> None:
    body = {"model": "m", "prompt": "x", "stream": True, "max_tokens": 9, "min_tokens": 2,
            "stream_options": {"include_usage": True}}  # fmt: skip
    leg = OPENAI.prefill_leg(body)
    assert leg["stream"] is False and leg["max_tokens"] == 1
    assert "min_tokens" not in leg and "stream_options" not in leg
    assert leg["kv_transfer_params"]["do_remote_decode"] is True
    assert body["max_tokens"] == 9 and body["stream"] is True
    assert "max_completion_tokens" not in leg  # set only where the client gave it
    chat = OPENAI.prefill_leg({"messages": [], "max_completion_tokens": 7})
    assert chat["max_completion_tokens"] == 1 and chat["max_tokens"] == 1
    resp = RESPONSES.prefill_leg({"input": "x", "max_output_tokens": 5, "store": True})
    assert resp["max_output_tokens"] == 1 and resp["store"] is False
    assert "max_tokens" not in resp
    assert ANTHROPIC.prefill_leg({"messages": [], "max_tokens": 99})["max_tokens"] == 1
