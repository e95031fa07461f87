"""Policies as stories: which replica each picks, and why (RouteDecision.reason)."""

from __future__ import annotations

import pytest

from kvtide.clock import ManualClock
from kvtide.errors import ConfigError
from kvtide.routing.chash import HashRing, prefix_key, rendezvous_top
from kvtide.routing.consistency import IndexHealth
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.routing.policies import RoutingContext
from kvtide.routing.registry import NEEDS_INDEX, POLICIES, make_policy
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.routing.ttft import LinearTtftModel
from kvtide.types import ReplicaId, Tier

from .helpers import prompt

R = [ReplicaId(f"r{i}") for i in range(4)]


def _fleet() -> list[ReplicaState]:
    return [ReplicaState(r, capacity_blocks=1000) for r in R]


def _ctx(index: GlobalPrefixIndex | None = None, **kw: object) -> RoutingContext:
    kw.setdefault("clock", ManualClock())
    return RoutingContext(index=index or GlobalPrefixIndex(), **kw)  # type: ignore[arg-type]


def _req(ids: list[int], prompt_tokens: int | None = None) -> RouteRequest:
    p = prompt(ids)
    return RouteRequest(p, prompt_tokens or 16 * len(ids), 16, request_id=str(ids))


def test_every_registered_policy_routes_somewhere_healthy() -> None:
    for name in POLICIES:
        policy = make_policy(name, _ctx())
        reps = _fleet()
        reps[0].healthy = False
        d = policy.choose(_req([1, 2, 3]), reps)
        assert d.replica in R[1:] and d.policy == name


def test_index_policies_say_they_need_an_index() -> None:
    for name in NEEDS_INDEX:
        with pytest.raises(ConfigError, match="needs an index"):
            make_policy(name, RoutingContext(clock=ManualClock()))


def test_round_robin_and_least_load() -> None:
    rr = make_policy("round_robin", RoutingContext(clock=ManualClock()))
    reps = _fleet()
    assert [rr.choose(_req([1]), reps).replica for _ in range(5)] == [*R, R[0]]
    ll = make_policy("least_load", RoutingContext(clock=ManualClock()))
    reps[0].queued_prefill_tokens = 100
    reps[1].decode_tokens = 50
    reps[2].queued_prefill_tokens = 10
    reps[3].decode_tokens = 20
    assert ll.choose(_req([1]), reps).replica == R[2]


def test_precise_follows_the_longest_held_prefix() -> None:
    idx = GlobalPrefixIndex()
    p = prompt(list(range(8)))
    idx.add(R[1], p[:3])
    idx.add(R[2], p[:6])
    d = make_policy("precise", _ctx(idx)).choose(_req(list(range(8))), _fleet())
    assert (d.replica, d.reason, d.cached_blocks, d.cached_tokens) == (R[2], "affinity", 6, 96)


def test_precise_respects_the_load_cap_and_sends_cold_prefixes_by_hash() -> None:
    idx = GlobalPrefixIndex()
    p = prompt(list(range(8)))
    idx.add(R[1], p[:3])
    idx.add(R[2], p[:6])
    policy = make_policy("precise", _ctx(idx), {"epsilon": 0.25})
    reps = _fleet()
    reps[2].num_requests = 4  # total 5 with the new one: cap = ceil(1.25 * 5 / 4) = 2
    d = policy.choose(_req(list(range(8))), reps)
    assert (d.replica, d.cached_blocks) == (R[1], 3)
    cold = _req([99, 98])
    d = policy.choose(cold, reps)
    ring = HashRing(R)
    assert d.reason == "cold"
    assert d.replica == next(r for r in ring.walk(prefix_key(cold, 16)) if r != R[2])


def test_precise_falls_back_to_chash_while_the_index_is_untrusted() -> None:
    idx = GlobalPrefixIndex()
    idx.add(R[1], prompt([1, 2]))
    health = IndexHealth()
    policy = make_policy("precise", _ctx(idx, health=health))
    assert policy.choose(_req([1, 2]), _fleet()).replica == R[1]
    health.gap(R[3], 1)
    d = policy.choose(_req([1, 2]), _fleet())
    assert d.reason == "fallback"
    assert d.replica == HashRing(R).owner(prefix_key(_req([1, 2]), 16))
    health.repaired(R[3])
    assert policy.choose(_req([1, 2]), _fleet()).reason == "affinity"


