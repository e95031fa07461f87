"""`kvtide engine`'s usage counts the prompt tokens a prefill wrote to the prefix cache, as
vLLM 0.33 does (``PrefillStats.finalize``: the prompt's whole blocks less those it found
cached): a chat's ``created_cache_tokens``, a Responses answer's ``cache_write_tokens``, a
Messages answer's ``cache_creation_input_tokens`` (its ``input_tokens`` then exclude them);
a completion's usage has no such field, as vLLM's."""

from __future__ import annotations

from typing import Any

import pytest
from engine_process import post_json, running_engine

pytestmark = pytest.mark.timeout(120)

BLOCK = 16
SHARED = "a long shared system prompt about tides and harbours " * 12


def _asked(api: str, text: str) -> tuple[str, dict[str, Any]]:
    said = [{"role": "user", "content": text}]
    if api == "chat":
        return "/v1/chat/completions", {"model": "emu", "messages": said, "max_tokens": 2}
    if api == "messages":
        return "/v1/messages", {"model": "emu", "messages": said, "max_tokens": 2}
    if api == "responses":
        return "/v1/responses", {"model": "emu", "input": said, "max_output_tokens": 2}
    return "/v1/completions", {"model": "emu", "prompt": text, "max_tokens": 2}


def _counts(api: str, use: dict[str, Any]) -> tuple[int, int, int | None]:
    """(prompt tokens, cached, written) from each API's usage."""
    if api == "messages":
        cached, written = use["cache_read_input_tokens"], use["cache_creation_input_tokens"]
        return use["input_tokens"] + cached + written, cached, written
    if api == "responses":
        details = use["input_tokens_details"]
        return use["input_tokens"], details["cached_tokens"], details["cache_write_tokens"]
    details = use["prompt_tokens_details"]
    return use["prompt_tokens"], details["cached_tokens"], details.get("created_cache_tokens")


@pytest.mark.parametrize("api", ["chat", "messages", "responses", "completions"])
def test_a_prefill_reports_what_it_wrote_and_a_repeat_what_it_found(api: str) -> None:
    with running_engine("--served-model-name", "emu", "--speedup", "50") as eng:
        seen = []
        longer = SHARED + "A second, different and longer question about the sea?"
        for text in (SHARED + "First question?", SHARED + "First question?", longer):
            path, body = _asked(api, text)
            status, answer = post_json(eng.url + path, body)
            assert status == 200, answer
            seen.append(_counts(api, answer["usage"]))
    (p1, c1, w1), (p2, c2, w2), (p3, c3, w3) = seen
    if api == "completions":
        assert (w1, w2, w3) == (None, None, None)
        assert (c1, c2) == (0, p1 // BLOCK * BLOCK)
        return
    assert (c1, w1) == (0, p1 // BLOCK * BLOCK)  # nothing found, every whole block written
    assert (c2, w2) == (p2 // BLOCK * BLOCK, 0)  # the same prompt: found, nothing written
    assert 0 < c3 < p3 // BLOCK * BLOCK  # the shared blocks found, the new ones written
    assert w3 == p3 // BLOCK * BLOCK - c3
