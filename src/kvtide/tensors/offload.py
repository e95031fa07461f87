"""Lower KV tiers for real tensors, driven by the core's ``TieredCache``.

``TieredCache`` decides everything: which device blocks are written down (write-back or
write-through, admission filters, write-around), which host blocks spill to disk, what each
tier evicts, and whether a lower-tier hit is reloaded, recomputed or split. ``TensorMover``
only carries those decisions out on bytes, so the simulator and a real model run the same tier
code. The host store is one slab (pinned when CUDA is there) keyed by block hash; the disk
store writes one file per block with an xxh3-64 checksum that is verified on every load.
"""

from __future__ import annotations

import os
import struct
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import torch
import xxhash

from kvtide.core.hashing import BlockHashes
from kvtide.core.node import Node
from kvtide.core.tiers import TieredCache, TierMove
from kvtide.errors import ConfigError, KvtideError
from kvtide.tensors.paged_kv import PagedKV
from kvtide.types import BlockHash, Tier


class CorruptBlockError(KvtideError):
    """A block read back from disk does not match the checksum it was written with."""


class HostStore:
    """A fixed slab of ``capacity_blocks`` host blocks keyed by hash; pinned under CUDA.

    It keeps no order of its own: the host tier's ``KVCache`` decides what stays.
    """

    def __init__(self, block_shape: tuple[int, ...], capacity_blocks: int) -> None:
        if capacity_blocks <= 0:
            raise ConfigError(f"host capacity must be positive, got {capacity_blocks} blocks")
        pin = torch.cuda.is_available()
        self.slab = torch.empty((capacity_blocks, *block_shape), pin_memory=pin)
        self.is_pinned = pin
        self._free = list(range(capacity_blocks - 1, -1, -1))
        self._slot: dict[BlockHash, int] = {}

    @property
    def capacity_blocks(self) -> int:
        return int(self.slab.shape[0])

    @property
    def num_blocks(self) -> int:
        return len(self._slot)

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._slot

    def put(self, block_hash: BlockHash, kv: torch.Tensor) -> None:
        """Stores a copy (overwriting an earlier one); raises ``ConfigError`` when full."""
        slot = self._slot.get(block_hash)
        if slot is None:
            if not self._free:
                raise ConfigError(f"host store full ({self.capacity_blocks} blocks)")
            slot = self._slot[block_hash] = self._free.pop()
        self.slab[slot].copy_(kv)

    def get(self, block_hash: BlockHash) -> torch.Tensor | None:
        """A view of the stored block (valid until it is dropped), or None."""
        slot = self._slot.get(block_hash)
        return None if slot is None else self.slab[slot]

    def drop(self, block_hash: BlockHash) -> None:
        slot = self._slot.pop(block_hash, None)
        if slot is not None:
            self._free.append(slot)


_MAGIC = b"KVTB"
_VERSION = 1
# magic, version, dtype code, rank, checksum (xxh3-64 of the payload), payload bytes
_HEADER = struct.Struct("<4sHHHQQ")
_DTYPES = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}


class DiskStore:
    """One file per block under ``directory``: header, shape, payload; LRU-bounded if asked."""

    def __init__(self, directory: Path | str, capacity_blocks: int | None = None) -> None:
        if capacity_blocks is not None and capacity_blocks <= 0:
            raise ConfigError(f"disk capacity must be positive, got {capacity_blocks} blocks")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[BlockHash, None] = OrderedDict()
        self.num_bytes_written = 0
        self.num_bytes_read = 0

    def path(self, block_hash: BlockHash) -> Path:
        return self.directory / f"{block_hash:016x}.kvb"

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._blocks

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    def save(self, block_hash: BlockHash, kv: torch.Tensor) -> None:
        if block_hash in self._blocks:
            self._blocks.move_to_end(block_hash)
            return
        code = _DTYPES.get(kv.dtype)
        if code is None:
            raise ConfigError(f"cannot store dtype {kv.dtype} on disk")
        payload = kv.detach().to("cpu").contiguous().view(torch.uint8).numpy()
        checksum = xxhash.xxh3_64_intdigest(payload.data)
        header = _HEADER.pack(_MAGIC, _VERSION, code, kv.dim(), checksum, payload.nbytes)
        shape = struct.pack(f"<{kv.dim()}q", *kv.shape)
        path = self.path(block_hash)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(shape)
            f.write(payload.data)
        os.replace(tmp, path)  # a reader never sees a half-written block
        self.num_bytes_written += payload.nbytes
        self._blocks[block_hash] = None
        if self.capacity_blocks is not None and len(self._blocks) > self.capacity_blocks:
            old, _ = self._blocks.popitem(last=False)
            self.path(old).unlink(missing_ok=True)

    def load(self, block_hash: BlockHash) -> torch.Tensor | None:
        """The stored block, or None if absent; raises CorruptBlockError on a bad checksum."""
        if block_hash not in self._blocks:
            return None
        path = self.path(block_hash)
        try:
            with open(path, "rb") as f:
                header = f.read(_HEADER.size)
                if len(header) != _HEADER.size:
                    raise CorruptBlockError(f"{path}: truncated header")
                magic, version, code, rank, checksum, size = _HEADER.unpack(header)
                dtype = next((d for d, c in _DTYPES.items() if c == code), None)
                if magic != _MAGIC or version != _VERSION or dtype is None:
                    raise CorruptBlockError(f"{path}: not a kvtide block file")
                shape = struct.unpack(f"<{rank}q", f.read(8 * rank))
                out = torch.empty(shape, dtype=dtype)
                raw = out.view(torch.uint8).reshape(-1).numpy()
                if out.numel() * out.element_size() != size or f.readinto(raw.data) != size:
                    raise CorruptBlockError(f"{path}: payload size does not match its header")
        except OSError as exc:
            raise CorruptBlockError(f"{path}: {exc}") from exc
        if xxhash.xxh3_64_intdigest(raw.data) != checksum:
            raise CorruptBlockError(f"{path}: checksum mismatch")
        self.num_bytes_read += size
        self._blocks.move_to_end(block_hash)
        return out

    def drop(self, block_hash: BlockHash) -> None:
        self._blocks.pop(block_hash, None)
        self.path(block_hash).unlink(missing_ok=True)


