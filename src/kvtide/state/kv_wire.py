"""The KV-event wire format of vLLM and SGLang: msgpack ``KVEventBatch``es, decoded and encoded.

Read from the engines' own sources (vllm/distributed/kv_events.py, vLLM 0.33;
sglang/srt/disaggregation/kv_events.py, SGLang 0.5.23):
- a batch is a positional array ``[ts, events, data_parallel_rank?]`` (msgspec ``array_like``);
- an event is a tagged map ``{"type": "BlockStored", "block_hashes": [...], ...}`` with fields
  left at their default omitted; vLLM before ~0.11 tagged arrays ``["BlockStored", hashes,
  parent, token_ids, block_size, lora_id, medium]`` instead. Both are decoded.
- block hashes are ints (SGLang: signed int64; vLLM with int hashes: uint64) or bytes (vLLM's
  default sha256 digests);
- ``medium``: "GPU"; "CPU" (vLLM) / "CPU_PINNED" (SGLang); "STORAGE" / "DISK"; "EXTERNAL".
- a request's ``cache_salt``: SGLang sends a ``cache_salt`` field; vLLM puts it in
  ``extra_keys``, one untagged tuple per block (``(lora_name?, (mm_id, offset)..., salt?,
  embeds digest?)``), the salt only in the request's first block (the chain carries it on).
  vLLM's ``BlockStored.lora_name`` has no default, so vLLM always sends it, ``nil`` included.
On the socket each batch is a multipart message ``(topic, seq as 8-byte big-endian, payload)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack

from kvtide.errors import KvtideError
from kvtide.types import Tier

EngineHash = int | bytes
Dialect = Literal["vllm", "sglang"]
"""Whose field names a publisher writes (decoding reads both)."""


class KvEventFormatError(KvtideError):
    """An event message that does not decode as a KVEventBatch."""


@dataclass(frozen=True, slots=True)
class EngineBlockStored:
    block_hashes: tuple[EngineHash, ...]
    parent_block_hash: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    cache_salt: str | None = None


@dataclass(frozen=True, slots=True)
class EngineBlockRemoved:
    block_hashes: tuple[EngineHash, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class EngineAllBlocksCleared:
    pass


EngineEvent = EngineBlockStored | EngineBlockRemoved | EngineAllBlocksCleared


@dataclass(frozen=True, slots=True)
class EngineEventBatch:
    ts: float
    events: tuple[EngineEvent, ...]
    data_parallel_rank: int | None = None


_MEDIUM_TIER = {
    None: Tier.DEVICE,
    "GPU": Tier.DEVICE,
    "CPU": Tier.HOST,
    "CPU_PINNED": Tier.HOST,
    "STORAGE": Tier.DISK,
    "DISK": Tier.DISK,
    "EXTERNAL": Tier.DISK,
}
_TIER_MEDIUM = {Tier.DEVICE: "GPU", Tier.HOST: "CPU", Tier.DISK: "STORAGE"}


def medium_tier(medium: str | None) -> Tier:
    """The kvtide tier of an engine's storage medium (unknown media count as disk)."""
    return _MEDIUM_TIER.get(medium, Tier.DISK)


def tier_medium(tier: Tier) -> str:
    return _TIER_MEDIUM[tier]


# --- decoding ---------------------------------------------------------------------------

_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
)


