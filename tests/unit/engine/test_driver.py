"""The drive loop on round numbers: 1 ms per prefill token, 10 ms per decode step, 4-token
blocks. Wake-ups come on time, early and late, as a wall-clock task's would."""

from __future__ import annotations

import pytest

from kvtide.clock import ManualClock
from kvtide.engine.driver import EngineDriver, StepOutput

from .conftest import make_engine, request


def run_until_idle(driver: EngineDriver, late_s: float = 0.0) -> list[StepOutput]:
    """Calls ``on_wake`` at every ``next_wake_s`` (plus ``late_s``) until nothing is left."""
    outputs: list[StepOutput] = []
    while (due := driver.next_wake_s) is not None:
        outputs.extend(driver.on_wake(due + late_s))
    return outputs


def test_every_token_of_a_fused_decode_run_comes_out_at_its_own_time(
    engine_clock: ManualClock,
) -> None:
    driver = EngineDriver(make_engine(engine_clock))
    req, hashes = request("a", list(range(1, 11)), output=4)
    driver.add(req, hashes, 0.0)
    assert driver.next_wake_s == pytest.approx(0.010)  # the 10-token prefill
    outputs = run_until_idle(driver)
    assert [o.num_generated for o in outputs] == [1, 2, 3, 4]
    assert [o.time_s for o in outputs] == pytest.approx([0.010, 0.020, 0.030, 0.040])
    assert [o.is_first_token for o in outputs] == [True, False, False, False]
    assert [o.finish_reason for o in outputs] == [None, None, None, "length"]
    record = outputs[-1].record
    assert record is not None and record.finish_s == pytest.approx(0.040)
    assert driver.next_wake_s is None and not driver.has_work


def test_late_wake_ups_keep_the_model_timeline(engine_clock: ManualClock) -> None:
    on_time = EngineDriver(make_engine(ManualClock()))
    late = EngineDriver(make_engine(ManualClock()))
    for driver in (on_time, late):
        req, hashes = request("a", list(range(1, 11)), output=5)
        driver.add(req, hashes, 0.0)
    expected = run_until_idle(on_time)
    got = run_until_idle(late, late_s=0.004)  # a timer that fires 4 ms late every time
    assert [(o.num_generated, o.time_s) for o in got] == [
        (o.num_generated, o.time_s) for o in expected
    ]


def test_one_very_late_wake_up_reports_everything_due(engine_clock: ManualClock) -> None:
    driver = EngineDriver(make_engine(engine_clock))
    req, hashes = request("a", list(range(1, 11)), output=3)
    driver.add(req, hashes, 0.0)
    outputs = driver.on_wake(1.0)
    assert [o.time_s for o in outputs] == pytest.approx([0.010, 0.020, 0.030])
    assert outputs[-1].finish_reason == "length"


def test_an_early_wake_up_reports_nothing_new(engine_clock: ManualClock) -> None:
    driver = EngineDriver(make_engine(engine_clock))
    req, hashes = request("a", list(range(1, 11)), output=3)
    driver.add(req, hashes, 0.0)
    assert driver.on_wake(0.005) == []
    assert driver.next_wake_s == pytest.approx(0.010)
    (first,) = driver.on_wake(0.010)
    assert first.is_first_token
    assert driver.on_wake(0.015) == []  # mid-step: the second token is not out yet


def test_an_arrival_during_a_decode_run_joins_at_the_next_step(
    engine_clock: ManualClock,
) -> None:
    driver = EngineDriver(make_engine(engine_clock))
    a, ha = request("a", list(range(1, 5)), output=10)
    driver.add(a, ha, 0.0)
    driver.on_wake(0.004)  # a's first token; a decode run of 9 steps is planned
    b, hb = request("b", list(range(101, 105)), output=1)
    driver.add(b, hb, 0.021)  # during a's second decode step (0.014 .. 0.024)
    outputs = run_until_idle(driver)
    (b_first,) = [o for o in outputs if o.request_id == "b"]
    # b's 4-token prefill runs with a's next decode token from 0.024: 4 + 1 ms of compute.
    assert b_first.time_s == pytest.approx(0.024 + 0.005)
    assert b_first.finish_reason == "length"