class TensorMover:
    """Keeps a paged KV tensor, a host slab and a disk directory in step with a
    ``TieredCache``: each tier's bytes are exactly the blocks its ``KVCache`` holds.

    It watches every tier's stores and removals (to map device blocks to pool slots and free
    lower-tier bytes) and receives the cache's moves as they are decided
    (``TieredCache.add_mover``). It registers after the cache's own observers, so when a tier
    evicts a block the copy down runs before this mover forgets the block's bytes. A reload
    that cannot be carried out (a corrupt or missing disk file) is remembered in ``failed``:
    the runner recomputes from the first such block.

    The device stores a prompt's blocks before the model computes them, so a copy down of a
    block not computed yet (write-through) waits in ``pending`` until the runner has written
    its KV and calls ``flush``; copies further down of such a block follow its bytes.
    """

    def __init__(self, kv: PagedKV, tiers: TieredCache, disk_dir: Path | str | None = None):
        self.kv = kv
        self.tiers = tiers
        self.host: HostStore | None = None
        self.disk: DiskStore | None = None
        host_spec = tiers.config.host
        if host_spec is not None:
            self.host = HostStore(kv.block_shape, host_spec.capacity_blocks)
        if tiers.config.disk is not None:
            if disk_dir is None:
                raise ConfigError("a disk tier needs a directory for its block files")
            self.disk = DiskStore(disk_dir)
        self.device_slots: dict[BlockHash, int] = {}  # pool slot of each cached device block
        self.failed: set[BlockHash] = set()
        self.uncomputed: set[BlockHash] = set()  # on the device, KV not written yet
        self.pending: list[tuple[BlockHash, Tier]] = []  # device blocks to copy to a tier
        self._waiting: dict[tuple[BlockHash, Tier], list[Tier]] = {}
        self._indexed: dict[Tier, set[BlockHash]] = {t: set() for t, _ in tiers.lower}
        self.num_written_blocks = {Tier.HOST: 0, Tier.DISK: 0}
        self.num_reloaded_blocks = {Tier.HOST: 0, Tier.DISK: 0}
        self.num_corrupt_blocks = 0
        tiers.device.add_observer(_DeviceSlots(self))
        for tier, cache in tiers.lower:
            cache.add_observer(_LowerBytes(self, tier))
        tiers.add_mover(self.move)

    def move(self, move: TierMove) -> None:
        src, dst = move.src, move.dst
        for block_hash in move.hashes:
            if src is Tier.DEVICE and (
                block_hash in self.uncomputed or block_hash not in self.device_slots
            ):
                # A write-through copy of a block the prefill has not computed yet.
                self.pending.append((block_hash, dst))
                continue
            kv = self._read(block_hash, src)
            if dst is Tier.DEVICE:
                slot = self.device_slots.get(block_hash)
                if kv is None or slot is None:
                    self.failed.add(block_hash)
                    continue
                self.kv.write(slot, kv)
                self.computed(block_hash)
                self.num_reloaded_blocks[src] += 1
            elif kv is not None:
                self._write(block_hash, dst, kv)
            else:
                # A copy further down of a block whose bytes are still on their way into
                # ``src`` (the host's write-through runs before the copy into the host is even
                # decided): it follows them as soon as they land.
                self._waiting.setdefault((block_hash, src), []).append(dst)

    def discard_unreadable(self, path: Sequence[BlockHash]) -> None:
        """Drops the last block of ``path`` (with what is cached below it) from each lower
        tier that indexes it without holding its bytes (a corrupt file), so that no later
        lookup counts it as cached."""
        block_hash = path[-1]
        for tier, cache in self.tiers.lower:
            if block_hash in self._indexed[tier] and not self._holds(block_hash, tier):
                cache.discard(path)

    def _holds(self, block_hash: BlockHash, tier: Tier) -> bool:
        store = self.host if tier is Tier.HOST else self.disk
        return store is not None and block_hash in store

    def computed(self, block_hash: BlockHash) -> None:
        """The block's device slot now holds its KV."""
        self.failed.discard(block_hash)
        self.uncomputed.discard(block_hash)

    def flush(self) -> None:
        """Carries out the copies down that waited for their blocks' KV. One whose block left
        the device uncomputed, or whose tier dropped it meanwhile, is skipped: that tier then
        holds no bytes for it, and a reload of it fails over to recomputing."""
        pending, self.pending = self.pending, []
        for block_hash, dst in pending:
            slot = self.device_slots.get(block_hash)
            if slot is not None and block_hash not in self.uncomputed:
                self._write(block_hash, dst, self.kv.block(slot))
        self._waiting.clear()

    def _read(self, block_hash: BlockHash, tier: Tier) -> torch.Tensor | None:
        if tier is Tier.DEVICE:
            slot = self.device_slots.get(block_hash)
            return None if slot is None else self.kv.block(slot)
        if tier is Tier.HOST and self.host is not None:
            kv = self.host.get(block_hash)
            if kv is not None:
                return kv
        # The host may have spilled the block to disk within the same operation.
        if self.disk is None:
            return None
        try:
            return self.disk.load(block_hash)
        except CorruptBlockError:
            self.num_corrupt_blocks += 1
            self.disk.drop(block_hash)
            return None

    def _write(self, block_hash: BlockHash, tier: Tier, kv: torch.Tensor) -> None:
        if block_hash not in self._indexed[tier]:
            return  # the tier evicted it again before its bytes were ready
        if tier is Tier.HOST:
            assert self.host is not None
            self.host.put(block_hash, kv)
        else:
            assert self.disk is not None
            self.disk.save(block_hash, kv)
        self.num_written_blocks[tier] += 1
        for dst in self._waiting.pop((block_hash, tier), ()):
            self._write(block_hash, dst, kv)

    def forget(self, block_hash: BlockHash, tier: Tier) -> None:
        if tier is Tier.HOST and self.host is not None:
            self.host.drop(block_hash)
        elif tier is Tier.DISK and self.disk is not None:
            self.disk.drop(block_hash)