def test_approx_learns_from_its_own_decisions_and_forgets_after_the_ttl() -> None:
    clock = ManualClock()
    policy = make_policy(
        "approx", RoutingContext(clock=clock), {"capacity_blocks": 100, "ttl_s": 10.0}
    )
    reps = _fleet()
    first = policy.choose(_req([1, 2, 3]), reps)
    assert first.reason == "cold"
    policy.on_dispatch(_req([1, 2, 3]), first)
    reps[[r.replica_id for r in reps].index(first.replica)].num_requests = 0
    again = policy.choose(_req([1, 2, 3, 4]), reps)
    assert (again.replica, again.reason, again.cached_blocks) == (first.replica, "affinity", 3)
    clock.advance(11.0)
    assert policy.choose(_req([1, 2, 3, 4]), reps).reason == "cold"


def test_approx_shadow_caches_evict_lru_at_capacity() -> None:
    policy = make_policy(
        "approx", RoutingContext(clock=ManualClock()), {"capacity_blocks": 4, "ttl_s": None}
    )
    reps = _fleet()[:1]
    for ids in ([1, 2, 3], [7, 8]):
        policy.on_dispatch(_req(ids), policy.choose(_req(ids), reps))
    # [1,2,3] then [7,8] in 4 blocks: the LRU tail block of [1,2,3] went
    assert policy.choose(_req([1, 2, 3]), reps).cached_blocks == 2
    assert policy.choose(_req([7, 8]), reps).cached_blocks == 2


def test_cost_weighs_cached_tokens_against_queues_in_seconds() -> None:
    idx = GlobalPrefixIndex()
    ids = list(range(64))  # 1024 tokens
    p = prompt(ids)
    idx.add(R[1], p)
    model = LinearTtftModel(tokens_per_s=1000.0, overhead_s=0.0)
    policy = make_policy("cost", _ctx(idx, ttft_model=model))
    reps = _fleet()
    d = policy.choose(_req(ids), reps)
    assert (d.replica, d.ttft_s, d.cached_tokens) == (R[1], 0.0, 1024)
    reps[1].queued_prefill_tokens = 2000  # 2 s of queue beats 1.024 s of recompute elsewhere
    d = policy.choose(_req(ids), reps)
    assert d.replica != R[1] and d.ttft_s == pytest.approx(1.024)


def test_cost_evict_weight_keeps_a_half_cached_prompt_off_an_idle_replica() -> None:
    idx = GlobalPrefixIndex()
    ids = list(range(64))  # 1024 tokens, the first 640 held by r1, which runs 2 requests
    idx.add(R[1], prompt(ids[:40]))
    model = LinearTtftModel(tokens_per_s=1000.0, overhead_s=0.0)
    reps = _fleet()
    reps[1].num_requests = 2
    # myopic (without the holder rule, which would keep it on r1 whatever the weight where
    # the others' KV is full):
    # 3 x 0.384 s on r1 (its prefill delays the two running) > 1.024 s on an idle one
    no_holder = {"affinity_share": 0.0}
    myopic = make_policy("cost", _ctx(idx, ttft_model=model), no_holder).choose(_req(ids), reps)
    assert myopic.replica != R[1]
    # each token written evicts one a later request recomputes: r1 writes 384, the others 1024
    policy = make_policy("cost", _ctx(idx, ttft_model=model), {"evict_weight": 1.0, **no_holder})
    d = policy.choose(_req(ids), reps)
    assert d.replica == R[1]
    assert d.ttft_s == pytest.approx(0.384) and d.score == pytest.approx(3 * 0.384 + 0.384)
    with pytest.raises(ConfigError, match="evict_weight"):
        make_policy("cost", _ctx(idx), {"evict_weight": -1.0})


def test_cost_counts_onboarding_from_lower_tiers() -> None:
    idx = GlobalPrefixIndex()
    ids = list(range(64))
    p = prompt(ids)
    idx.add(R[0], p[:16])
    idx.add(R[2], p[:32], Tier.HOST)
    model = LinearTtftModel(
        tokens_per_s=1000.0, overhead_s=0.0, kv_bytes_per_token=1000, host_bytes_per_s=1e6
    )
    d = make_policy("cost", _ctx(idx, ttft_model=model)).choose(_req(ids), _fleet())
    # r0: 768 tokens to compute = 0.768 s; r2: reload 512 tokens (0.512 s) while computing
    # 512 (0.512 s) -> 0.512 s
    assert (d.replica, d.onboard_blocks, d.cached_blocks) == (R[2], 32, 32)
    assert d.ttft_s == pytest.approx(0.512)