def test_an_arrival_at_an_idle_engine_starts_it_at_its_arrival(
    engine_clock: ManualClock,
) -> None:
    driver = EngineDriver(make_engine(engine_clock))
    req, hashes = request("a", list(range(1, 11)), output=1)
    driver.add(req, hashes, 2.0)
    (out,) = run_until_idle(driver)
    assert out.time_s == pytest.approx(2.010)


def test_a_late_wake_up_never_starts_a_request_before_it_arrived(
    engine_clock: ManualClock,
) -> None:
    driver = EngineDriver(make_engine(engine_clock))
    a, ha = request("a", list(range(1, 11)), output=1)
    driver.add(a, ha, 0.0)  # a ends at 0.010
    b, hb = request("b", list(range(101, 105)), output=1)
    driver.add(b, hb, 0.013)  # before anyone called on_wake for a's end
    outputs = run_until_idle(driver)
    times = {o.request_id: o.time_s for o in outputs}
    assert times == pytest.approx({"a": 0.010, "b": 0.013 + 0.004})


def test_a_deferred_plan_is_the_plan_made_at_once(engine_clock: ManualClock) -> None:
    """The server hands out an iteration's tokens before planning the next: the same tokens
    at the same times, an arrival between the two included (it is planned without it)."""

    def run(defer: bool) -> list[tuple[str, int, float]]:
        driver = EngineDriver(make_engine(ManualClock()))
        a, ha = request("a", list(range(1, 11)), output=4)
        driver.add(a, ha, 0.0)
        out = driver.on_wake(0.011, defer_plan=defer)  # a's first token, 1 ms late
        b, hb = request("b", list(range(101, 105)), output=2)
        driver.add(b, hb, 0.012)  # before anyone asked for the next wake-up
        while (due := driver.next_wake_s) is not None:
            out.extend(driver.on_wake(due + 0.001, defer_plan=defer))
        return [(o.request_id, o.num_generated, o.time_s) for o in out]

    assert run(defer=True) == run(defer=False)


def test_a_deferred_plan_returns_one_iteration_at_a_time(engine_clock: ManualClock) -> None:
    driver = EngineDriver(make_engine(engine_clock))
    a, ha = request("a", list(range(1, 11)), output=1)
    b, hb = request("b", list(range(101, 105)), output=1)
    driver.add(a, ha, 0.0)
    driver.add(b, hb, 0.0)  # waits: a's prefill took the iteration in flight
    (first,) = driver.on_wake(1.0, defer_plan=True)
    assert first.request_id == "a" and first.time_s == pytest.approx(0.010)
    assert driver.next_wake_s == pytest.approx(0.014)  # b's iteration, planned now, is due
    (second,) = driver.on_wake(1.0, defer_plan=True)
    assert second.request_id == "b" and driver.next_wake_s is None


def test_cached_tokens_are_reported_on_the_first_token_as_vllm_does(
    engine_clock: ManualClock,
) -> None:
    driver = EngineDriver(make_engine(engine_clock))
    a, ha = request("a", list(range(1, 13)), output=1)
    driver.add(a, ha, 0.0)
    (cold,) = run_until_idle(driver)
    assert (cold.cached_tokens, cold.hit_tokens) == (0, 0)
    # The same 12 tokens again: all 3 blocks are cached, but vLLM caps a hit at prompt - 1
    # tokens in whole blocks, so it reports 8; the engine's own hit count says 12.
    b, hb = request("b", list(range(1, 13)), output=1)
    driver.add(b, hb, 1.0)
    (full,) = run_until_idle(driver)
    assert (full.cached_tokens, full.hit_tokens) == (8, 12)
    c, hc = request("c", [*range(1, 9), 90, 91], output=1)
    driver.add(c, hc, 2.0)
    (partial,) = run_until_idle(driver)
    assert (partial.cached_tokens, partial.hit_tokens) == (8, 8)