def decode_batch(payload: bytes) -> EngineEventBatch:
    """One msgpack payload as a batch; raises ``KvEventFormatError`` on anything else."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise KvEventFormatError(f"not msgpack: {exc}") from exc
    if not isinstance(obj, list) or len(obj) < 2 or not isinstance(obj[1], list):
        raise KvEventFormatError("a KVEventBatch is an array [ts, events, ...]")
    ts, raw_events = obj[0], obj[1]
    rank = obj[2] if len(obj) > 2 and isinstance(obj[2], int) else None
    if not isinstance(ts, int | float):
        raise KvEventFormatError(f"batch timestamp is {type(ts).__name__}, not a number")
    return EngineEventBatch(float(ts), tuple(_decode_event(e) for e in raw_events), rank)


def _decode_event(raw: Any) -> EngineEvent:
    if isinstance(raw, Mapping):
        tag = raw.get("type")
        fields: Mapping[str, Any] = raw
    elif isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag = raw[0]
        names = _STORED_FIELDS if tag == "BlockStored" else ("block_hashes", "medium")
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise KvEventFormatError(f"an event is a tagged map or array, got {type(raw).__name__}")
    try:
        if tag == "BlockStored":
            token_ids = tuple(int(t) for t in fields.get("token_ids") or ())
            if token_ids and not 0 <= min(token_ids) <= max(token_ids) <= _MAX_TOKEN_ID:
                raise ValueError("token ids out of [0, 2**63)")
            block_size = int(fields["block_size"])
            if block_size < 1:
                raise ValueError(f"block_size {block_size}")
            lora_name = _opt_str(fields.get("lora_name"), "lora_name")
            return EngineBlockStored(
                block_hashes=tuple(_hash(h) for h in fields["block_hashes"]),
                parent_block_hash=_opt_hash(fields.get("parent_block_hash")),
                token_ids=token_ids,
                block_size=block_size,
                lora_id=_opt_int(fields.get("lora_id"), "lora_id"),
                medium=_opt_str(fields.get("medium"), "medium"),
                lora_name=lora_name,
                cache_salt=_opt_str(fields.get("cache_salt"), "cache_salt")
                or _salt_of(fields.get("extra_keys"), lora_name),
            )
        if tag == "BlockRemoved":
            return EngineBlockRemoved(
                block_hashes=tuple(_hash(h) for h in fields["block_hashes"]),
                medium=_opt_str(fields.get("medium"), "medium"),
            )
        if tag == "AllBlocksCleared":
            return EngineAllBlocksCleared()
    except (KeyError, TypeError, ValueError) as exc:
        raise KvEventFormatError(f"bad {tag} event: {exc!r}") from exc
    raise KvEventFormatError(f"unknown event type {tag!r}")


def _salt_of(extra_keys: Any, lora_name: str | None) -> str | None:
    """vLLM's cache_salt from the first block's extra keys: its first bare string after the
    LoRA name (multimodal keys are pairs, prompt-embeds digests bytes)."""
    if not isinstance(extra_keys, list) or not extra_keys:
        return None
    first = extra_keys[0]
    if not isinstance(first, list | tuple):
        return None
    strings = [k for k in first if isinstance(k, str)]
    if lora_name is not None and strings and strings[0] == lora_name:
        strings = strings[1:]
    return strings[0] if strings else None


def _hash(h: Any) -> EngineHash:
    if isinstance(h, bytes | int) and not isinstance(h, bool):
        return h
    raise TypeError(f"a block hash is an int or bytes, got {type(h).__name__}")


def _opt_hash(h: Any) -> EngineHash | None:
    return None if h is None else _hash(h)


_MAX_TOKEN_ID = (1 << 63) - 1
"""What the block hashing takes (int64): an id beyond it, or a negative one, makes the batch
malformed here, not an exception in the intake that ends it."""


def _opt_str(value: Any, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"{name} is a string or nil, got {type(value).__name__}")


def _opt_int(value: Any, name: str) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise TypeError(f"{name} is an integer or nil, got {type(value).__name__}")


# --- encoding ---------------------------------------------------------------------------


def encode_batch(
    batch: EngineEventBatch, *, legacy_arrays: bool = False, dialect: Dialect = "vllm"
) -> bytes:
    """The batch as an engine would publish it (tagged maps; ``legacy_arrays``: old vLLM),
    with ``dialect``'s field names for what the two engines spell differently."""
    events = [_encode_event(e, legacy_arrays, dialect) for e in batch.events]
    body: list[Any] = [batch.ts, events]
    if batch.data_parallel_rank is not None:
        body.append(batch.data_parallel_rank)
    out: bytes = msgpack.packb(body, use_bin_type=True)
    return out


def _encode_event(e: EngineEvent, legacy: bool, dialect: Dialect) -> Any:
    if isinstance(e, EngineBlockStored):
        if legacy:
            return [
                "BlockStored",
                list(e.block_hashes),
                e.parent_block_hash,
                list(e.token_ids),
                e.block_size,
                e.lora_id,
                e.medium,
            ]
        m: dict[str, Any] = {
            "type": "BlockStored",
            "block_hashes": list(e.block_hashes),
            "parent_block_hash": e.parent_block_hash,
            "token_ids": list(e.token_ids),
            "block_size": e.block_size,
            "lora_id": e.lora_id,
            "medium": e.medium,
        }
        if dialect == "sglang":
            if e.lora_name is not None:
                m["lora_name"] = e.lora_name
            if e.cache_salt is not None:
                m["cache_salt"] = e.cache_salt
            return m
        m["lora_name"] = e.lora_name  # required by vLLM's class: sent even when nil
        if e.cache_salt is not None and e.parent_block_hash is None:
            first = (*(() if e.lora_name is None else (e.lora_name,)), e.cache_salt)
            m["extra_keys"] = [first, *([None] * (len(e.block_hashes) - 1))]
        return m
    if isinstance(e, EngineBlockRemoved):
        if legacy:
            return ["BlockRemoved", list(e.block_hashes), e.medium]
        return {"type": "BlockRemoved", "block_hashes": list(e.block_hashes), "medium": e.medium}
    return ["AllBlocksCleared"] if legacy else {"type": "AllBlocksCleared"}


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def seq_from_bytes(raw: bytes | Sequence[int]) -> int:
    return int.from_bytes(bytes(raw), "big", signed=True)
