"""The engines' KV-event wire format: both event encodings, both hash kinds, bad input."""

from __future__ import annotations

import msgpack
import pytest

from kvtide.state.kv_wire import (
    EngineAllBlocksCleared,
    EngineBlockRemoved,
    EngineBlockStored,
    EngineEventBatch,
    KvEventFormatError,
    decode_batch,
    encode_batch,
    medium_tier,
    seq_bytes,
    seq_from_bytes,
)
from kvtide.types import Tier


def test_tagged_maps_as_vllm_and_sglang_send_them() -> None:
    payload = msgpack.packb(
        [
            1.5,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [b"\x01" * 32, b"\x02" * 32],
                    "parent_block_hash": None,
                    "token_ids": list(range(32)),
                    "block_size": 16,
                    "lora_id": None,
                    "medium": "GPU",
                    "group_idx": 0,  # newer vLLM fields are ignored
                },
                {"type": "BlockRemoved", "block_hashes": [-5], "medium": "CPU_PINNED"},
                {"type": "AllBlocksCleared"},
            ],
            3,
        ],
        use_bin_type=True,
    )
    batch = decode_batch(payload)
    assert batch.ts == 1.5 and batch.data_parallel_rank == 3
    stored, removed, cleared = batch.events
    assert isinstance(stored, EngineBlockStored) and stored.block_hashes[1] == b"\x02" * 32
    assert stored.token_ids == tuple(range(32)) and stored.block_size == 16
    assert removed == EngineBlockRemoved((-5,), "CPU_PINNED")
    assert cleared == EngineAllBlocksCleared()


def test_tagged_arrays_of_older_vllm() -> None:
    payload = msgpack.packb(
        [2.0, [["BlockStored", [7, 8], 6, list(range(32)), 16, None, "GPU"], ["AllBlocksCleared"]]]
    )
    batch = decode_batch(payload)
    assert batch.events[0] == EngineBlockStored((7, 8), 6, tuple(range(32)), 16, None, "GPU")
    assert batch.data_parallel_rank is None


@pytest.mark.parametrize("legacy", [False, True])
def test_encode_then_decode_is_the_identity(legacy: bool) -> None:
    batch = EngineEventBatch(
        3.0,
        (
            EngineBlockStored((1, 2), None, tuple(range(32)), 16, None, "GPU"),
            EngineBlockRemoved((2,), "GPU"),
            EngineAllBlocksCleared(),
        ),
    )
    assert decode_batch(encode_batch(batch, legacy_arrays=legacy)) == batch


def _stored(**fields: object) -> dict[str, object]:
    """A vLLM BlockStored map, ``fields`` replacing its defaults."""
    event: dict[str, object] = {
        "type": "BlockStored",
        "block_hashes": [1],
        "parent_block_hash": None,
        "token_ids": list(range(16)),
        "block_size": 16,
    }
    event.update(fields)
    return event


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",
        msgpack.packb({"ts": 1}),
        msgpack.packb([1.0, [{"type": "Nope"}]]),
        msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1.5]}]]),
        msgpack.packb(["x", []]),
        # values the block hashing or the index would refuse: the batch is malformed here
        # (its sequence kept), not an exception in the intake that ends it
        msgpack.packb([1.0, [_stored(token_ids=[-1] * 16)]]),
        msgpack.packb([1.0, [_stored(token_ids=[1 << 63] * 16)]]),
        msgpack.packb([1.0, [_stored(block_size=0)]]),
        msgpack.packb([1.0, [_stored(medium=["GPU"])]]),
        msgpack.packb([1.0, [_stored(lora_name=5)]]),
        msgpack.packb([1.0, [_stored(cache_salt={"a": 1})]]),
        msgpack.packb([1.0, [_stored(lora_id="x")]]),
        msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [1], "medium": 3}]]),
    ],
)
def test_bad_payloads_raise_a_format_error(payload: bytes) -> None:
    with pytest.raises(KvEventFormatError):
        decode_batch(payload)


def test_media_and_sequence_numbers() -> None:
    assert [medium_tier(m) for m in (None, "GPU", "CPU", "CPU_PINNED", "STORAGE", "DISK")] == [
        Tier.DEVICE,
        Tier.DEVICE,
        Tier.HOST,
        Tier.HOST,
        Tier.DISK,
        Tier.DISK,
    ]
    assert seq_bytes(5) == (5).to_bytes(8, "big")
    assert seq_from_bytes(seq_bytes(-1)) == -1


def test_vllm_sends_the_salt_in_the_first_blocks_extra_keys() -> None:
    """vLLM 0.33: untagged per-block extra keys, the salt after the LoRA name, first block only."""
    payload = msgpack.packb(
        [1.0, [
            {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None,
             "token_ids": list(range(32)), "block_size": 16, "lora_id": None, "medium": "GPU",
             "lora_name": None, "extra_keys": [["tenant-a"], None]},
            {"type": "BlockStored", "block_hashes": [3], "parent_block_hash": None,
             "token_ids": list(range(16)), "block_size": 16, "lora_id": 1, "medium": "GPU",
             "lora_name": "sql", "extra_keys": [["sql", ["img", 0], "tenant-b"]]},
            {"type": "BlockStored", "block_hashes": [4], "parent_block_hash": 3,
             "token_ids": list(range(16)), "block_size": 16, "lora_id": 1, "medium": "GPU",
             "lora_name": "sql", "extra_keys": [["sql"]]},
        ]]
    )  # fmt: skip
    salts = [e.cache_salt for e in decode_batch(payload).events]  # type: ignore[union-attr]
    assert salts == ["tenant-a", "tenant-b", None]


def test_each_dialect_spells_the_salt_as_its_engine_does() -> None:
    root = EngineBlockStored((1, 2), None, tuple(range(32)), 16, None, "GPU", None, "s1")
    child = EngineBlockStored((3,), 2, tuple(range(16)), 16, None, "GPU", None, "s1")
    batch = EngineEventBatch(1.0, (root, child))
    vllm = msgpack.unpackb(encode_batch(batch, dialect="vllm"))[1]
    assert vllm[0]["extra_keys"] == [["s1"], None] and "cache_salt" not in vllm[0]
    assert "extra_keys" not in vllm[1]  # the chain carries the salt on
    assert vllm[0]["lora_name"] is None  # vLLM's class requires the field
    sglang = msgpack.unpackb(encode_batch(batch, dialect="sglang"))[1]
    assert [e["cache_salt"] for e in sglang] == ["s1", "s1"]
    assert [e.cache_salt for e in decode_batch(encode_batch(batch, dialect="sglang")).events] == [  # type: ignore[union-attr]
        "s1",
        "s1",
    ]
    assert [e.cache_salt for e in decode_batch(encode_batch(batch)).events] == ["s1", None]  # type: ignore[union-attr]
