"""Differential: disaggregated-serving bodies read by vLLM 0.33's own classes (under the
peer-libraries venv: ``KVTIDE_PEER_PYTHON``, built by bench/setup_peers.sh). The prefill and
decode legs a proxy sends parse with their ``kv_transfer_params`` intact, for each generating
API; the answers of a `kvtide engine` run with ``--kv-transfer-config`` (whole and streamed)
validate as vLLM's response models with the ``kv_transfer_params`` the engine gave. Skipped
when that interpreter or a module is absent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from engine_process import post_json, running_engine
from peer_process import peer_python, run_peer

from kvtide.gateway.dialects import PREFILL_LEG_PARAMS as TOY_PREFILL  # as vLLM's toy proxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).with_name("peer_kv_transfer.py")
MODEL = "llama-3-8b"
NIXL = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'
MESSAGES = [{"role": "user", "content": "Name a harbour."}]
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "completions": ("/v1/completions", {"model": MODEL, "prompt": "The tide", "max_tokens": 1}),
    "chat": ("/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 1}),
    "messages": ("/v1/messages", {"model": MODEL, "messages": MESSAGES, "max_tokens": 1}),
    "responses": ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 16}),
}
ANSWER_KIND = {
    "completions": "completion",
    "chat": "chat.completion",
    "messages": "message",
    "responses": "response",
}


def _final_chunk(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """The last ``data:`` object of a streamed answer."""
    last: dict[str, Any] = {}
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=30) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                last = json.loads(line[len("data: ") :])
    return last


def test_vllms_classes_read_the_legs_and_the_engines_answers() -> None:
    peer_python()
    cases: list[tuple[str, dict[str, Any]]] = []
    given: list[Any] = []
    with running_engine("--model", MODEL, "--speedup", "50", "--kv-transfer-config", NIXL) as eng:
        for api, (path, body) in BODIES.items():
            prefill = {**body, "kv_transfer_params": TOY_PREFILL}
            status, answer = post_json(eng.url + path, prefill)
            assert status == 200, answer
            kv = answer["kv_transfer_params"]
            assert kv["do_remote_prefill"] is True
            decode = {**body, "kv_transfer_params": kv}
            status, decoded = post_json(eng.url + path, decode)
            assert status == 200, decoded
            cases += [(api, prefill), (api, decode)]
            given += [TOY_PREFILL, kv]
            cases.append((ANSWER_KIND[api], answer))
            given.append(kv)
            if api == "messages":  # vLLM leaves a message's null fields out
                assert "kv_transfer_params" not in decoded
            else:
                cases.append((ANSWER_KIND[api], decoded))
                given.append(None)
        for api in ("completions", "chat"):
            path, body = BODIES[api]
            last = _final_chunk(eng.url + path, {**body, "kv_transfer_params": TOY_PREFILL})
            kind = "text_completion.chunk" if api == "completions" else "chat.completion.chunk"
            cases.append((kind, last))
            given.append(last["kv_transfer_params"])
    assert isinstance(given[-1], dict) and given[-1]["do_remote_prefill"] is True
    read = run_peer(SCRIPT, stdin=json.dumps(cases), timeout_s=240)
    for (kind, body), (kept, error), expected in zip(cases, read, given, strict=True):
        assert error is None, (kind, body, error)
        assert kept == expected, (kind, body)


def test_vllm_refuses_what_is_not_an_object_as_the_engine_does() -> None:
    peer_python()
    bad = [("completions", {"model": MODEL, "prompt": "x", "kv_transfer_params": 3}),
           ("chat", {"model": MODEL, "messages": MESSAGES, "kv_transfer_params": [1]})]  # fmt: skip
    read = run_peer(SCRIPT, stdin=json.dumps(bad), timeout_s=240)
    assert all(kept is None and error and "kv_transfer_params" in error for kept, error in read)
