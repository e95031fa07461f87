"""`kvtide serve` with a tokenizer in front of two real `kvtide engine` processes: the
event-fed index matches the requests (the gateway predicts the hits the engines report),
tenants stay apart through the engines' own caches, and a kill -9 leaves no request hung."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_process import Engine
from tests.integration.gateway.conftest import KEYS, SECRET, write_keys
from tests.integration.gateway.procs import emulated_engines, free_port, gateway, openai_client

ADMIN = "admin-key-for-ready"

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

SYSTEM = "You are a meticulous assistant for a shipping company; answer briefly. " * 12


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[str, list[Engine]]]:
    engines: list[Engine] = []
    gw = None
    try:
        engines += emulated_engines(2)
        replicas = []
        for e in engines:
            assert e.events and e.replay, e.log
            replicas += ["--replica", f"{e.url}=emu,events={e.events},replay={e.replay}"]
        keys = write_keys(tmp_path / "keys.yaml", KEYS)
        port = free_port()
        gw = gateway(
            port,
            *replicas,
            "--tokenizer",
            "smollm2",
            "--api-keys",
            str(keys),
            "--tenant-secret",
            SECRET,
            "--admin-key",
            ADMIN,  # /ready shows the replicas' detail to its holder only, keys configured
        )
        yield f"http://127.0.0.1:{port}", engines
    finally:
        if gw is not None:
            gw.stop()
        for e in engines:
            e.stop()


def _chat(url: str, tenant: str, question: str, salt: str | None = None) -> int:
    c = openai_client(base_url=f"{url}/v1", api_key=KEYS[tenant], max_retries=0, timeout=30)
    r = c.chat.completions.create(
        model="emu",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=4,
        extra_body={"cache_salt": salt} if salt else {},
    )
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    return int(r.usage.prompt_tokens_details.cached_tokens or 0)


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_event_fed_index_predicts_the_engines_hits_and_tenants_stay_apart(
    fleet: tuple[str, list[Engine]],
) -> None:
    url, _ = fleet
    assert _chat(url, "alpha", "Where is parcel 1?") == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the engine's KV events reach the gateway's index
        req = urllib.request.Request(f"{url}/ready", headers={"Authorization": f"Bearer {ADMIN}"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            ready = json.load(resp)
        if sum(r["events"]["batches"] for r in ready["replicas"]) > 0:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"no KV events reached the gateway: {ready}")
    # the counter an operator reads says so too (it was declared and never counted)
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        counted = [
            float(line.rsplit(" ", 1)[1])
            for line in resp.read().decode().splitlines()
            if line.startswith("kvtide_gateway_kv_event_batches_total{")
        ]
    assert sum(counted) >= sum(r["events"]["batches"] for r in ready["replicas"]) > 0
    time.sleep(0.3)
    predicted_before = _metric(url, "kvtide_gateway_predicted_cached_tokens_total")
    timings = ("overhead_seconds_count", "overhead_seconds_sum", "first_byte_seconds_sum")
    before = [_metric(url, f"kvtide_gateway_{name}") for name in timings]
    cached = _chat(url, "alpha", "Where is parcel 2?")
    assert cached > 0
    # the gateway's own time, once for the request, is part of its time to the first byte
    count, own_s, first_byte_s = (
        _metric(url, f"kvtide_gateway_{n}") - b for n, b in zip(timings, before, strict=True)
    )
    assert count == 1 and 0 < own_s < first_byte_s, (count, own_s, first_byte_s)
    predicted = _metric(url, "kvtide_gateway_predicted_cached_tokens_total") - predicted_before
    # the gateway hashed the prompt as the engine did, in the namespace of the events
    assert predicted > 0
    assert abs(predicted - cached) <= 16 * 2, (predicted, cached)
    # two chats on one system prompt: its tokenization is held once, with each conversation's
    held = _metric(url, "kvtide_gateway_prefix_cache_tokens")
    assert 0 < held <= 2 * cached + 200 and _metric(url, "kvtide_gateway_prefix_cache_entries") >= 2
    for tenant, salt in (("beta", None), ("gamma", "anything")):
        assert _chat(url, tenant, "Where is parcel 2?", salt) == 0


def test_a_one_off_prompt_is_routed_on_its_head_and_a_follow_up_on_all_of_it(
    fleet: tuple[str, list[Engine]],
) -> None:
    """A long prompt no engine holds is tokenized only as far as the policy reads it (its
    head); the same document again, once the engine's events have landed, is matched in full:
    the gateway predicts the hit the engine reports, far past the head."""
    url, _ = fleet
    doc = " ".join(f"Manifest line {i}: crate {i * 7} to berth {i % 9}." for i in range(160))
    heads = _metric(url, "kvtide_gateway_prompt_heads_total")
    c = openai_client(base_url=f"{url}/v1", api_key=KEYS["alpha"], max_retries=0, timeout=30)

    def ask(question: str) -> tuple[int, int]:
        r = c.chat.completions.create(
            model="emu",
            messages=[{"role": "system", "content": doc}, {"role": "user", "content": question}],
            max_tokens=4,
        )
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        return r.usage.prompt_tokens, int(r.usage.prompt_tokens_details.cached_tokens or 0)

    prompt_tokens, cached = ask("Which berth has crate 70?")
    assert prompt_tokens > 3 * 256 and cached == 0
    assert _metric(url, "kvtide_gateway_prompt_heads_total") == heads + 1
    time.sleep(1.0)  # the engine's KV events reach the gateway's index
    predicted_before = _metric(url, "kvtide_gateway_predicted_cached_tokens_total")
    _, cached = ask("Which berth has crate 77?")
    predicted = _metric(url, "kvtide_gateway_predicted_cached_tokens_total") - predicted_before
    assert cached > 2 * 256, cached  # the document, past the head
    assert abs(predicted - cached) <= 16 * 2, (predicted, cached)
    assert _metric(url, "kvtide_gateway_prompt_heads_total") == heads + 1


def test_a_preamble_pasted_into_each_message_is_tokenized_once(
    fleet: tuple[str, list[Engine]],
) -> None:
    """One user message opening with the same long preamble, no system message: the
    conversation cache has nothing to reuse, the tokenizer's chunk memo does (counted on
    /metrics), and the prompt's identity is still the engine's (the hit it predicts is the
    hit the engine reports)."""
    url, _ = fleet
    preamble = " ".join(f"Clause {i}: goods to berth {i % 9} by day {i % 31}." for i in range(120))
    c = openai_client(base_url=f"{url}/v1", api_key=KEYS["alpha"], max_retries=0, timeout=30)

    def ask(question: str) -> int:
        r = c.chat.completions.create(
            model="emu",
            messages=[{"role": "user", "content": f"{preamble}\n{question}"}],
            max_tokens=4,
        )
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        return int(r.usage.prompt_tokens_details.cached_tokens or 0)

    ask("Which berth on day 3?")  # the memo's doorkeeper: seen once
    ask("Which berth on day 4?")  # seen twice: kept
    time.sleep(1.0)  # the engine's KV events reach the gateway's index
    hits = _metric(url, 'kvtide_gateway_chunk_memo_chunks_total{result="hit"}')
    predicted_before = _metric(url, "kvtide_gateway_predicted_cached_tokens_total")
    cached = ask("Which berth on day 5?")
    predicted = _metric(url, "kvtide_gateway_predicted_cached_tokens_total") - predicted_before
    assert _metric(url, 'kvtide_gateway_chunk_memo_chunks_total{result="hit"}') > hits
    assert _metric(url, "kvtide_gateway_chunk_memo_tokens") > 0
    assert cached > len(preamble) // 8, cached  # the preamble, on the engine that holds it
    assert abs(predicted - cached) <= 16 * 2, (predicted, cached)
