"""Engine stories on a ManualClock with round numbers: 1 ms per prefill token, 10 ms per
decode step, blocks of 4 tokens."""

from __future__ import annotations

import pytest

from kvtide.clock import ManualClock
from kvtide.core.events import BlockRemoved, BlockStored
from kvtide.core.hashing import BlockHashes
from kvtide.core.tiers import TieredCache, TieredCacheConfig, TierSpec
from kvtide.engine.prefix_source import Fetch
from kvtide.engine.scheduler import EngineConfig, RequestRecord, Scheduler
from kvtide.engine.timing import IterationTimer
from kvtide.errors import CapacityError, ConfigError, UsageError
from kvtide.types import Tier

from .conftest import BLOCK, FlatCost, drive, make_engine, request


def test_a_tiny_request_has_exact_timestamps_under_chunked_prefill(
    engine_clock: ManualClock,
) -> None:
    engine = make_engine(engine_clock, max_batched_tokens=8)
    req, hashes = request("a", list(range(1, 11)), output=3)
    engine.add(req, hashes)

    first = engine.schedule()
    assert first is not None
    assert [(s.request.request_id, n) for s, n in first.prefill] == [("a", 8)]
    engine_clock.set(first.end_s())
    assert engine.complete(first) == []
    assert engine_clock.now() == pytest.approx(0.008)

    second = engine.schedule()
    assert second is not None
    assert [n for _, n in second.prefill] == [2]
    engine_clock.set(second.end_s())
    assert engine.complete(second) == []

    run = engine.schedule()
    assert run is not None
    assert run.prefill == [] and run.num_steps == 2  # both remaining tokens in one event
    engine_clock.set(run.end_s())
    (record,) = engine.complete(run)
    assert record.first_token_s == pytest.approx(0.010)
    assert record.finish_s == pytest.approx(0.030)
    assert (record.prefill_tokens, record.hit_tokens, record.num_preemptions) == (10, 0, 0)
    assert not engine.has_work
    assert engine.cache.pool.num_free == 64 - 2  # the two full prompt blocks stay cached


def test_a_prefix_hit_shortens_prefill(engine_clock: ManualClock) -> None:
    engine = make_engine(engine_clock)
    a, ha = request("a", list(range(1, 11)), output=1)
    engine.add(a, ha)
    drive(engine, engine_clock)
    start = engine_clock.now()
    b, hb = request("b", [*range(1, 9), 50, 51, 52, 53], output=1, arrival_s=start)
    engine.add(b, hb)
    (record,) = drive(engine, engine_clock)
    assert record.hit_tokens == 8
    assert record.prefill_tokens == 4
    assert record.first_token_s - start == pytest.approx(0.004)


def test_a_fully_cached_prompt_still_computes_its_last_token(engine_clock: ManualClock) -> None:
    engine = make_engine(engine_clock)
    a, ha = request("a", list(range(1, 9)), output=1)
    engine.add(a, ha)
    drive(engine, engine_clock)
    b, hb = request("b", list(range(1, 9)), output=1, arrival_s=engine_clock.now())
    engine.add(b, hb)
    (record,) = drive(engine, engine_clock)
    assert (record.hit_tokens, record.prefill_tokens) == (8, 1)


def test_kv_exhaustion_preempts_the_newest_request_and_recomputes_it(
    engine_clock: ManualClock,
) -> None:
    engine = make_engine(engine_clock, capacity_blocks=6)
    a, ha = request("a", list(range(1, 9)), output=10)
    b, hb = request("b", list(range(101, 109)), output=10)
    engine.add(a, ha)
    engine.add(b, hb)
    records = {r.request_id: r for r in drive(engine, engine_clock)}
    ra, rb = records["a"], records["b"]
    # Both prefill together (16 ms), decode 4 steps until the 6 blocks are full, then b is
    # preempted: a finishes its last 5 steps alone.
    assert ra.first_token_s == rb.first_token_s == pytest.approx(0.016)
    assert ra.finish_s == pytest.approx(0.016 + 0.040 + 0.050)
    assert (ra.num_preemptions, rb.num_preemptions) == (0, 1)
    # b comes back with 5 tokens generated: one block of its prompt survived eviction, the
    # other 4 prompt tokens and the 5 generated ones are recomputed (9 ms), then 4 steps.
    assert rb.prefill_tokens == 8 + 9
    assert rb.finish_s == pytest.approx(ra.finish_s + 0.009 + 0.040)
    assert rb.first_token_s == pytest.approx(0.016)  # the first token was already out
    engine.cache.pool.check()
    assert engine.stats.num_preemptions == 1


