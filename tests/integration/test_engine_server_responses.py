"""`kvtide engine`'s OpenAI Responses API (``POST /v1/responses``) with the official ``openai``
client: a whole response and a stream of its events (the same text, usage with the cached
input inside the input), the token limit as ``incomplete``, the store behind
``previous_response_id`` and ``GET /v1/responses/{id}`` (off by default, as vLLM's), and
errors as OpenAI error objects."""

from __future__ import annotations

import openai
import pytest
from engine_process import engine_client, post_json, running_engine

pytestmark = pytest.mark.timeout(120)

INSTRUCTIONS = "You are a careful coding agent working in a large repository. " * 10


def test_responses_whole_and_streamed_with_usage() -> None:
    with (
        running_engine("--served-model-name", "emu", "--speedup", "50") as e,
        engine_client(e) as client,
    ):
        said = [{"role": "user", "content": [{"type": "input_text", "text": "Build it."}]}]
        first = client.responses.create(
            model="emu", instructions=INSTRUCTIONS, input=said, max_output_tokens=6
        )
        assert first.id.startswith("resp_") and first.status == "incomplete"
        assert first.incomplete_details is not None
        assert first.usage is not None and first.usage.output_tokens == 6
        assert first.usage.input_tokens_details.cached_tokens == 0
        text = first.output_text
        assert text
        kinds: list[str] = []
        with client.responses.stream(
            model="emu", instructions=INSTRUCTIONS, input=said, max_output_tokens=6
        ) as stream:
            for event in stream:
                kinds.append(event.type)
            # the openai client's get_final_response() wants response.completed; vLLM
            # ends a stream cut by the token limit with response.incomplete, as here
            assert event.type == "response.incomplete"
            again = event.response
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds[-1] == "response.incomplete"
        assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
        assert again.output_text == text
        # the same prompt again: its blocks are cached, inside the input tokens
        assert again.usage is not None
        assert again.usage.input_tokens == first.usage.input_tokens
        assert again.usage.input_tokens_details.cached_tokens > 0
        done = client.responses.create(model="emu", input="Hi", max_output_tokens=400)
        assert done.usage is not None  # at the limit, and only there, incomplete
        assert (done.status == "incomplete") == (done.usage.output_tokens == 400)


def test_the_store_is_off_by_default_as_vllms() -> None:
    with (
        running_engine("--served-model-name", "emu", "--speedup", "50") as e,
        engine_client(e) as client,
    ):
        first = client.responses.create(model="emu", input="Hi", max_output_tokens=4)
        with pytest.raises(openai.NotFoundError) as err:
            client.responses.create(
                model="emu", input="More", previous_response_id=first.id, max_output_tokens=4
            )
        assert first.id in err.value.message
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(first.id)


def test_previous_response_id_continues_the_stored_conversation() -> None:
    """With the store on (vLLM's ``VLLM_ENABLE_RESPONSES_API_STORE=1``) a request naming an
    earlier answer gets its conversation before its own input: the earlier prompt and output
    are a cached prefix of the new prompt."""
    store = ("--responses-store",)
    with (
        running_engine("--served-model-name", "emu", "--speedup", "50", *store) as e,
        engine_client(e) as client,
    ):
        first = client.responses.create(
            model="emu", instructions=INSTRUCTIONS, input="Plan it.", max_output_tokens=8
        )
        assert client.responses.retrieve(first.id).output_text == first.output_text
        second = client.responses.create(
            model="emu",
            instructions=INSTRUCTIONS,
            input="Now do it.",
            previous_response_id=first.id,
            max_output_tokens=8,
        )
        assert first.usage is not None and second.usage is not None
        assert second.usage.input_tokens > first.usage.input_tokens + 8
        assert second.usage.input_tokens_details.cached_tokens >= 16
        assert second.previous_response_id == first.id
        # not stored when the request says so
        quiet = client.responses.create(model="emu", input="Hi", store=False, max_output_tokens=4)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(quiet.id)
        status, body = post_json(f"{e.url}/v1/responses/{first.id}/cancel", {})
        assert status == 400 and "synchronous" in body["error"]["message"]


def test_responses_errors_are_openai_error_objects() -> None:
    with running_engine("--served-model-name", "emu", "--speedup", "50") as e:
        url = f"{e.url}/v1/responses"
        cases = [
            ({"model": "emu"}, "input"),
            ({"model": "emu", "input": 3}, "input"),
            ({"model": "emu", "input": [{"type": "item_reference", "id": "x"}]}, "input"),
            ({"model": "emu", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
            ({"model": "emu", "input": "x", "tools": {}}, "tools"),
            ({"model": "emu", "input": "x", "background": True}, "background"),
        ]
        for body, param in cases:
            status, answer = post_json(url, body)
            assert status == 400, (body, answer)
            assert answer["error"]["param"] == param, (body, answer)
            assert answer["error"]["type"] == "BadRequestError"
        status, answer = post_json(url, {"model": "other", "input": "x"})
        assert status == 404 and answer["error"]["param"] == "model"
        with engine_client(e) as client:  # and the engine kept serving
            assert client.responses.create(model="emu", input="x", max_output_tokens=2).id
