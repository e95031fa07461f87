"""The engine under random arrivals and aborts (hypothesis): no block or lock leaks, every
request ends exactly once, tokens stream in order, and the KV events announce exactly the
blocks the device cache holds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvtide.core.hashing import hash_tokens
from kvtide.core.node import Node
from kvtide.core.tiers import TieredCache, TieredCacheConfig, TierSpec
from kvtide.costs.cost_model import CostModel
from kvtide.costs.specs import gpu_preset, model_preset
from kvtide.engine.driver import EngineDriver, StepOutput
from kvtide.engine.scheduler import EngineConfig, Scheduler
from kvtide.engine.timing import IterationTimer
from kvtide.types import Request, Tier

BLOCK = 2
COST = CostModel(model_preset("llama-3-8b"), gpu_preset("h100"))


requests = st.lists(
    st.tuples(
        st.lists(st.integers(0, 2), min_size=1, max_size=14),  # prompt: shared prefixes
        st.integers(1, 6),  # output tokens
        st.floats(0.0, 0.2),  # arrival
        st.one_of(st.none(), st.floats(0.0, 0.3)),  # abort time, if any
    ),
    min_size=1,
    max_size=12,
)


def cached_hashes(cache: KVCache) -> set[int]:
    out: set[int] = set()
    stack: list[Node] = [cache.tree.root]
    while stack:
        node = stack.pop()
        for child in node.children.values():
            out.update(cache.tree.hashes(child)[child.depth :].tolist())
            stack.append(child)
    return out


def apply(announced: set[int], events: list[KVEvent]) -> None:
    for e in events:
        if getattr(e, "tier", Tier.DEVICE) is not Tier.DEVICE:
            continue
        if isinstance(e, BlockStored):
            announced.update(e.block_hashes)
        elif isinstance(e, BlockRemoved):
            announced.difference_update(e.block_hashes)
        elif isinstance(e, AllBlocksCleared):
            announced.clear()


@settings(max_examples=150, deadline=None)
@given(
    requests,
    st.integers(12, 40),
    st.integers(2, 16),
    st.booleans(),
    st.booleans(),
)
def test_random_aborts_leak_nothing(
    reqs: list[tuple[list[int], int, float, float | None]],
    capacity: int,
    budget: int,
    tiered: bool,
    stream: bool,
) -> None:
    clock = ManualClock()
    timer = IterationTimer.from_cost_model(
        CostModel(model_preset("llama-3-8b"), gpu_preset("h100"))
    )
    config = EngineConfig(max_batched_tokens=budget, max_num_seqs=4)
    if tiered:
        tiers = TieredCache(
            TieredCacheConfig(
                device=TierSpec(capacity, "lru"),
                host=TierSpec(16, "lru"),
                block_tokens=BLOCK,
                record_events=True,
                ghost_blocks=0,
            ),
            clock,
        )
        cache = tiers.device
        engine = Scheduler(config, cache, timer, clock, tiers=tiers)
    else:
        cache = KVCache(CacheConfig(capacity, BLOCK, "lru", record_events=True), clock)
        engine = Scheduler(config, cache, timer, clock)
    driver = EngineDriver(engine, stream_tokens=stream)
    # (time, order, kind, index): arrivals before aborts at equal times
    agenda = sorted(
        [(at, 0, i) for i, (_, _, at, _) in enumerate(reqs)]
        + [(at + ab, 1, i) for i, (_, _, at, ab) in enumerate(reqs) if ab is not None]
    )
    announced: set[int] = set()
    outputs: dict[str, list[StepOutput]] = {f"r{i}": [] for i in range(len(reqs))}
    aborted: set[str] = set()

    def take(outs: list[StepOutput]) -> None:
        for out in outs:
            outputs[out.request_id].append(out)
        apply(announced, engine.take_events())

    def wake_until(t: float) -> None:
        while (due := driver.next_wake_s) is not None and due <= t:
            clock.set(max(clock.now(), due))
            take(driver.on_wake(due))

    for at, kind, i in agenda:
        wake_until(at)
        clock.set(max(clock.now(), at))
        rid = f"r{i}"
        tokens, output, _, _ = reqs[i]
        if kind == 0:
            req = Request(rid, at, len(tokens), output, BLOCK)
            driver.add(req, hash_tokens(tokens, BLOCK, seed=1), clock.now())
        elif driver.abort(rid, clock.now()):
            aborted.add(rid)
        # Blocks held: the cache's, plus every live request's private reservation.
        private = sum(len(s.private) for s in [*engine.running, *engine.waiting])
        assert cache.pool.num_used == cache.num_cached_blocks + private
        cache.pool.check()
    wake_until(float("inf"))
    take(driver.on_wake(clock.now()))

    assert not driver.has_work and driver.next_wake_s is None
    assert cache.pool.num_used == cache.num_cached_blocks, "no private block outlives its request"
    assert cache.tree.num_locked_blocks == 0, "no lock outlives its request"
    assert announced == cached_hashes(cache), "the events tell exactly what the cache holds"
    for i, (_, output, _, _) in enumerate(reqs):
        rid = f"r{i}"
        outs = outputs[rid]
        ends = [o for o in outs if o.finish_reason is not None]
        assert len(ends) == 1 and ends[0] is outs[-1], "a request ends once, last"
        assert (ends[0].finish_reason == "abort") == (rid in aborted)
        tokens_out = [o for o in outs if o.finish_reason != "abort"]
        if stream:
            assert [o.num_generated for o in tokens_out] == list(range(1, len(tokens_out) + 1))
        times = [o.time_s for o in tokens_out]
        assert times == sorted(times)
        if rid not in aborted:
            assert tokens_out[-1].num_generated == output
            assert tokens_out[0].is_first_token
    assert cache.evict(capacity) == len(announced), "every cached block is evictable"
    assert cache.pool.num_free == capacity
