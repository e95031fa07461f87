"""Differential: the prefill leg the gateway sends for a disaggregated request
(``Dialect.prefill_leg``), read by vLLM 0.33's own request classes as its server reads them,
for each generating API: valid, whole (not streamed), one output token, no ``min_tokens``
above it, and ``kv_transfer_params`` asking for a remote decode where vLLM's connector reads
them (the sampling parameters' ``extra_args``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from peer_process import peer_python, run_peer

from kvtide.gateway.dialects import ANTHROPIC, OPENAI, RESPONSES, Dialect

pytestmark = pytest.mark.slow

PEER_SCRIPT = Path(__file__).parent / "peer_prefill_legs.py"
MESSAGES = [{"role": "user", "content": "Say hi."}]

CASES: list[tuple[str, Dialect, dict[str, Any]]] = [
    ("completions", OPENAI, {"model": "m", "prompt": "Once", "max_tokens": 64, "stream": True,
                             "stream_options": {"include_usage": True}, "min_tokens": 8}),
    ("completions", OPENAI, {"model": "m", "prompt": [1, 2, 3]}),  # no limit given
    ("chat", OPENAI, {"model": "m", "messages": MESSAGES, "max_completion_tokens": 50,
                      "max_tokens": 60, "stream": True, "min_tokens": 4, "priority": 3}),
    ("chat", OPENAI, {"model": "m", "messages": MESSAGES, "max_completion_tokens": 50}),
    ("chat", OPENAI, {"model": "m", "messages": MESSAGES, "n": 2, "logprobs": True,
                      "top_logprobs": 2, "stop": ["\n"]}),
    ("messages", ANTHROPIC, {"model": "m", "messages": MESSAGES, "max_tokens": 2048,
                             "stream": True,
                             "thinking": {"type": "enabled", "budget_tokens": 1024}}),
    ("responses", RESPONSES, {"model": "m", "input": "Say hi.", "max_output_tokens": 30,
                              "stream": True, "store": True}),
]  # fmt: skip


def test_vllm_reads_each_prefill_leg_as_one_whole_token_kept_for_a_remote_decode() -> None:
    peer_python()  # skipped without it
    legs = [[api, dialect.prefill_leg(body)] for api, dialect, body in CASES]
    parsed = run_peer(PEER_SCRIPT, stdin=json.dumps(legs), timeout_s=120)
    assert [error for _, error in parsed] == [None] * len(CASES), parsed
    for (api, _, body), (read, _) in zip(CASES, parsed, strict=True):
        assert read["stream"] is False, api
        assert read["max_tokens"] == 1, (api, body)
        assert read["min_tokens"] == 0, api
        params = read["kv_transfer_params"]
        assert params["do_remote_decode"] is True and params["do_remote_prefill"] is False
    # the client's own request is left as it was (the decode leg sends it)
    assert CASES[0][2]["stream"] is True and "kv_transfer_params" not in CASES[0][2]


def test_the_client_request_read_by_vllm_keeps_its_own_limits() -> None:
    """The control: without the leg's changes vLLM reads the bodies' own limits (so the
    assertions above are the leg's doing, not the script's)."""
    peer_python()
    parsed = run_peer(
        PEER_SCRIPT, stdin=json.dumps([[api, body] for api, _, body in CASES]), timeout_s=120
    )
    limits = [read["max_tokens"] for read, _ in parsed]
    # completions default to 16 tokens (OpenAI's default), chat to the context's rest
    assert limits == [64, 16, 50, 50, 4086, 2048, 30], limits
    assert all(read["kv_transfer_params"] is None for read, _ in parsed)
