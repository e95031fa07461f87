"""Lower KV tiers for real tensors: a host store (pinned when CUDA is there) and a disk store.

Both are keyed by chained block hash. ``Offloader`` watches a KVCache: when the cache evicts a
device block it copies the block's bytes down (host, or disk when there is no host tier) before
the pool can hand the block out again; host overflow spills to disk. Disk blocks carry an
xxh3-64 checksum that is verified on every load.
"""

from __future__ import annotations

import os
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash

from kvtide.core.hashing import BlockHashes
from kvtide.core.node import Node
from kvtide.errors import ConfigError, KvtideError
from kvtide.tensors.paged_kv import PagedKV
from kvtide.types import BlockHash, Tier


@dataclass(frozen=True, slots=True)
class Reload:
    """One block to bring back: from the host (read at write time) or already read from disk."""

    block_hash: BlockHash
    tier: Tier
    kv: torch.Tensor | None


class CorruptBlockError(KvtideError):
    """A block read back from disk does not match the checksum it was written with."""


class HostStore:
    """A fixed slab of ``capacity_blocks`` host blocks with LRU order; pinned under CUDA."""

    def __init__(self, block_shape: tuple[int, ...], capacity_blocks: int) -> None:
        if capacity_blocks <= 0:
            raise ConfigError(f"host capacity must be positive, got {capacity_blocks} blocks")
        pin = torch.cuda.is_available()
        self.slab = torch.empty((capacity_blocks, *block_shape), pin_memory=pin)
        self.is_pinned = pin
        self._free = list(range(capacity_blocks - 1, -1, -1))
        self._slot: OrderedDict[BlockHash, int] = OrderedDict()
        self._locked: set[BlockHash] = set()

    @property
    def capacity_blocks(self) -> int:
        return int(self.slab.shape[0])

    @property
    def num_blocks(self) -> int:
        return len(self._slot)

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._slot

    def is_full(self) -> bool:
        return not self._free

    def lock(self, block_hash: BlockHash) -> None:
        """Keeps a block from ``pop_lru`` while a reload reads it; ``unlock`` after."""
        self._locked.add(block_hash)

    def unlock(self, block_hash: BlockHash) -> None:
        self._locked.discard(block_hash)

    def put(self, block_hash: BlockHash, kv: torch.Tensor) -> None:
        """Stores a copy; the store must not be full (``pop_lru`` first)."""
        slot = self._slot.get(block_hash)
        if slot is None:
            slot = self._free.pop()
            self._slot[block_hash] = slot
        self._slot.move_to_end(block_hash)
        self.slab[slot].copy_(kv)

    def get(self, block_hash: BlockHash) -> torch.Tensor | None:
        """A view of the stored block (valid until it is dropped), or None."""
        slot = self._slot.get(block_hash)
        if slot is None:
            return None
        self._slot.move_to_end(block_hash)
        return self.slab[slot]

    def pop_lru(self) -> tuple[BlockHash, torch.Tensor] | None:
        """Removes the least recently used unlocked block; its view stays valid until the
        next put. None when every block is locked or the store is empty."""
        victim = next((h for h in self._slot if h not in self._locked), None)
        if victim is None:
            return None
        slot = self._slot.pop(victim)
        self._free.append(slot)
        return victim, self.slab[slot]


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