def test_cost_spreads_a_hot_prefix_over_rendezvous_replicas() -> None:
    idx = GlobalPrefixIndex()
    ids = list(range(20))
    idx.add(R[0], prompt(ids))
    policy = make_policy("cost", _ctx(idx), {"epsilon": 10.0})
    reps = _fleet()
    chosen = set()
    for _ in range(12):
        d = policy.choose(_req(ids), reps)
        policy.on_dispatch(_req(ids), d)
        reps[R.index(d.replica)].num_requests += 1
        chosen.add(d.replica)
        if d.reason == "hot":
            idx.add(d.replica, prompt(ids))
    assert len(chosen) > 1
    assert len(chosen) == 4
    for r in R:
        for _ in range(3):
            policy.on_complete(_req(ids), r)
    assert policy._inflight == {}  # type: ignore[attr-defined]
    assert policy._inflight_at == {}  # type: ignore[attr-defined]
    assert policy._inflight_full == {}  # type: ignore[attr-defined]
    assert policy._inflight_hold == {}  # type: ignore[attr-defined]
    assert policy._holds_of == {}  # type: ignore[attr-defined]


def test_cost_spreads_a_hot_prefix_its_one_holder_would_keep() -> None:
    # requests share a 40-block prefix, each with its own question: they must not all stay on
    # the one replica holding the prefix, although it holds more than the 16-block hot key (as
    # a session's history would), so the spread set always keeps it; the holder rule, which
    # would keep them there, leaves hot decisions to the cost (docs/gateways.md, run 5)
    idx = GlobalPrefixIndex()
    hot = list(range(40))
    policy = make_policy("cost", _ctx(idx), {"epsilon": 10.0})
    reps = _fleet()
    home = policy.choose(_req(hot), reps).replica  # where chash puts it cold
    idx.add(home, prompt(hot))
    chosen = []
    for i in range(12):
        req = _req([*hot, 1000 + i])
        d = policy.choose(req, reps)
        policy.on_dispatch(req, d)
        reps[R.index(d.replica)].num_requests += 1
        chosen.append(d.replica)
    assert len(set(chosen)) >= 3, chosen
    assert chosen.count(home) <= 6, chosen


def test_two_hot_prefixes_whose_homes_overlap_leave_no_replica_idle() -> None:
    # two hot prefixes, each half the load, each live on their ceil(load / share) = 3
    # replicas of highest rendezvous weight; where those are the same 3 (1 in 4 pairs), the
    # fourth must still take the overflow (a fleet of 4 with one engine idle beside queues
    # was measured live: bench/gateways.py, hot phase)
    idx = GlobalPrefixIndex()

    def homes(start: int) -> set[ReplicaId]:
        return set(rendezvous_top(prefix_key(_req(list(range(start, start + 40))), 16), R, 3))

    # two 40-block prefixes with the same top-3 homes (searched, deterministic)
    a, b = next(
        (a, b)
        for a in range(0, 100_000, 1000)
        for b in range(a + 1000, a + 20_000, 1000)
        if homes(a) == homes(b)
    )
    pa, pb = list(range(a, a + 40)), list(range(b, b + 40))
    policy = make_policy("cost", _ctx(idx), {"epsilon": 10.0})
    reps = _fleet()
    for p, holder in zip((pa, pb), sorted(homes(a))[:2], strict=True):  # each held by a home
        idx.add(holder, prompt(p))
    counts = dict.fromkeys(R, 0)
    for i in range(24):
        req = _req([*(pa if i % 2 else pb), 5000 + i])
        d = policy.choose(req, reps)
        policy.on_dispatch(req, d)
        reps[R.index(d.replica)].num_requests += 1
        counts[d.replica] += 1
    (outside,) = set(R) - homes(a)
    assert counts[outside] > 0, counts
    assert max(counts.values()) - min(counts.values()) <= 3, counts


def test_cost_keeps_a_session_where_its_history_is_while_spreading_its_system_prompt() -> None:
    idx = GlobalPrefixIndex()
    system = list(range(16))  # the hot key: 16 shared blocks
    policy = make_policy("cost", _ctx(idx), {"epsilon": 10.0})
    reps = _fleet()
    # many sessions share the system prompt; r2 holds one session's history
    for i in range(12):
        req = _req([*system, 1000 + i])
        d = policy.choose(req, reps)
        policy.on_dispatch(req, d)
        reps[R.index(d.replica)].num_requests += 1
    session = [*system, 5000, 5001, 5002]
    idx.add(R[2], prompt(session))
    d = policy.choose(_req([*session, 5003]), reps)
    assert d.replica == R[2] and d.cached_blocks == 19


