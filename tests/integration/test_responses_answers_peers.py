"""Differential: `kvtide engine`'s ``/v1/responses`` answers read by vLLM 0.33's own models
(under the peer-libraries venv: ``KVTIDE_PEER_PYTHON``, built by bench/setup_peers.sh): every
whole answer as its ``ResponsesResponse`` and every event of a streamed one as its
``StreamingResponsesResponse``, over requests that leave the sampling settings out, set them,
ask for more output than the context leaves, stop at the token limit, carry tools and
reasoning settings. What vLLM echoes from what it ran with is checked as vLLM fills it
(``ResponsesResponse.from_request``): the defaults where the request left a setting out, the
output limit the context allowed. Skipped when that interpreter or a module is absent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from engine_process import post_json, running_engine
from peer_process import peer_python, run_peer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).with_name("peer_kv_transfer.py")  # reads any answer kind
CONTEXT = 600
TOOL = {"type": "function", "name": "grep", "description": "Search the repository.",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}},
        "strict": None}  # fmt: skip
REQUESTS: list[dict[str, Any]] = [
    {"input": "Name a harbour."},
    {"input": "Name a harbour.", "max_output_tokens": 5},
    {"input": "Name a harbour.", "max_output_tokens": 50, "stop": [" the"]},  # completed
    {"input": "Name a harbour.", "max_output_tokens": CONTEXT - 2},  # more than is left
    {"instructions": "Be brief.", "input": [{"role": "user", "content": "Tides?"}],
     "temperature": 0.2, "top_p": 0.9, "max_output_tokens": 8, "store": False,
     "presence_penalty": 0.5, "frequency_penalty": -0.5, "metadata": {"run": "7"},
     "user": "u1", "truncation": "auto", "service_tier": "default"},
    {"input": "Find the bug.", "tools": [TOOL], "tool_choice": "auto",
     "parallel_tool_calls": False, "reasoning": {"effort": "low"}, "max_output_tokens": 4,
     "prompt_cache_key": "repo-1", "safety_identifier": "s1", "max_tool_calls": 3},
]  # fmt: skip


def _events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=30) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                out.append(json.loads(line[len("data: ") :]))
    return out


def test_vllms_models_read_every_responses_answer_and_event() -> None:
    peer_python()
    cases: list[tuple[str, dict[str, Any]]] = []
    with running_engine(
        "--served-model-name", "emu", "--speedup", "50", "--max-model-len", str(CONTEXT)
    ) as eng:
        url = eng.url + "/v1/responses"
        for request in REQUESTS:
            body = {"model": "emu", **request}
            status, answer = post_json(url, body)
            assert status == 200, answer
            events = _events(url, body)
            final = events[-1]["response"]
            for whole in (answer, final, events[0]["response"]):
                # what vLLM echoes from what it ran with
                assert whole["temperature"] == request.get("temperature", 1.0)
                assert whole["top_p"] == request.get("top_p", 1.0)
                assert whole["presence_penalty"] == request.get("presence_penalty", 0.0)
                room = CONTEXT - answer["usage"]["input_tokens"]
                limit = min(request.get("max_output_tokens", room), room)
                assert whole["max_output_tokens"] == limit
            for done in (answer, final):
                used = done["usage"]
                assert used["output_tokens"] <= limit
                assert (done["status"] == "incomplete") == (used["output_tokens"] == limit)
            cases.append(("response", answer))
            cases += [("response.event", event) for event in events]
    read = run_peer(SCRIPT, stdin=json.dumps(cases), timeout_s=240)
    errors = [(kind, body, error) for (kind, body), (_, error) in zip(cases, read, strict=True)
              if error is not None]  # fmt: skip
    assert not errors, errors[:3]
    kinds = {event["type"] for kind, event in cases if kind == "response.event"}
    assert {"response.created", "response.output_text.delta", "response.completed",
            "response.incomplete"} <= kinds  # fmt: skip
