"""The router's view of a replica's prefill queue through a real stream: a request's prompt
stays queued there until its first token comes back, also from an engine that sends the
chat stream's role chunk with the headers, before any work (vLLM sends it with the first
token; kvtide's emulated engine did not, and the `cost` policy then read every queue empty)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from tests.integration.gateway.procs import backend, free_port, gateway

pytestmark = pytest.mark.timeout(60)


def _queued(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as resp:
        return int(json.load(resp)["replicas"][0]["queued_prefill_tokens"])


def test_a_role_chunk_before_the_prefill_does_not_end_it() -> None:
    bport, port = free_port(), free_port()
    back = backend(bport, "m", "--prefill-delay", "1.0", "--tokens", "3", "--role-first")
    gw = gateway(port, "--replica", f"http://127.0.0.1:{bport}")
    try:
        assert _queued(port) == 0
        body = {
            "model": "m",
            "stream": True,
            "max_tokens": 3,
            "messages": [{"role": "user", "content": "word " * 200}],
        }
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            first = resp.readline()
            assert b'"role"' in first and b'"content": ""' in first
            # the engine holds the first token for 1 s: the prompt is still queued there
            during = _queued(port)
            rest = resp.read()
        assert during >= 200  # ~1,000 bytes of text at 4 a token
        assert rest.count(b"tok") == 3 and rest.endswith(b"data: [DONE]\n\n")
        assert _queued(port) == 0
    finally:
        gw.stop()
        back.stop()