def test_peer_sglang_balances_when_loads_diverge() -> None:
    policy = make_policy("peer_sglang", RoutingContext(clock=ManualClock()), {"balance_abs": 2})
    reps = _fleet()
    d = policy.choose(_req([1, 2, 3]), reps)
    policy.on_dispatch(_req([1, 2, 3]), d)
    assert policy.choose(_req([1, 2, 3]), reps).replica == d.replica
    assert policy.choose(_req([1, 2, 3]), reps).reason == "affinity"
    reps[R.index(d.replica)].num_requests = 10
    low = policy.choose(_req([1, 2, 3]), reps)
    assert low.reason == "load" and low.replica != d.replica


def test_peer_dynamo_llmd_preble_use_the_index() -> None:
    idx = GlobalPrefixIndex()
    ids = list(range(10))
    idx.add(R[3], prompt(ids))
    reps = _fleet()
    for name in ("peer_dynamo", "peer_llmd"):
        assert make_policy(name, _ctx(idx)).choose(_req(ids), reps).replica == R[3]
    pre = make_policy("peer_preble", _ctx(idx), {"index": "precise"})
    d = pre.choose(_req(ids), reps)
    assert (d.replica, d.reason) == (R[3], "exploit")
    d = pre.choose(_req([*ids[:2], *range(100, 120)]), reps)  # 2 cached < 20 new: explore
    assert d.reason == "explore"


def test_peer_dynamo_samples_with_a_temperature() -> None:
    idx = GlobalPrefixIndex()
    idx.add(R[0], prompt([1, 2]))
    policy = make_policy("peer_dynamo", _ctx(idx), {"temperature": 5.0})
    seen = {policy.choose(_req([1, 2]), _fleet()).replica for _ in range(50)}
    assert len(seen) > 1


def test_cost_scores_in_seconds_from_the_core_cost_model() -> None:
    from kvtide.costs.cost_model import CostModel
    from kvtide.costs.specs import gpu_preset, model_preset

    model = CostModel(model_preset("llama-3-8b"), gpu_preset("h100"))
    idx = GlobalPrefixIndex()
    ids = list(range(512))  # 8192 tokens
    idx.add(R[3], prompt(ids)[:448])
    d = make_policy("cost", _ctx(idx, ttft_model=model)).choose(_req(ids), _fleet())
    assert d.replica == R[3] and d.cached_tokens == 448 * 16
    assert d.ttft_s == pytest.approx(model.prefill_time(1024, 448 * 16))


def test_cost_caps_load_in_seconds_of_work_not_in_requests() -> None:
    idx = GlobalPrefixIndex()
    ids = list(range(64))  # 1024 tokens
    idx.add(R[1], prompt(ids))
    model = LinearTtftModel(tokens_per_s=1000.0, overhead_s=0.0)
    reps = _fleet()
    reps[1].num_requests = 3  # three requests decoding, nothing left to prefill
    # by requests: ceil(1.25 x 4 / 4) = 2, so r1 is not eligible and the prefix is recomputed
    old = make_policy("cost", _ctx(idx, ttft_model=model), {"load": "requests"})
    assert old.choose(_req(ids), reps).replica != R[1]
    new = make_policy("cost", _ctx(idx, ttft_model=model))
    d = new.choose(_req(ids), reps)
    assert (d.replica, d.cached_tokens, d.reason) == (R[1], 1024, "affinity")


def test_cost_work_cap_is_mtz_on_seconds_plus_one_cold_prefill() -> None:
    model = LinearTtftModel(tokens_per_s=1000.0, overhead_s=0.0)
    policy = make_policy("cost", _ctx(ttft_model=model), {"epsilon": 0.5})
    reps = _fleet()
    for r, queued in zip(reps, (0, 1000, 3000, 5000), strict=True):
        r.queued_prefill_tokens = queued
    # s = 1 s; (1 + 0.5) x (9 s + 1 s) / 4 + 1 s = 4.75 s
    assert policy.work_cap_s(reps, 1000) == pytest.approx(4.75)  # type: ignore[attr-defined]
    eligible = policy.under_work_cap(reps, 1000)  # type: ignore[attr-defined]
    assert [r.replica_id for r in eligible] == R[:3]
    with pytest.raises(ConfigError, match="load"):
        make_policy("cost", _ctx(), {"load": "tokens"})
