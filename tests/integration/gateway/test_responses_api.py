"""OpenAI's Responses API through `kvtide serve`, with the official ``openai`` client, in front of
`kvtide engine` processes serving ``/v1/responses`` as vLLM does: a Codex-shaped agent (the
whole history sent again each turn, reasoning, function and custom tool calls and their
outputs) whose prompt the gateway renders to the engine's token, routed to the replica holding
it; ``previous_response_id`` and ``GET /v1/responses/{id}`` sent to the engine that stored the
answer (any other answers 404), never for another tenant; errors as OpenAI error objects."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from engine_process import post_json
from tests.chat_templates import write_tokenizer_dir
from tests.integration.gateway.conftest import KEYS, SECRET, write_keys
from tests.integration.gateway.procs import (
    access_log_lines,
    engines_behind_gateway,
    openai_client,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

INSTRUCTIONS = "You are a coding agent. Follow the repository's conventions. " * 12
SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}}
TOOLS: list[Any] = [
    {"type": "function", "name": "shell", "description": "Runs a command. " * 5,
     "parameters": SCHEMA},
    {"type": "custom", "name": "apply_patch", "description": "Applies a patch."},
]  # fmt: skip


def test_a_codex_shaped_agents_prompt_is_the_engines_to_the_token(tmp_path: Path) -> None:
    """Token mode, two engines with a tool-aware template: each turn sends the whole history
    back (the model's reasoning, text and calls, the calls' outputs), streamed and not. The
    gateway's prompt is the engine's, the hits it predicts from the engines' KV events are
    the hits they report, and the conversation stays on one engine."""
    tokenizer = str(write_tokenizer_dir(tmp_path / "tok"))
    log = tmp_path / "access.jsonl"
    flags = ("--tokenizer", tokenizer)
    with engines_behind_gateway(2, flags, *flags, "--access-log", str(log)) as (port, _):
        client = openai_client(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        history: list[Any] = [
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "Fix the failing test."}]}
        ]  # fmt: skip
        for turn in range(4):
            common = {"model": "emu", "instructions": INSTRUCTIONS, "tools": TOOLS,
                      "input": history, "max_output_tokens": 3, "store": False,
                      "reasoning": {"effort": "low"}}  # fmt: skip
            if turn % 2:
                with client.responses.stream(**common) as stream:
                    final = [e for e in stream][-1].response
            else:
                final = client.responses.create(**common)
            assert final.usage is not None and final.usage.output_tokens == 3
            history += [
                {"type": "reasoning", "id": f"rs_{turn}", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "Look at the log."}]},
                {"type": "message", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": final.output_text,
                              "annotations": []}]},
                {"type": "function_call", "call_id": f"call_{turn}", "name": "shell",
                 "arguments": json.dumps({"cmd": f"pytest -k case_{turn}"})},
                {"type": "function_call_output", "call_id": f"call_{turn}",
                 "output": f"{turn} failed"},
            ]  # fmt: skip
            if turn == 1:
                history += [
                    {"type": "custom_tool_call", "call_id": "patch", "name": "apply_patch",
                     "input": "*** Begin Patch\n*** End Patch"},
                    {"type": "custom_tool_call_output", "call_id": "patch", "output": "Done!"},
                ]  # fmt: skip
            history.append({"role": "user", "content": f"Now case {turn + 1}."})
            time.sleep(0.5)  # the engine's KV events reach the gateway's index
        lines = access_log_lines(log, 4)
    for line in lines:
        assert line["status"] == 200 and line["endpoint"] == "responses", line
        assert line["tokenized"] and line["prompt_tokens"] == line["engine_prompt_tokens"], line
        assert line["completion_tokens"] == 3, line
    for line in lines[1:]:
        assert line["cached_tokens"] > 0, line
        assert abs(line["predicted_cached_tokens"] - line["cached_tokens"]) < 16, line
    assert len({line["replica"] for line in lines}) == 1


def test_previous_response_id_goes_to_the_engine_that_stored_it(tmp_path: Path) -> None:
    """Three engines keeping their answers (vLLM's store), text mode: conversations spread
    over them, and every follow-up naming an answer reaches its engine (elsewhere it would be
    a 404), streamed or not, as do retrievals; another tenant naming it gets a 404."""
    keys = write_keys(tmp_path / "keys.yaml", KEYS)
    log = tmp_path / "access.jsonl"
    gateway_flags = ("--access-log", str(log), "--api-keys", str(keys), "--tenant-secret", SECRET)
    with engines_behind_gateway(3, ("--responses-store",), *gateway_flags) as (port, _):
        url = f"http://127.0.0.1:{port}"
        alpha = openai_client(base_url=f"{url}/v1", api_key=KEYS["alpha"], max_retries=0)
        beta = openai_client(base_url=f"{url}/v1", api_key=KEYS["beta"], max_retries=0)
        firsts = [
            alpha.responses.create(
                model="emu",
                instructions=f"project {i}: " + INSTRUCTIONS * 2,
                input="Plan the change.",
                max_output_tokens=4,
            )
            for i in range(6)
        ]
        followups = []
        for i, first in enumerate(firsts):
            common = {"model": "emu", "input": "Carry on.", "previous_response_id": first.id,
                      "max_output_tokens": 4}  # fmt: skip
            if i % 2:
                with alpha.responses.stream(**common) as stream:
                    followups.append([e for e in stream][-1].response)
            else:
                followups.append(alpha.responses.create(**common))
            assert alpha.responses.retrieve(first.id).output_text == first.output_text
        bare = alpha.responses.create(model="emu", input="Carry on.", max_output_tokens=1)
        assert bare.usage is not None
        for first, later in zip(firsts, followups, strict=True):
            assert later.previous_response_id == first.id
            assert later.usage is not None
            # the engine put the stored conversation (its instructions left out, as vLLM
            # does) before the new input: its input and its 4 output tokens at least
            assert later.usage.input_tokens > bare.usage.input_tokens + 4 + 3
        with pytest.raises(openai.NotFoundError) as err:
            beta.responses.create(
                model="emu", input="x", previous_response_id=firsts[0].id, max_output_tokens=2
            )
        assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]
        with pytest.raises(openai.NotFoundError):
            beta.responses.retrieve(firsts[0].id)
        with pytest.raises(openai.NotFoundError):
            alpha.responses.retrieve("resp_never_given")
        status, body = post_json(
            f"{url}/v1/responses/{firsts[0].id}/cancel",
            {},
            {"Authorization": f"Bearer {KEYS['alpha']}"},
        )
        assert status == 400 and "synchronous" in body["error"]["message"]  # the engine's
        lines = access_log_lines(log, 6 + 6 + 6 + 1 + 1 + 1 + 1 + 1)
    created = [line for line in lines if line["endpoint"] == "responses"]
    homes = [line["replica"] for line in created[:6]]
    assert len(set(homes)) > 1  # the conversations spread over the engines
    for home, line in zip(homes, created[6:12], strict=True):
        assert line["route"] == "previous_response" and line["replica"] == home, line
        assert line["status"] == 200
    stored = [line for line in lines if line["endpoint"] == "responses_stored"]
    assert {line["status"] for line in stored} == {200, 404, 400}


def test_responses_errors_are_openai_errors(tmp_path: Path) -> None:
    with engines_behind_gateway(1, ()) as (port, _):
        url = f"http://127.0.0.1:{port}"
        for body, param in [
            ({"model": "emu"}, "input"),
            ({"model": "emu", "input": 5}, "input"),
            ({"model": "emu", "input": [{"type": "reasoning", "encrypted_content": "x"}]}, "input"),
            ({"model": "emu", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
            ({"model": "emu", "input": "x", "reasoning": "high"}, "reasoning"),
        ]:
            status, answer = post_json(
                f"{url}/v1/responses", body, {"Authorization": f"Bearer {'x'}"}
            )
            assert status == 400, (body, answer)
            assert answer["error"]["param"] == param, (body, answer)
        status, answer = post_json(
            f"{url}/v1/responses",
            {"model": "nope", "input": "x"},
            {"Authorization": f"Bearer {'x'}"},
        )
        assert status == 404 and answer["error"]["param"] == "model"
        client = openai_client(base_url=f"{url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError):
            client.responses.create(model="emu", input=[{"type": "item_reference", "id": "m"}])
        assert client.responses.create(model="emu", input="hi", max_output_tokens=2).id


def test_an_engine_lost_mid_stream_ends_the_responses_stream_with_an_error_event() -> None:
    """The engine killed while its answer streams: the client gets the Responses ``error``
    event, which the ``openai`` client raises as ``APIError`` (a Codex-like client reads its
    ``type``, ``code`` and ``message``)."""
    with engines_behind_gateway(1, ("--speedup", "0.05")) as (port, engines):
        client = openai_client(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        kinds = []
        with (
            pytest.raises(openai.APIError) as err,
            client.responses.stream(
                model="emu", input="Write a long story.", max_output_tokens=400
            ) as stream,
        ):
            for event in stream:
                kinds.append(event.type)
                if event.type == "response.output_text.delta" and len(kinds) == 6:
                    engines[0].proc.kill()  # by its PID
        assert "response.output_text.delta" in kinds and "response.completed" not in kinds
        assert err.value.message == "the engine failed mid-stream"
        assert err.value.body == {  # type: ignore[comparison-overlap]
            "message": "the engine failed mid-stream", "type": "upstream_error",
            "param": None, "code": "upstream_error",
        }  # fmt: skip