def test_without_streaming_only_first_tokens_and_finishes_come_out(
    engine_clock: ManualClock,
) -> None:
    driver = EngineDriver(make_engine(engine_clock), stream_tokens=False)
    req, hashes = request("a", list(range(1, 11)), output=6)
    driver.add(req, hashes, 0.0)
    wakes = []
    outputs = []
    while (due := driver.next_wake_s) is not None:
        wakes.append(due)
        outputs.extend(driver.on_wake(due))
    assert wakes == pytest.approx([0.010, 0.060])  # the prefill, then one fused run
    assert [(o.num_generated, o.finish_reason) for o in outputs] == [(1, None), (6, "length")]


def test_aborting_a_waiting_request_gives_back_nothing_it_never_took(
    engine_clock: ManualClock,
) -> None:
    engine = make_engine(engine_clock, max_num_seqs=1)
    driver = EngineDriver(engine)
    a, ha = request("a", list(range(1, 11)), output=2)
    b, hb = request("b", list(range(101, 111)), output=2)
    driver.add(a, ha, 0.0)
    driver.add(b, hb, 0.0)
    free = engine.cache.pool.num_free
    assert driver.abort("b", 0.001)
    assert not driver.abort("b", 0.001) and not driver.abort("nobody", 0.001)
    assert engine.cache.pool.num_free == free
    outputs = run_until_idle(driver)
    assert [(o.request_id, o.finish_reason) for o in outputs if o.request_id == "b"] == [
        ("b", "abort")
    ]
    assert engine.stats.num_aborted == 1 and engine.stats.num_finished == 1


def test_an_abort_mid_prefill_keeps_the_computed_blocks_cached_and_evictable(
    engine_clock: ManualClock,
) -> None:
    engine = make_engine(engine_clock, max_batched_tokens=4)
    driver = EngineDriver(engine)
    cache = engine.cache
    req, hashes = request("a", list(range(1, 11)), output=5)  # 3 blocks held, 2 of them full
    driver.add(req, hashes, 0.0)
    assert cache.pool.num_free == 64 - 3
    driver.on_wake(0.004)  # the first chunk computed block 0; the second is in flight
    assert driver.abort("a", 0.005)
    # Blocks 0 and 1 are cached (block 1's chunk was scheduled, so it is being computed);
    # the partial block's room went back to the pool; nothing stays locked.
    assert cache.num_cached_blocks == 2 and cache.pool.num_free == 62
    assert cache.num_evictable_blocks == 2 and cache.tree.num_locked_blocks == 0
    (aborted,) = run_until_idle(driver)
    assert aborted.finish_reason == "abort" and aborted.num_generated == 0
    assert cache.match(hashes, touch=False).num_blocks == 2
    assert not engine.has_work
    cache.pool.check()


def test_an_abort_mid_decode_ends_the_stream_and_frees_the_private_blocks(
    engine_clock: ManualClock,
) -> None:
    engine = make_engine(engine_clock)
    driver = EngineDriver(engine)
    a, ha = request("a", list(range(1, 9)), output=20)
    b, hb = request("b", list(range(101, 109)), output=20)
    driver.add(a, ha, 0.0)
    driver.add(b, hb, 0.0)
    # a prefills alone (8 ms: it started the idle engine), b's prefill joins a's first decode
    # step (9 ms), then both decode in one fused run: b's tokens at 0.017, 0.027, 0.037...
    before = driver.on_wake(0.040)
    assert [o.num_generated for o in before if o.request_id == "b"] == [1, 2, 3]
    assert driver.abort("b", 0.040)
    after = run_until_idle(driver)
    b_after = [o for o in after if o.request_id == "b"]
    assert [(o.finish_reason, o.time_s) for o in b_after] == [("abort", 0.040)]
    # The run was cut at the step in flight (ending 0.047): a goes on alone from there.
    assert [o.time_s for o in after if o.request_id == "a"][:2] == pytest.approx([0.047, 0.057])
    a_after = [o for o in after if o.request_id == "a"]
    assert a_after[-1].num_generated == 20 and a_after[-1].finish_reason == "length"
    # b's step in flight at the abort produced nothing: a's 19 decode tokens and b's 2.
    assert engine.stats.decode_tokens == 19 + 2
    cache = engine.cache
    # Only the four full prompt blocks stay, unlocked: every private block went back.
    assert cache.num_cached_blocks == 4 == cache.num_evictable_blocks
    assert cache.pool.num_free == 64 - 4