def test_a_prefill_only_engine_ends_requests_at_their_first_token(
    engine_clock: ManualClock,
) -> None:
    engine = make_engine(engine_clock, prefill_only=True)
    req, hashes = request("a", list(range(1, 11)), output=50)
    engine.add(req, hashes)
    (record,) = drive(engine, engine_clock)
    assert record.first_token_s == record.finish_s == pytest.approx(0.010)


def test_a_prefilled_request_only_decodes(engine_clock: ManualClock) -> None:
    engine = make_engine(engine_clock)
    req, hashes = request("a", list(range(1, 11)), output=4)
    engine.add(req, hashes, arrival_s=0.0, first_token_s=0.0)
    (record,) = drive(engine, engine_clock)
    assert record.prefill_tokens == 0
    assert record.finish_s == pytest.approx(0.030)  # tokens 2, 3 and 4


def test_a_mixed_iteration_is_one_pass_over_all_its_tokens(engine_clock: ManualClock) -> None:
    engine = make_engine(engine_clock)
    a, ha = request("a", list(range(1, 5)), output=5)
    engine.add(a, ha)
    first = engine.schedule()
    assert first is not None
    engine_clock.set(first.end_s())
    engine.complete(first)
    b, hb = request("b", list(range(101, 121)), output=1, arrival_s=engine_clock.now())
    engine.add(b, hb)
    mixed = engine.schedule()
    assert mixed is not None
    assert len(mixed.decode) == 1 and [n for _, n in mixed.prefill] == [20]
    # 20 prefill tokens + 1 decode token of compute; FlatCost reads no memory
    assert mixed.end_s() - mixed.start_s == pytest.approx(0.021)


def test_a_block_is_announced_only_once_the_iteration_computing_it_completes(
    engine_clock: ManualClock,
) -> None:
    engine = make_engine(engine_clock, max_batched_tokens=4)
    req, hashes = request("a", list(range(1, 11)), output=1)  # blocks 0-3, 4-7; 8, 9 partial
    engine.add(req, hashes)
    announced: list[list[int]] = []
    for _ in range(3):  # chunks of 4, 4 and 2 tokens
        batch = engine.schedule()
        assert batch is not None
        assert engine.take_events() == [], "nothing is announced while the chunk runs"
        engine_clock.set(batch.end_s())
        engine.complete(batch)
        events = engine.take_events()
        assert all(isinstance(e, BlockStored) for e in events)
        announced.append([h for e in events for h in e.block_hashes])
    assert announced == [[hashes[0]], [hashes[1]], []]
    assert not engine.has_work


def test_a_hit_announces_only_the_blocks_it_computes(engine_clock: ManualClock) -> None:
    engine = make_engine(engine_clock)
    a, ha = request("a", list(range(1, 9)), output=1)
    engine.add(a, ha)
    drive(engine, engine_clock)
    engine.take_events()
    b, hb = request("b", [*range(1, 9), 50, 51, 52, 53], output=1, arrival_s=engine_clock.now())
    engine.add(b, hb)
    drive(engine, engine_clock)
    (stored,) = engine.take_events()
    assert isinstance(stored, BlockStored)
    assert list(stored.block_hashes) == [hb[2]] and stored.parent_block_hash == hb[1]


