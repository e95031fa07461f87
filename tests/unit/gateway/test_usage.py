"""The usage the gateway asks of every stream and hides from a client that did not ask:
the request rewritten, the usage event dropped whatever the engine's reads split, every
other byte passed on unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtide.gateway.status import ApiError
from kvtide.gateway.usage import (
    MAX_HELD_BYTES,
    UsageHider,
    ask_usage,
    whole_events,
    without_usage,
)

USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
         "prompt_tokens_details": {"cached_tokens": 4}}  # fmt: skip


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _token(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    return _event({"id": "c", "object": "chat.completion.chunk", "choices": [choice]})


USAGE_EVENT = _event({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": USAGE})
DONE = b"data: [DONE]\n\n"


def test_a_stream_without_stream_options_gets_include_usage() -> None:
    body: dict[str, Any] = {"stream": True}
    assert ask_usage(body) is True
    assert body["stream_options"] == {"include_usage": True}


def test_a_client_that_asked_keeps_its_options_and_its_usage() -> None:
    opts = {"include_usage": True, "continuous_usage_stats": True}
    body: dict[str, Any] = {"stream_options": dict(opts)}
    assert ask_usage(body) is False
    assert body["stream_options"] == opts


def test_other_options_are_kept_and_continuous_usage_stays_off() -> None:
    # continuous_usage_stats without include_usage had no effect: it must not start to
    body: dict[str, Any] = {"stream_options": {"continuous_usage_stats": True, "x": 1}}
    assert ask_usage(body) is True
    assert body["stream_options"] == {
        "include_usage": True, "continuous_usage_stats": False, "x": 1}  # fmt: skip
    body = {"stream_options": {"include_usage": False}}
    assert ask_usage(body) is True
    assert body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    "opts", ["yes", 1, [True], {"include_usage": "true"}, {"include_usage": 1}]
)
def test_malformed_stream_options_are_a_400_naming_the_field(opts: Any) -> None:
    with pytest.raises(ApiError) as info:
        ask_usage({"stream_options": opts})
    assert info.value.status.http == 400 and info.value.param == "stream_options"


def test_the_usage_only_event_is_dropped_and_the_rest_kept_byte_for_byte() -> None:
    events = _token("a") + _token("b", "stop") + USAGE_EVENT + DONE
    assert without_usage(events) == _token("a") + _token("b", "stop") + DONE
    assert without_usage(_token("a") + DONE) == _token("a") + DONE


def test_an_engine_that_sends_usage_unasked_gets_its_stream_passed_on_as_it_comes() -> None:
    # vLLM --enable-force-include-usage: usage in every chunk, whatever the request said;
    # the client would get it without the gateway too
    obj = {"id": "c", "choices": [{"index": 0, "delta": {"content": "z"}}], "usage": USAGE}
    assert without_usage(_token("a") + _event(obj)) is None
    stream = _token("a") + _event(obj) + _event(obj) + USAGE_EVENT + DONE
    for cut in range(1, len(stream)):
        out, _ = _relay([stream[:cut], stream[cut:]])
        assert out == stream, cut


def test_a_null_usage_and_text_that_names_usage_are_not_touched() -> None:
    # SGLang writes "usage": null in every chunk; a model may write the words themselves
    null = _event({"id": "c", "choices": [{"index": 0, "delta": {"content": "x"}}],
                   "usage": None})  # fmt: skip
    wordy = _token('say "completion_tokens": 3')
    assert without_usage(null + wordy + DONE) == null + wordy + DONE


def test_crlf_framed_events_are_handled_as_lf_framed() -> None:
    crlf = (_token("a") + USAGE_EVENT + DONE).replace(b"\n", b"\r\n")
    assert without_usage(crlf) == (_token("a") + DONE).replace(b"\n", b"\r\n")
    complete, rest = whole_events(crlf[:-3])
    assert complete == (_token("a") + USAGE_EVENT).replace(b"\n", b"\r\n") and rest


def test_whole_events_holds_only_the_unfinished_event() -> None:
    assert whole_events(_token("a") + b"data: {") == (_token("a"), b"data: {")
    assert whole_events(b"data: {") == (b"", b"data: {")
    assert whole_events(b"") == (b"", b"")
    big = b"data: " + b"x" * (MAX_HELD_BYTES + 1)
    assert whole_events(big) == (big, b"")  # no event: passed on, not held forever


def _relay(reads: list[bytes]) -> tuple[bytes, list[bytes]]:
    """What the proxy sends on: whole events (``whole_events``) through a ``UsageHider``."""
    hider, sent, held = UsageHider(), [], b""
    for read in reads:
        events, held = whole_events(held + read)
        if events:
            events = hider.hide(events)
        if events:
            sent.append(events)
    if held:
        sent.append(held)
    return b"".join(sent), sent


@given(
    texts=st.lists(st.text(min_size=0, max_size=12), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
    with_usage=st.booleans(),
)
def test_any_split_of_the_engines_stream_reaches_the_client_without_its_usage(
    texts: list[str], cuts: list[int], with_usage: bool
) -> None:
    wanted = b"".join(_token(t) for t in texts[:-1]) + _token(texts[-1], "stop")
    stream = wanted + (USAGE_EVENT if with_usage else b"") + DONE
    points = sorted({c % (len(stream) + 1) for c in cuts})
    reads = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    out, sent = _relay([r for r in reads if r])
    assert out == wanted + DONE
    # every piece the client gets is whole events: it never waits on a half
    assert all(piece.endswith(b"\n\n") for piece in sent)
