"""The gateway's hidden usage (``gateway.usage``) on streams as vLLM and SGLang write them:
chunks built with their own protocol classes and serialized their way under the
peer-libraries venv (``KVTIDE_PEER_PYTHON``, built by bench/setup_peers.sh); their request
classes take the ``stream_options`` the gateway sends. Skipped when that interpreter or a
module is absent."""

from __future__ import annotations

from pathlib import Path

import pytest
from peer_process import run_peer

from kvtide.gateway.usage import USAGE_MARK, UsageHider, ask_usage, whole_events

SCRIPT = Path(__file__).with_name("peer_stream_chunks.py")
DONE = "data: [DONE]\n\n"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def peers() -> dict:
    chunks: dict = run_peer(SCRIPT, timeout_s=150)
    return chunks


def _relay(stream: bytes, cut: int) -> bytes:
    hider, out, held = UsageHider(), b"", b""
    for read in (stream[:cut], stream[cut:]):
        events, held = whole_events(held + read)
        if USAGE_MARK in events:
            events = hider.hide(events)
        out += events
    return out + held


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_engines_usage_chunk_is_dropped_and_its_tokens_pass_unchanged(
    peers: dict, engine: str
) -> None:
    chunks = peers[engine]
    body: dict = {"stream": True}
    ask_usage(body)
    # the engine's own request class takes what the gateway asks, as asked
    assert {k: chunks["accepted"][k] for k in body["stream_options"]} == body["stream_options"]
    tokens = "".join(chunks["plain"]).encode()
    stream = tokens + chunks["usage"].encode() + DONE.encode()
    for cut in range(0, len(stream), 7):  # the engine's writes split anywhere on the way
        assert _relay(stream, cut) == tokens + DONE.encode(), cut


def test_vllms_forced_usage_reaches_the_client_as_vllm_sent_it(peers: dict) -> None:
    """``--enable-force-include-usage``: usage in every chunk, asked or not."""
    forced = peers["vllm"]["forced"]
    stream = ("".join(forced) + peers["vllm"]["usage"] + DONE).encode()
    for cut in range(0, len(stream), 7):
        assert _relay(stream, cut) == stream, cut