class _DeviceSlots:
    """Device tier observer: which pool slot holds each cached block."""

    def __init__(self, mover: TensorMover) -> None:
        self.slots = mover.device_slots
        self.failed = mover.failed
        self.uncomputed = mover.uncomputed

    def stored(self, node: Node, hashes: BlockHashes) -> None:
        # A stored run is the tail of its node (a new leaf is all of it).
        blocks = node.blocks[len(node.blocks) - len(hashes) :]
        for block_hash, block_id in zip(hashes.tolist(), blocks, strict=True):
            self.slots[block_hash] = block_id
            self.uncomputed.add(block_hash)

    def removed(self, node: Node, hashes: BlockHashes) -> None:
        for block_hash in hashes.tolist():
            self.slots.pop(block_hash, None)
            self.failed.discard(block_hash)
            self.uncomputed.discard(block_hash)


class _LowerBytes:
    """Host or disk tier observer: a block the tier evicts loses its bytes (after the cache's
    own observer has written it further down)."""

    def __init__(self, mover: TensorMover, tier: Tier) -> None:
        self.mover = mover
        self.tier = tier

    def stored(self, node: Node, hashes: BlockHashes) -> None:
        self.mover._indexed[self.tier].update(hashes.tolist())

    def removed(self, node: Node, hashes: BlockHashes) -> None:
        indexed = self.mover._indexed[self.tier]
        for block_hash in hashes.tolist():
            indexed.discard(block_hash)
            self.mover.forget(block_hash, self.tier)


def block_checksum(kv: torch.Tensor) -> int:
    """xxh3-64 of a block's bytes (tests compare a block before offload and after reload)."""
    data = kv.detach().to("cpu").contiguous().view(torch.uint8).numpy()
    return int(xxhash.xxh3_64_intdigest(data.tobytes()))