def test_a_request_that_cannot_fit_evicts_nothing(engine_clock: ManualClock) -> None:
    """51 blocks wanted, 12 free and 30 evictable: refused, and the 30-block cached prefix
    of an earlier request stays cached (it used to be flushed first and refused after)."""
    engine = make_engine(engine_clock, capacity_blocks=64, max_decode_steps=1)
    p, hp = request("p", list(range(1000, 1120)), output=1)  # 30 full blocks
    engine.add(p, hp)
    drive(engine, engine_clock)
    assert (engine.cache.num_cached_blocks, engine.cache.pool.num_free) == (30, 34)
    r, hr = request("r", list(range(1, 86)), output=50, arrival_s=engine_clock.now())
    engine.add(r, hr)  # 21 prompt blocks + 1 for the partial block and the next token
    batch = engine.schedule()
    assert batch is not None
    engine_clock.set(batch.end_s())
    engine.complete(batch)
    assert engine.cache.pool.num_free == 12
    engine.take_events()
    x, hx = request("x", list(range(5000, 5201)), output=3, arrival_s=engine_clock.now())
    engine.add(x, hx)  # 51 blocks
    batch = engine.schedule()
    assert batch is not None and [s.request.request_id for s in batch.decode] == ["r"]
    assert engine.num_waiting == 1
    assert engine.cache.match(hp, touch=False).num_blocks == 30
    assert engine.cache.pool.num_free == 12
    engine_clock.set(batch.end_s())
    engine.complete(batch)
    assert not [e for e in engine.take_events() if isinstance(e, BlockRemoved)]


def test_a_request_larger_than_the_cache_is_refused(engine_clock: ManualClock) -> None:
    engine = make_engine(engine_clock, capacity_blocks=2)
    req, hashes = request("a", list(range(1, 11)), output=1)
    with pytest.raises(CapacityError):
        engine.add(req, hashes)


def test_the_sequence_limit_holds_requests_back(engine_clock: ManualClock) -> None:
    engine = make_engine(engine_clock, max_num_seqs=1)
    for i in range(3):
        req, hashes = request(f"r{i}", [i * 10 + t for t in range(1, 5)], output=2)
        engine.add(req, hashes)
    records = drive(engine, engine_clock)
    assert [r.request_id for r in records] == ["r0", "r1", "r2"]
    assert [r.finish_s for r in records] == pytest.approx([0.014, 0.028, 0.042])


def test_engine_config_rejects_nonsense() -> None:
    with pytest.raises(ConfigError):
        EngineConfig(max_batched_tokens=0)


class TwoBlocksElsewhere:
    def fetch(self, hashes: BlockHashes, local_blocks: int) -> Fetch:
        return Fetch(2 - local_blocks, 0.003) if local_blocks < 2 else Fetch()


def test_blocks_fetched_from_elsewhere_count_as_hits_and_cost_their_transfer(
    engine_clock: ManualClock,
) -> None:
    engine = make_engine(engine_clock)
    engine.source = TwoBlocksElsewhere()
    req, hashes = request("a", list(range(1, 11)), output=1)
    engine.add(req, hashes)
    (record,) = drive(engine, engine_clock)
    assert (record.hit_tokens, record.fetched_tokens, record.prefill_tokens) == (8, 8, 2)
    assert record.first_token_s == pytest.approx(0.002 + 0.003)
    assert engine.stats.fetched_tokens == 8


def test_a_host_tier_catches_device_evictions_and_serves_them_back(
    engine_clock: ManualClock,
) -> None:
    tiers = TieredCache(
        TieredCacheConfig(
            device=TierSpec(4), host=TierSpec(16), block_tokens=BLOCK, record_events=True
        ),
        engine_clock,
    )
    engine = Scheduler(
        EngineConfig(), tiers.device, IterationTimer(FlatCost(), 0.0), engine_clock, tiers=tiers
    )
    records = {}
    for rid, first in (("a", 1), ("b", 101), ("c", 1)):
        req, hashes = request(rid, list(range(first, first + 12)), output=1)
        engine.add(req, hashes, arrival_s=engine_clock.now())
        (record,) = drive(engine, engine_clock)
        records[rid] = record
    # b's prompt pushed two of a's three blocks down to the host; c finds a's first block on
    # the device and the other two in host memory, reloads them, and computes its last token.
    c = records["c"]
    assert (c.hit_tokens, c.host_hit_tokens, c.prefill_tokens) == (12, 8, 1)
    assert records["b"].hit_tokens == 0
    host_events = [e for e in engine.take_events() if getattr(e, "tier", None) is Tier.HOST]
    assert host_events, "host-tier blocks are published too"


