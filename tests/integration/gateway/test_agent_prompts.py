"""The gateway's prompt is the engine's, to the token, where vLLM builds more than the text:
an agent through `kvtide serve` in front of two `kvtide engine` processes whose tokenizer has
a tool-aware chat template (the request's tools, the assistant's tool calls and the tool
results rendered by the gateway as the engines render them, and the hits the gateway predicts
from the engines' KV events the hits they report); a completion's ``add_special_tokens``
under a tokenizer that adds a BOS."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from tests.chat_templates import write_tokenizer_dir
from tests.integration.gateway.procs import access_log_lines, engines_behind_gateway, openai_client

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "track_parcel",
            "description": "Where a parcel is now. " * 6,
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        },
    }
]


def test_tools_and_tool_calls_are_the_engines_prompt(tmp_path: Path) -> None:
    tokenizer = str(write_tokenizer_dir(tmp_path / "tok"))
    log = tmp_path / "access.jsonl"
    flags = ("--tokenizer", tokenizer)
    with engines_behind_gateway(2, flags, *flags, "--access-log", str(log)) as (port, _):
        c = openai_client(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        history: list[dict[str, Any]] = [
            {"role": "system", "content": "You track parcels for a shipping company. " * 8}
        ]
        for turn in range(4):
            history.append({"role": "user", "content": f"Where is parcel {turn}?"})
            c.chat.completions.create(
                model="emu",
                messages=history,  # type: ignore[arg-type]
                tools=TOOLS,  # type: ignore[arg-type]
                max_tokens=2,
            )
            call = {
                "id": f"call_{turn}",
                "type": "function",
                "function": {"name": "track_parcel", "arguments": json.dumps({"id": str(turn)})},
            }
            history.append({"role": "assistant", "content": None, "tool_calls": [call]})
            history.append({"role": "tool", "tool_call_id": call["id"], "content": "In Zürich."})
            time.sleep(0.5)  # the engine's KV events reach the gateway's index
        lines = access_log_lines(log, 4)
    for line in lines:
        assert line["status"] == 200, line
        # the gateway's prompt is the engine's: tools and calls rendered as the engine does
        assert line["prompt_tokens"] == line["engine_prompt_tokens"], line
    for line in lines[1:]:  # each turn on the engine holding the last, hits predicted exactly
        assert line["cached_tokens"] > 0, line
        assert abs(line["predicted_cached_tokens"] - line["cached_tokens"]) < 16, line
    assert len({line["replica"] for line in lines}) == 1


def test_a_completion_without_special_tokens_is_the_engines_prompt(tmp_path: Path) -> None:
    """A client that renders its own template sends ``add_special_tokens: false``; with a
    tokenizer that adds a BOS, the engine's prompt is then one token shorter, and so is the
    gateway's."""
    tokenizer = str(write_tokenizer_dir(tmp_path / "tok", bos=True))
    log = tmp_path / "access.jsonl"
    flags = ("--tokenizer", tokenizer)
    with engines_behind_gateway(1, flags, *flags, "--access-log", str(log)) as (port, _):
        c = openai_client(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        prompt = "<|im_start|>user\nWhere is parcel 7?<|im_end|>\n<|im_start|>assistant\n"
        counts = []
        for special in (True, False):
            r = c.completions.create(
                model="emu",
                prompt=prompt,
                max_tokens=1,
                extra_body={"add_special_tokens": special},
            )
            assert r.usage is not None
            counts.append(r.usage.prompt_tokens)
        lines = access_log_lines(log, 2)
    assert counts[0] == counts[1] + 1  # the BOS, added or not by the engine
    assert [line["prompt_tokens"] for line in lines] == counts
