"""`kvtide engine`'s Anthropic Messages API (``POST /v1/messages``) with the official
``anthropic`` client: a whole message and a stream, stop sequences and their stop reasons,
usage with the cached input apart, ``count_tokens``, errors as Anthropic error objects."""

from __future__ import annotations

import anthropic
import pytest
from engine_process import post_json, running_engine

pytestmark = pytest.mark.timeout(120)

SYSTEM = "You are a careful coding agent working in a large repository. " * 10


def test_messages_whole_and_streamed_with_usage_and_stops() -> None:
    with running_engine("--served-model-name", "emu", "--speedup", "50") as e:
        client = anthropic.Anthropic(base_url=e.url, api_key="x", max_retries=0, timeout=30)
        try:
            said = [{"role": "user", "content": "Summarise the build."}]
            first = client.messages.create(model="emu", max_tokens=6, system=SYSTEM, messages=said)
            assert first.stop_reason == "max_tokens" and first.usage.output_tokens == 6
            assert first.id.startswith("msg_") and first.content[0].type == "text"
            assert first.usage.cache_read_input_tokens == 0
            with client.messages.stream(
                model="emu", max_tokens=6, system=SYSTEM, messages=said
            ) as stream:
                deltas = list(stream.text_stream)
                again = stream.get_final_message()
            # the first wrote the prompt's whole blocks to the cache (vLLM 0.33 counts them
            # apart from the input); the same prompt again finds them, the input the rest
            written = first.usage.cache_creation_input_tokens
            assert written is not None and written > 0
            cached = again.usage.cache_read_input_tokens
            assert cached == written and again.usage.cache_creation_input_tokens == 0
            assert again.usage.input_tokens == first.usage.input_tokens
            assert "".join(deltas) == first.content[0].text  # type: ignore[union-attr]
            word = first.content[0].text.split()[1]  # type: ignore[union-attr]
            stopped = client.messages.create(
                model="emu", max_tokens=6, system=SYSTEM, messages=said, stop_sequences=[word]
            )
            assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
            # count_tokens counts what a Messages request's prompt would be, as vLLM does
            counted = client.messages.count_tokens(model="emu", system=SYSTEM, messages=said)
            assert counted.input_tokens == first.usage.input_tokens + written
            with pytest.raises(anthropic.NotFoundError):
                client.messages.count_tokens(model="other", messages=said)
        finally:
            client.close()


def test_every_stream_ends_whole_when_the_output_ends_during_a_send() -> None:
    """A stream whose request finished while its last chunk was being sent was answered a
    second time, as a whole message, on the started response: the engine raised and cut the
    connection (a few streams in 40 did). Each of these gets its events and its end."""
    with running_engine("--served-model-name", "emu", "--speedup", "50") as e:
        client = anthropic.Anthropic(base_url=e.url, api_key="x", max_retries=0, timeout=30)
        try:
            said = [{"role": "user", "content": "Go on."}]
            for _ in range(40):
                with client.messages.stream(
                    model="emu", max_tokens=6, system=SYSTEM, messages=said
                ) as stream:
                    assert stream.get_final_message().usage.output_tokens == 6
        finally:
            client.close()
        assert not [line for line in e.log if "Traceback" in line]


def test_messages_errors_are_anthropic_error_objects() -> None:
    with running_engine("--served-model-name", "emu", "--speedup", "50") as e:
        url = f"{e.url}/v1/messages"
        said = [{"role": "user", "content": "hi"}]
        status, body = post_json(url, {"model": "nope", "max_tokens": 5, "messages": said})
        assert status == 404 and body["error"]["type"] == "not_found_error", body
        status, body = post_json(url, {"model": "emu", "messages": said})
        assert status == 400 and body == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "'max_tokens' is required"},
        }
        status, body = post_json(url, {"model": "emu", "max_tokens": 5, "messages": [{"role": 1}]})
        assert status == 400 and "role" in body["error"]["message"], body
