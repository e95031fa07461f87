from __future__ import annotations

import itertools
from collections import Counter, defaultdict

import numpy as np

from kvtide.types import Request
from kvtide.workloads.builtins import Agent, Burst, Chat, Mixed, Rag, Tenants

from .conftest import fields


def _head(request: Request, num_tokens: int) -> bytes:
    return np.asarray(request.token_ids)[:num_tokens].tobytes()


def test_same_seed_same_requests_other_seed_other_requests() -> None:
    chat = Chat(sessions=20, turns=3)

    def run(seed: int) -> list[tuple[object, ...]]:
        return [fields(r) for r in chat.generate(seed=seed, block_tokens=16)]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_each_chat_turn_extends_the_previous_prompt_and_output() -> None:
    by_session: defaultdict[str, list[Request]] = defaultdict(list)
    for request in Chat(sessions=30, turns=4).generate(seed=1, block_tokens=16):
        by_session[str(request.session_id)].append(request)

    num_pairs = 0
    for turns in by_session.values():
        assert [r.extra["turn"] for r in turns] == list(range(1, len(turns) + 1))
        for before, after in itertools.pairwise(turns):
            assert before.token_ids is not None and after.token_ids is not None
            assert after.arrival_s > before.arrival_s
            assert np.array_equal(after.token_ids[: before.prompt_tokens], before.token_ids)
            assert after.prompt_tokens > before.prompt_tokens + before.output_tokens
            num_pairs += 1
    assert num_pairs > 30


def test_sessions_share_a_few_system_prompts() -> None:
    chat = Chat(sessions=40, turns=1, system_prompts=3, system_tokens=400.0, user_tokens=50.0)
    heads = Counter(_head(r, 64) for r in chat.generate(seed=2, block_tokens=16))

    assert len(heads) == 3
    assert heads.most_common(1)[0][1] > 40 / 3  # Zipf: the first system prompt leads


def test_agent_scratchpads_grow_by_small_steps_seconds_apart() -> None:
    requests = [
        r for r in Agent(sessions=5).generate(seed=3, block_tokens=16) if r.session_id == "agent-0"
    ]

    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(requests)]
    assert len(requests) >= 2
    assert max(gaps) < 60.0
    assert all(b.prompt_tokens > a.prompt_tokens for a, b in itertools.pairwise(requests))


def test_rag_document_popularity_follows_zipf() -> None:
    rag = Rag(requests=2000, documents=100, zipf=1.1)
    retrieved: Counter[int] = Counter()
    for request in rag.generate(seed=4, block_tokens=16):
        documents = request.extra["documents"]
        assert isinstance(documents, tuple) and 1 <= len(documents) <= 3
        assert len(set(documents)) == len(documents)
        retrieved.update(documents)

    assert retrieved[0] > retrieved[4] > retrieved[49]
    assert retrieved[0] > 5 * retrieved[49]


def test_tenants_are_skewed_and_the_smallest_bursts() -> None:
    tenants = Tenants(tenants=3, sessions=120, burst_sessions=60, burst_at_s=200.0, burst_s=30.0)
    first_turns = [r for r in tenants.generate(seed=5, block_tokens=16) if r.extra["turn"] == 1]
    starts = Counter(r.tenant for r in first_turns)
    in_burst = Counter(r.tenant for r in first_turns if 200.0 <= r.arrival_s < 230.0)

    assert starts["t0"] > starts["t1"]  # 65 vs 33 steady sessions
    assert starts["t2"] == 22 + 60
    assert in_burst["t2"] >= 60 > in_burst["t0"]


def test_tenants_never_share_system_prompts() -> None:
    tenants = Tenants(tenants=2, sessions=20, burst_sessions=0)
    heads = {r.tenant: _head(r, 16) for r in tenants.generate(seed=0, block_tokens=16)}

    assert heads["t0"] != heads["t1"]


def test_burst_arrivals_crowd_into_the_on_phases() -> None:
    burst = Burst(duration_s=400.0, on_s=20.0, off_s=80.0, on_rate=5.0, off_rate=0.1)
    requests = list(burst.generate(seed=6, block_tokens=16))
    on = [r for r in requests if r.extra["is_burst"]]

    assert all(r.arrival_s % 100.0 < 20.0 for r in on)
    assert len(on) > 10 * (len(requests) - len(on))


def test_the_mix_has_one_tenant_per_component_in_arrival_order() -> None:
    requests = list(Mixed(scale=0.1, duration_s=120.0).generate(seed=0, block_tokens=16))

    assert {r.tenant for r in requests} == {"chat", "agent", "rag", "burst"}
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)
    assert len({r.request_id for r in requests}) == len(requests)