def test_an_engine_with_only_remote_kv_on_its_way_sleeps_until_it_arrives(
    engine_clock: ManualClock,
) -> None:
    scheduler = make_engine(engine_clock)
    scheduler.network_s = lambda tokens: 0.002 * tokens
    driver = EngineDriver(scheduler)
    req, hashes = request("d", list(range(1, 9)), output=2)
    driver.add(req, hashes, 0.0, remote_tokens=8)
    assert driver.next_wake_s == pytest.approx(0.016)  # 8 tokens over the NIC
    assert driver.on_wake(0.010) == []
    outputs = run_until_idle(driver, late_s=0.003)  # late timers keep the model's timeline
    assert [(o.num_generated, o.time_s) for o in outputs] == [
        (1, pytest.approx(0.017)),  # its last prompt token, computed once the KV is in
        (2, pytest.approx(0.027)),
    ]
    assert (outputs[0].cached_tokens, outputs[0].fetched_tokens) == (8, 8)


def test_remote_kv_arriving_mid_run_cuts_the_run_as_an_arrival_would(
    engine_clock: ManualClock,
) -> None:
    scheduler = make_engine(engine_clock)
    scheduler.network_s = lambda tokens: 0.002 * tokens
    driver = EngineDriver(scheduler)
    run, run_hashes = request("run", [90, 91, 92, 93, 94], output=10)
    driver.add(run, run_hashes, 0.0)
    driver.on_wake(0.012)
    req, hashes = request("d", list(range(1, 9)), output=1, arrival_s=0.012)
    driver.add(req, hashes, 0.012, remote_tokens=8)
    outputs = run_until_idle(driver)
    # d is admitted at the step boundary after its arrival (15 ms), its KV is in at 31 ms,
    # and it joins the step that starts at the boundary after that (35 ms)
    (first,) = [o for o in outputs if o.request_id == "d"]
    assert first.time_s == pytest.approx(0.035 + 0.002)
    times = [o.time_s for o in outputs if o.request_id == "run"]
    assert times[:4] == pytest.approx([0.015, 0.025, 0.035, 0.037])  # that step carries both


def test_a_request_waiting_for_held_blocks_starts_when_they_are_released(
    engine_clock: ManualClock,
) -> None:
    """A prefill engine's held blocks are in use: a request that needs them waits, and
    starts at the release, not at its next arrival or timer."""
    driver = EngineDriver(make_engine(engine_clock, capacity_blocks=4))
    req, hashes = request("p", list(range(1, 11)), output=1)  # 3 of the 4 blocks
    driver.add(req, hashes, 0.0, hold_kv=True)
    run_until_idle(driver)
    later, hashes = request("w", list(range(50, 58)), output=1, arrival_s=0.5)
    driver.add(later, hashes, 0.5)  # 8 + 1 tokens: 3 blocks, of which 1 is free
    assert driver.next_wake_s is None and driver.scheduler.num_waiting == 1
    assert driver.release_held("p", 0.7)
    outputs = run_until_idle(driver)
    assert [(o.request_id, o.time_s) for o in outputs] == [("w", pytest.approx(0.708))]
    assert not driver.release_held("p", 0.8)
