"""`kvtide serve --policy cost:deadline_k=K` orders the engines' waiting queues: each request
reaches its engine with vLLM's ``priority`` set to its deadline in Unix milliseconds (arrival
plus K of its own predicted prefills on that replica), replacing any priority the client sent;
a request whose prefix the chosen replica holds gets the earlier deadline. Without the option
the gateway leaves ``priority`` as the client sent it. Behind real `kvtide engine --scheduling-
policy priority` processes the official `openai` client is served throughout, and an engine
that refuses priorities (still FCFS) is served without them, the client none the wiser."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import pytest
from engine_process import Engine
from tests.integration.gateway.procs import (
    Proc,
    backend,
    backend_stats,
    emulated_engines,
    free_port,
    gateway,
    openai_client,
)

pytestmark = [pytest.mark.timeout(120)]

# long enough that its prefill (the default TTFT model's) is a good part of a second
HISTORY = "The harbour master logs every vessel's draught, cargo and berth. " * 400


def _gateway_over_backend(*extra: str) -> Iterator[tuple[str, int]]:
    port_b = free_port()
    be = backend(port_b, "m")
    gw: Proc | None = None
    try:
        port = free_port()
        gw = gateway(port, "--replica", f"http://127.0.0.1:{port_b}", *extra)
        yield f"http://127.0.0.1:{port}", port_b
    finally:
        if gw is not None:
            gw.stop()
        be.stop()


@pytest.fixture
def deadline_gateway() -> Iterator[tuple[str, int]]:
    yield from _gateway_over_backend("--policy", "cost:deadline_k=3")


@pytest.fixture
def plain_gateway() -> Iterator[tuple[str, int]]:
    yield from _gateway_over_backend("--policy", "cost")


def _complete(url: str, prompt: str, **extra: object) -> None:
    c = openai_client(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)
    r = c.completions.create(model="m", prompt=prompt, max_tokens=2, extra_body=extra or None)
    assert r.usage is not None


def test_the_gateway_sends_each_request_its_deadline_as_priority(
    deadline_gateway: tuple[str, int],
) -> None:
    url, port_b = deadline_gateway
    before_ms = time.time() * 1000
    _complete(url, HISTORY + "Which berth is free?", priority=-(10**9))
    # the same history and a new question: the replica holds the history, so this one's
    # prefill is short and its deadline earlier, though it arrived later
    _complete(url, HISTORY + "Which berth is free? And the tide at noon?")
    after_ms = time.time() * 1000
    first, second = [b["priority"] for b in backend_stats(port_b)["bodies"]]
    assert isinstance(first, int) and isinstance(second, int)
    assert before_ms - 1 <= first <= after_ms + 60_000, "Unix ms, not the client's value"
    assert before_ms - 1 <= second < first


def test_without_deadlines_the_clients_priority_passes_unchanged(
    plain_gateway: tuple[str, int],
) -> None:
    url, port_b = plain_gateway
    _complete(url, HISTORY, priority=7)
    _complete(url, HISTORY + "again")
    bodies = backend_stats(port_b)["bodies"]
    assert bodies[0]["priority"] == 7
    assert "priority" not in bodies[1]


@pytest.fixture
def priority_engines() -> Iterator[list[Engine]]:
    engines: list[Engine] = []
    try:
        engines += emulated_engines(2, "--scheduling-policy", "priority", "--max-num-seqs", "2")
        yield engines
    finally:
        for e in engines:
            e.stop()


@pytest.mark.slow
def test_engines_with_priority_scheduling_serve_the_deadlines(
    priority_engines: list[Engine],
) -> None:
    replicas = []
    for e in priority_engines:
        replicas += ["--replica", f"{e.url}=emu,events={e.events},replay={e.replay}"]
    port = free_port()
    gw = gateway(port, *replicas, "--tokenizer", "smollm2", "--policy", "cost:deadline_k=3")
    try:
        c = openai_client(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60
        )
        cached = []
        for turn in range(6):  # one conversation: each turn reuses the one before
            r = c.completions.create(
                model="emu", prompt=HISTORY + " more" * turn, max_tokens=2, extra_body={}
            )
            assert r.usage is not None and r.usage.prompt_tokens_details is not None
            cached.append(r.usage.prompt_tokens_details.cached_tokens or 0)
        assert cached[0] == 0 and all(c > 0 for c in cached[2:]), cached
    finally:
        gw.stop()


@pytest.mark.slow
def test_an_engine_that_refuses_priorities_is_served_without_them() -> None:
    """A fleet mid-rollout: one engine schedules by priority, one is still FCFS (vLLM's 400 for
    any priority). No client sees that 400: the request is routed again without a priority
    for the FCFS engine, which /ready then shows as not taking them."""
    engines: list[Engine] = []
    gw: Proc | None = None
    try:
        engines += emulated_engines(1)  # fcfs
        engines += emulated_engines(1, "--scheduling-policy", "priority")
        replicas = []
        for e in engines:
            replicas += ["--replica", f"{e.url}=emu,events={e.events},replay={e.replay}"]
        port = free_port()
        gw = gateway(port, *replicas, "--tokenizer", "smollm2", "--policy", "cost:deadline_k=3")
        url = f"http://127.0.0.1:{port}"
        c = openai_client(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
        fcfs = engines[0].url.removeprefix("http://")
        refused = False
        for i in range(24):  # distinct conversations: the cold hash spreads them over both
            r = c.completions.create(
                model="emu", prompt=f"Voyage {i}: " + HISTORY[: 400 + 37 * i], max_tokens=2
            )
            assert r.usage is not None and r.usage.completion_tokens == 2
            with urllib.request.urlopen(f"{url}/ready", timeout=5) as resp:
                ready = {x["id"]: x for x in json.load(resp)["replicas"]}
            refused = not ready[fcfs]["takes_priority"]
            if refused:
                break
        assert refused, "the FCFS engine never got a request"
        assert all(x["takes_priority"] for rid, x in ready.items() if rid != fcfs)
        # and it keeps serving through the gateway, now without priorities
        for i in range(4):
            r = c.completions.create(model="emu", prompt=f"After {i}: " + HISTORY, max_tokens=2)
            assert r.usage is not None
    finally:
        if gw is not None:
            gw.stop()
        for e in engines:
            e.stop()