@pytest.mark.parametrize("budget", [8192, 12])
def test_two_requests_with_one_uncached_prefix_never_hold_it_twice(
    engine_clock: ManualClock, budget: int
) -> None:
    """Running requests' chunks enter the cache before new requests are admitted, and a
    prompt that does not fit the budget takes all of it: a request admitted with another's
    prefix still uncomputed finds that prefix's blocks scheduled (a same-iteration hit: the
    model lets it read what the other computes in that iteration). So the prefix is computed
    once and held once; no snapshot finds a duplicated block."""
    from kvtide.telemetry.fragmentation import snapshot

    engine = make_engine(engine_clock, capacity_blocks=64, max_batched_tokens=budget)
    prefix = list(range(100, 132))  # 8 full blocks
    for rid, tail in (("a", [1, 2]), ("b", [3, 4])):
        engine.add(*request(rid, prefix + tail, 4))
    duplicated = []
    while engine.has_work:
        batch = engine.schedule()
        assert batch is not None
        duplicated.append(snapshot(engine, 4).duplicated_blocks)
        engine_clock.set(batch.end_s())
        engine.complete(batch)
    assert set(duplicated) == {0}
    assert engine.stats.shared_prefill_blocks == 0
    assert engine.stats.hit_tokens == len(prefix)  # b found a's prefix


# --- disaggregated decode: a remote prefill's KV (vLLM's NixlConnector) -------------------------


def nic_engine(clock: ManualClock, **engine: object) -> Scheduler:
    """An engine whose NIC moves a token of KV in 2 ms."""
    scheduler = make_engine(clock, **engine)
    scheduler.network_s = lambda tokens: 0.002 * tokens
    return scheduler


def test_a_remote_prefill_loads_only_what_the_local_prefix_lacks_then_computes_one_token(
    engine_clock: ManualClock,
) -> None:
    engine = nic_engine(engine_clock)
    engine.add(*request("warm", list(range(1, 9)), output=1))  # caches blocks [1-4], [5-8]
    drive(engine, engine_clock)
    engine.take_events()
    t0 = engine_clock.now()
    prompt = [*range(1, 9), *range(50, 58), 60, 61]  # 4 full blocks and 2 tokens
    req, hashes = request("d", prompt, output=2, arrival_s=t0)
    engine.add(req, hashes, remote_tokens=len(prompt))

    # Admitted and parked: its 5 blocks held (2 cached, 3 reserved), no iteration to run,
    # the 10 tokens past the local hit on the NIC for 20 ms.
    assert engine.schedule() is None
    assert (engine.num_waiting, engine.num_running) == (1, 0)
    assert engine.next_ready_s == pytest.approx(t0 + 0.020)
    assert engine.cache.pool.num_free == 64 - 5

    engine_clock.set(t0 + 0.020)
    batch = engine.schedule()
    assert batch is not None
    assert [(s.request.request_id, n) for s, n in batch.prefill] == [("d", 1)]  # the last token
    engine_clock.set(batch.end_s())
    assert engine.complete(batch) == []
    seq = engine.running[0]
    # vLLM's counts: 8 local and 10 loaded tokens cached, the whole prompt
    assert (seq.cached_tokens, seq.fetched_tokens, seq.hit_tokens) == (18, 10, 18)
    stored = [e for e in engine.take_events() if isinstance(e, BlockStored)]
    assert [len(e.block_hashes) for e in stored] == [2]  # the two loaded full blocks
    (record,) = drive(engine, engine_clock)
    assert record.first_token_s == pytest.approx(t0 + 0.020 + 0.001)
    assert (record.prefill_tokens, record.fetched_tokens) == (1, 10)


def test_a_full_local_hit_still_loads_the_last_block_as_vllm_caps_the_local_hit(
    engine_clock: ManualClock,
) -> None:
    engine = nic_engine(engine_clock)
    prompt = list(range(1, 9))
    engine.add(*request("warm", prompt, output=1))
    drive(engine, engine_clock)
    t0 = engine_clock.now()
    req, hashes = request("d", prompt, output=1, arrival_s=t0)
    engine.add(req, hashes, remote_tokens=len(prompt))
    assert engine.schedule() is None
    assert engine.next_ready_s == pytest.approx(t0 + 0.002 * 4)  # prompt - 1 caps it at 1 block
    (record,) = drive_with_loads(engine, engine_clock)
    assert (record.hit_tokens, record.fetched_tokens, record.prefill_tokens) == (8, 4, 1)


def drive_with_loads(engine: Scheduler, clock: ManualClock) -> list[RequestRecord]:
    """``drive``, sleeping until parked KV arrives when nothing else can run."""
    records = []
    while engine.has_work:
        batch = engine.schedule()
        if batch is None:
            ready = engine.next_ready_s
            assert ready is not None and ready > clock.now()
            clock.set(ready)
            continue
        clock.set(batch.end_s())
        records.extend(engine.complete(batch))
    return records


