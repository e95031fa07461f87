"""Chat requests rendered by kvtide as vLLM renders them, differentially: agent conversations
(tools, tool calls with JSON arguments, tool results, names, reasoning, documents,
``chat_template_kwargs``, text parts, ``add_generation_prompt`` off, ``continue_final_message``)
through vLLM's own request class, message parser and template call (under the peer-libraries
venv: ``KVTIDE_PEER_PYTHON``, built by bench/setup_peers.sh) and through kvtide's one parser,
as the emulated engine renders them and as the gateway's prefix cache tokenizes them turn by
turn. Skipped when that interpreter or a module is absent."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from peer_process import peer_python, run_peer
from tests.chat_templates import tool_tokenizer

from kvtide.errors import RequestError
from kvtide.gateway.prompts import PrefixTokenCache
from kvtide.text import Tokenizer, smollm2
from kvtide.text.chat_request import parse_chat_request

SCRIPT = Path(__file__).with_name("peer_chat_render.py")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WORDS = ["ship", "parcel", "Zürich", "42", "\n", "don't", "—", "émigré", "x", "{", '"q"']


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(1, n)))


def _tool(rng: random.Random, i: int) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": f"tool_{i}"}
    if rng.random() < 0.7:
        fn["description"] = _words(rng, 8)
    if rng.random() < 0.7:
        fn["parameters"] = {"type": "object", "properties": {"q": {"type": "string"}}}
    if rng.random() < 0.3:
        fn["strict"] = rng.random() < 0.5
    return {"type": "function", "function": fn}


def _arguments(rng: random.Random) -> Any:
    return rng.choice(
        [
            json.dumps({"q": _words(rng, 4), "n": rng.randint(0, 9)}),
            '{"q": "unclosed',  # malformed: vLLM renders {}
            "[1, 2]",  # not an object: {}
            "",
        ]
    )


def _content(rng: random.Random) -> Any:
    if rng.random() < 0.25:
        return [{"type": "text", "text": _words(rng, 6)} for _ in range(rng.randint(1, 3))]
    return _words(rng, 12)


def _turn(rng: random.Random, k: int) -> list[dict[str, Any]]:
    """A user message, then an assistant reply, possibly a tool call and its result."""
    user: dict[str, Any] = {"role": "user", "content": _content(rng)}
    if rng.random() < 0.2:
        user["name"] = "ana"
    out = [user]
    if rng.random() < 0.5:
        call = {"id": f"call_{k}", "type": "function",
                "function": {"name": "tool_0", "arguments": _arguments(rng)}}  # fmt: skip
        reply: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        if rng.random() < 0.3:
            reply["reasoning"] = _words(rng, 5)
        result = {"role": "tool", "tool_call_id": f"call_{k}", "content": _content(rng)}
        if rng.random() < 0.3:
            result["name"] = "tool_0"
        out += [reply, result]
    reply = {"role": "assistant", "content": _content(rng)}
    if rng.random() < 0.15:  # fields vLLM drops or ignores
        reply.update({"tool_calls": None, "reasoning_content": "old name", "refusal": None})
    out.append(reply)
    return out


def _conversations(seed: int, n: int) -> list[list[dict[str, Any]]]:
    """``n`` conversations, each its requests turn by turn (the history resent each time)."""
    rng = random.Random(seed)
    convs = []
    for c in range(n):
        base: dict[str, Any] = {"model": "m"}
        if rng.random() < 0.6:
            base["tools"] = [_tool(rng, i) for i in range(rng.randint(1, 2))]
        if rng.random() < 0.2:
            base["documents"] = [{"title": "doc", "text": _words(rng, 10)}]
        if rng.random() < 0.3:
            base["chat_template_kwargs"] = {"enable_thinking": rng.random() < 0.5}
        history: list[dict[str, Any]] = [{"role": "system", "content": f"agent {c % 3}"}]
        if rng.random() < 0.2:  # vLLM makes it a system message, merged with the first
            history.append({"role": "developer", "content": _words(rng, 6), "tools": []})
        requests = []
        for k in range(rng.randint(1, 4)):
            turn = _turn(rng, k)
            if rng.random() < 0.1:
                turn.insert(0, {"role": "developer", "content": "Be terse."})
            body = {**base, "messages": history + turn[:1]}
            if rng.random() < 0.1:
                body["add_generation_prompt"] = False
            requests.append(body)
            history = history + turn
        # an assistant prefill to continue
        requests.append(
            {**base, "messages": [*history, {"role": "user", "content": "go on"},
                                  {"role": "assistant", "content": "The answer is"}],
             "add_generation_prompt": False, "continue_final_message": True}
        )  # fmt: skip
        convs.append(requests)
    return convs


def _vllm(
    tok: Tokenizer,
    template: str,
    bodies: list[dict],
    tmp: Path,
    anthropic: bool = False,
    responses: bool = False,
) -> list[dict]:
    """vLLM's rendering of each body (``anthropic``: Messages requests, ``responses``:
    Responses requests, each converted first)."""
    peer_python()  # skipped without it, before any file is written
    (tmp / "tokenizer.json").write_text(tok.backend.to_str())
    spec = {"tokenizer_json": str(tmp / "tokenizer.json"), "special_tokens": tok.special_tokens,
            "template": template, "bodies": bodies, "anthropic": anthropic,
            "responses": responses}  # fmt: skip
    (tmp / "spec.json").write_text(json.dumps(spec))
    out: list[dict] = run_peer(SCRIPT, str(tmp / "spec.json"))
    return out


def compare_with_vllm(
    tok: Tokenizer,
    bodies: list[dict],
    expected: list[dict],
    convert: Callable[[dict], dict] | None = None,
) -> int:
    """Asserts that kvtide renders (the engine) and tokenizes (the gateway's prefix cache,
    turn after turn) each body as vLLM did (``expected``, from ``_vllm``), where neither
    refuses it, and that kvtide refuses only what vLLM refuses; ``convert``: the body to the
    chat request first (another API's conversion). The number of bodies compared."""
    cache = PrefixTokenCache(1_000_000)
    rendered = 0
    for body, want in zip(bodies, expected, strict=True):
        try:
            chat = body if convert is None else convert(body)
            engine_req = parse_chat_request(chat, media="refuse")
            gateway_req = parse_chat_request(chat, media="skip")
        except RequestError as exc:  # kvtide refuses only what vLLM refuses too
            assert "error" in want, (exc, body)
            continue
        if "error" in want:  # vLLM refuses more (its own checks): nothing to compare
            continue
        rendered += 1
        assert engine_req.render(tok) == want["text"], body
        assert cache.tokenize(tok, gateway_req).tolist() == want["ids"], body
    assert cache.hits > 0  # the conversations' turns reused their earlier messages' tokens
    return rendered


@pytest.mark.parametrize("template", ["tools", "smollm2"])
def test_kvtide_renders_and_tokenizes_chats_as_vllm(template: str, tmp_path: Path) -> None:
    tok = tool_tokenizer() if template == "tools" else smollm2()
    assert tok.chat_template is not None
    convs = _conversations(seed=11, n=40)
    bodies = [body for conv in convs for body in conv]
    expected = _vllm(tok, tok.chat_template.source, bodies, tmp_path)
    rendered = compare_with_vllm(tok, bodies, expected)
    assert rendered >= len(bodies) * 0.9  # the cases reached the template, not vLLM's refusals
    if template == "tools":  # the cases exercised what the tool template reads
        joined = "".join(w.get("text", "") for w in expected)
        for piece in ("Tools:", "<call>tool_0 {}", '<call>tool_0 {"q"', "Documents:", "<think>"):
            assert piece in joined, piece
