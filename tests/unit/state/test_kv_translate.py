"""Engine hashes to kvtide hashes through token ids; what cannot be placed is counted."""

from __future__ import annotations

from kvtide.core.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvtide.core.hashing import hash_tokens
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.state.kv_translate import (
    EngineEventSink,
    EventTranslator,
    from_native_events,
    to_engine_events,
)
from kvtide.state.kv_wire import (
    EngineAllBlocksCleared,
    EngineBlockRemoved,
    EngineBlockStored,
    EngineEventBatch,
)
from kvtide.types import BlockHash, ReplicaId, Tier

R = ReplicaId("r")
TOKS = tuple(range(500, 564))
OURS = hash_tokens(TOKS, 16, 1).tolist()


def _stored(
    hashes: tuple[int, ...], parent: int | None, start: int, medium: str = "GPU"
) -> EngineBlockStored:
    return EngineBlockStored(
        hashes, parent, TOKS[16 * start : 16 * (start + len(hashes))], 16, None, medium
    )


def test_chained_runs_get_the_routers_hashes() -> None:
    t = EventTranslator(16, 1)
    out = t.translate(R, [_stored((-1, -2), None, 0), _stored((-3,), -2, 2)])
    assert out == [
        BlockStored(tuple(OURS[:2]), None, None, 16, Tier.DEVICE, None),
        BlockStored(tuple(OURS[2:3]), OURS[1], None, 16, Tier.DEVICE, None),
    ]


def test_unknown_parents_block_sizes_and_removals_are_counted() -> None:
    t = EventTranslator(16, 1)
    assert t.translate(R, [_stored((9,), 8, 1)]) == []
    assert t.counters.unresolved_stores == 1
    assert t.translate(R, [EngineBlockStored((1,), None, TOKS[:8], 8)]) == []
    assert t.counters.skipped_block_size == 1
    assert t.translate(R, [EngineBlockStored((1,), None, TOKS[:8], 16)]) == []
    assert t.counters.malformed == 1
    assert t.translate(R, [EngineBlockRemoved((42,), "GPU")]) == []
    assert t.counters.unknown_removes == 1


def test_a_block_in_two_tiers_stays_mapped_until_both_remove_it() -> None:
    t = EventTranslator(16, 1)
    t.translate(R, [_stored((-1,), None, 0), _stored((-1,), None, 0, medium="CPU")])
    assert t.translate(R, [EngineBlockRemoved((-1,), "GPU")]) == [
        BlockRemoved((OURS[0],), Tier.DEVICE)
    ]
    assert t.num_mapped(R) == 1
    t.translate(R, [EngineBlockRemoved((-1,), "CPU")])
    assert t.num_mapped(R) == 0
    t.translate(R, [_stored((-1,), None, 0)])
    assert t.translate(R, [EngineAllBlocksCleared()]) == [AllBlocksCleared()]
    assert t.num_mapped(R) == 0


def test_sink_applies_batches_to_an_index_and_clears_both() -> None:
    index = GlobalPrefixIndex()
    sink = EngineEventSink(index, EventTranslator(16, 1))
    sink.apply(R, EngineEventBatch(0.0, (_stored((-1, -2, -3, -4), None, 0),)))
    assert index.match(hash_tokens(TOKS, 16, 1)).device == {R: 4}
    sink.clear(R)
    assert index.match(hash_tokens(TOKS, 16, 1)).device == {}
    assert sink.translator.num_mapped(R) == 0


def test_native_events_round_trip() -> None:
    events = [
        BlockStored((BlockHash(1), BlockHash(2)), None, None, 16, Tier.DEVICE, "ns"),
        BlockRemoved((BlockHash(2),), Tier.HOST),
        AllBlocksCleared(),
    ]
    assert from_native_events(to_engine_events(events)) == events


def test_a_continuation_without_its_salt_is_hashed_in_its_parents_namespace() -> None:
    """As vLLM sends it: the salt on the request's first run only."""
    seeds = {None: 1, "a": 2}
    t = EventTranslator(16, lambda e: seeds[e.cache_salt])
    root = EngineBlockStored((-1, -2), None, TOKS[:32], 16, None, "GPU", None, "a")
    child = EngineBlockStored((-3,), -2, TOKS[32:48], 16, None, "GPU", None, None)
    out = t.translate(R, [root, child])
    salted = hash_tokens(TOKS[:48], 16, 2).tolist()
    assert [h for e in out for h in e.block_hashes] == salted  # type: ignore[union-attr]
    assert salted[:3] != OURS[:3]