def test_running_requests_keep_decoding_while_loads_take_turns_on_the_nic(
    engine_clock: ManualClock,
) -> None:
    engine = nic_engine(engine_clock, max_decode_steps=1)
    engine.add(*request("run", [90, 91, 92, 93, 94], output=8))
    first = engine.schedule()
    assert first is not None
    engine_clock.set(first.end_s())  # 5 ms of prefill
    engine.complete(first)
    for rid, base in (("d1", 10), ("d2", 30)):
        req, hashes = request(rid, list(range(base, base + 8)), output=1, arrival_s=0.005)
        engine.add(req, hashes, remote_tokens=8)
    step = engine.schedule()
    assert step is not None
    assert step.decode == [engine.running[0]] and step.prefill == []  # no stall for the NIC
    assert step.end_s() - step.start_s == pytest.approx(0.010)
    # each load moves the 8 tokens (the local hit is empty), one after the other
    assert [s.ready_s for s in engine.loading] == pytest.approx([0.005 + 0.016, 0.005 + 0.032])
    records = drive_with_loads(engine, engine_clock)
    by_id = {r.request_id: r for r in records}
    # a loaded request joins the first iteration starting once its KV is in: d1's at 21 ms
    # joins the step from 25 ms (2 ms with its token), d2's at 37 ms the one from 37 ms
    assert by_id["d1"].first_token_s == pytest.approx(0.025 + 0.002)
    assert by_id["d2"].first_token_s == pytest.approx(0.037 + 0.002)


def test_a_parked_request_can_be_aborted_and_gives_its_blocks_back(
    engine_clock: ManualClock,
) -> None:
    engine = nic_engine(engine_clock)
    req, hashes = request("d", list(range(1, 11)), output=1)
    engine.add(req, hashes, remote_tokens=10)
    assert engine.schedule() is None and engine.loading
    assert engine.abort("d") is not None
    assert not engine.has_work and engine.next_ready_s is None
    assert engine.cache.pool.num_free == 64


def test_remote_tokens_are_checked_against_the_prompt_and_the_engine(
    engine_clock: ManualClock,
) -> None:
    req, hashes = request("d", list(range(1, 11)), output=1)
    with pytest.raises(UsageError):
        nic_engine(engine_clock).add(req, hashes, remote_tokens=11)
    with pytest.raises(UsageError):  # no network to load over
        make_engine(engine_clock).add(req, hashes, remote_tokens=10)


def test_a_held_prefill_keeps_every_block_until_released(engine_clock: ManualClock) -> None:
    """vLLM's ``delay_free_blocks``: a prefill whose KV a decode engine will read keeps its
    blocks, neither free nor evictable, past its end; released, its full prompt blocks stay
    cached and evictable and the rest go back to the pool."""
    engine = make_engine(engine_clock)
    req, hashes = request("p", list(range(1, 11)), output=1)  # 10 tokens + 1: 3 blocks
    engine.add(req, hashes, hold_kv=True)
    (record,) = drive(engine, engine_clock)
    assert record.request_id == "p" and not engine.has_work
    cache = engine.cache
    assert list(engine.held) == ["p"] and engine.held_blocks == 3
    assert (cache.pool.num_free, cache.num_evictable_blocks) == (64 - 3, 0)
    assert engine.release_held("p") and not engine.held and engine.held_blocks == 0
    assert (cache.pool.num_free, cache.num_evictable_blocks) == (64 - 2, 2)
    assert not engine.release_held("p")  # once
    # a request not held is released at its end, as before
    engine.add(*request("q", list(range(20, 30)), output=1, arrival_s=engine_clock.now()))
    drive(engine, engine_clock)
    assert not engine.held and cache.num_evictable_blocks == 4


def test_a_crash_lets_the_held_blocks_go(engine_clock: ManualClock) -> None:
    engine = make_engine(engine_clock)
    engine.add(*request("p", list(range(1, 11)), output=1), hold_kv=True)
    drive(engine, engine_clock)
    assert engine.drain() == []  # it finished: nothing to hand back
    assert not engine.held and engine.cache.pool.num_free == 64 - 2