class Offloader:
    """A KVCache observer that writes evicted device blocks to the host (or disk) tier.

    It runs inside the cache's eviction, before the freed pool block can be reused, so the
    bytes it copies are still the evicted block's. ``disk_write_through`` also writes every
    offloaded block to disk at once (otherwise disk only receives host overflow).
    """

    def __init__(
        self,
        kv: PagedKV,
        host: HostStore | None = None,
        disk: DiskStore | None = None,
        *,
        disk_write_through: bool = False,
    ) -> None:
        self.kv = kv
        self.host = host
        self.disk = disk
        self.disk_write_through = disk_write_through
        self._device_block: dict[BlockHash, int] = {}
        self.num_offloaded_blocks = {Tier.HOST: 0, Tier.DISK: 0}
        self.num_reloaded_blocks = {Tier.HOST: 0, Tier.DISK: 0}
        self.num_corrupt_blocks = 0

    # TreeListener: called by the cache inside insert / evict
    def stored(self, node: Node, hashes: BlockHashes) -> None:
        for block_hash, block_id in zip(hashes.tolist(), node.blocks, strict=True):
            self._device_block[block_hash] = block_id

    def removed(self, node: Node, hashes: BlockHashes) -> None:
        for block_hash in hashes.tolist():
            block_id = self._device_block.pop(block_hash, None)
            if block_id is not None:  # None: cached before this observer was attached
                self.offload(block_hash, self.kv.block(block_id))

    def device_block(self, block_hash: BlockHash) -> int | None:
        return self._device_block.get(block_hash)

    def offload(self, block_hash: BlockHash, kv: torch.Tensor) -> None:
        if self.host is not None:
            if block_hash not in self.host and (not self.host.is_full() or self.demote_host(1)):
                self.host.put(block_hash, kv)
                self.num_offloaded_blocks[Tier.HOST] += 1
            if self.disk is None or not (self.disk_write_through or block_hash not in self.host):
                return
        if self.disk is not None and block_hash not in self.disk:
            self.disk.save(block_hash, kv)
            self.num_offloaded_blocks[Tier.DISK] += 1

    def demote_host(self, num_blocks: int) -> int:
        """Moves the host's least recently used blocks to disk (or drops them); returns how many."""
        moved = 0
        while moved < num_blocks and self.host is not None:
            popped = self.host.pop_lru()
            if popped is None:
                break
            block_hash, kv = popped
            if self.disk is not None and block_hash not in self.disk:
                self.disk.save(block_hash, kv)
                self.num_offloaded_blocks[Tier.DISK] += 1
            moved += 1
        return moved

    def locate(self, block_hash: BlockHash) -> Tier | None:
        """The fastest lower tier holding ``block_hash`` (the device is the cache's business)."""
        if self.host is not None and block_hash in self.host:
            return Tier.HOST
        if self.disk is not None and block_hash in self.disk:
            return Tier.DISK
        return None

    def lower_run(self, hashes: Sequence[BlockHash]) -> list[Tier]:
        """The tier of each block of the leading run of ``hashes`` held below the device
        (nothing is read or locked)."""
        run: list[Tier] = []
        for block_hash in hashes:
            tier = self.locate(block_hash)
            if tier is None:
                break
            run.append(tier)
        return run

    def plan_reload(self, hashes: Sequence[BlockHash]) -> list[Reload]:
        """The leading run of ``hashes`` held in a lower tier. Host blocks are locked until
        ``write_reload`` or ``cancel_reload``; disk blocks are read and checksum-verified now.
        A corrupt disk block is dropped, counted, and ends the run (it will be recomputed)."""
        plan: list[Reload] = []
        for block_hash in hashes:
            if self.host is not None and block_hash in self.host:
                self.host.lock(block_hash)
                plan.append(Reload(block_hash, Tier.HOST, None))
                continue
            if self.disk is None:
                break
            try:
                loaded = self.disk.load(block_hash)
            except CorruptBlockError:
                self.num_corrupt_blocks += 1
                self.disk.drop(block_hash)
                break
            if loaded is None:
                break
            plan.append(Reload(block_hash, Tier.DISK, loaded))
        return plan

    def write_reload(self, plan: Sequence[Reload], block_ids: Sequence[int]) -> None:
        """Copies planned blocks into freshly allocated pool blocks, in order."""
        for item, block_id in zip(plan, block_ids, strict=True):
            kv = item.kv
            if item.tier == Tier.HOST:
                assert self.host is not None
                kv = self.host.get(item.block_hash)
                self.host.unlock(item.block_hash)
            assert kv is not None, "a locked host block vanished"
            self.kv.write(block_id, kv)
            self.num_reloaded_blocks[item.tier] += 1

    def cancel_reload(self, plan: Sequence[Reload]) -> None:
        if self.host is not None:
            for item in plan:
                self.host.unlock(item.block_hash)


def block_checksum(kv: torch.Tensor) -> int:
    """xxh3-64 of a block's bytes (tests compare a block before offload and after reload)."""
    data = kv.detach().to("cpu").contiguous().view(torch.uint8).numpy()
    return int(xxhash.xxh3_64_intdigest(data.tobytes()))
