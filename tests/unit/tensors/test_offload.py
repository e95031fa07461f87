"""Host and disk block stores: slots by hash, checksums, corruption detection."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kvtide.errors import ConfigError  # noqa: E402
from kvtide.tensors.offload import CorruptBlockError, DiskStore, HostStore, block_checksum  # noqa: E402
from kvtide.types import BlockHash  # noqa: E402

pytestmark = pytest.mark.torch

SHAPE = (2, 2, 2, 4, 16)


def block(seed: int) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed))


def test_host_store_keeps_blocks_by_hash_in_a_fixed_slab() -> None:
    host = HostStore(SHAPE, capacity_blocks=3)
    for h in (1, 2, 3):
        host.put(BlockHash(h), block(h))
    assert host.num_blocks == 3
    with pytest.raises(ConfigError, match="full"):
        host.put(BlockHash(4), block(4))
    host.put(BlockHash(2), block(5))  # overwriting needs no new slot
    host.drop(BlockHash(1))
    assert BlockHash(1) not in host and host.get(BlockHash(1)) is None
    host.put(BlockHash(4), block(4))  # the freed slot is reused
    assert torch.equal(host.get(BlockHash(2)), block(5))  # type: ignore[arg-type]
    assert torch.equal(host.get(BlockHash(3)), block(3))  # type: ignore[arg-type]
    assert torch.equal(host.get(BlockHash(4)), block(4))  # type: ignore[arg-type]


def test_host_store_refuses_zero_capacity() -> None:
    with pytest.raises(ConfigError):
        HostStore(SHAPE, 0)


def test_disk_store_round_trips_bytes_exactly(tmp_path: Path) -> None:
    disk = DiskStore(tmp_path)
    kv = block(5)
    disk.save(BlockHash(0xABC), kv)
    assert (tmp_path / "0000000000000abc.kvb").is_file()
    back = disk.load(BlockHash(0xABC))
    assert back is not None and back.shape == SHAPE
    assert block_checksum(back) == block_checksum(kv)
    assert disk.load(BlockHash(0xDEF)) is None
    assert disk.num_bytes_read == disk.num_bytes_written == kv.numel() * 4


def test_disk_store_detects_a_flipped_byte(tmp_path: Path) -> None:
    disk = DiskStore(tmp_path)
    disk.save(BlockHash(7), block(7))
    path = disk.path(BlockHash(7))
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptBlockError, match="checksum mismatch"):
        disk.load(BlockHash(7))


def test_disk_store_detects_a_truncated_file(tmp_path: Path) -> None:
    disk = DiskStore(tmp_path)
    disk.save(BlockHash(8), block(8))
    path = disk.path(BlockHash(8))
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(CorruptBlockError, match="size"):
        disk.load(BlockHash(8))


def test_disk_store_capacity_deletes_the_oldest_file(tmp_path: Path) -> None:
    disk = DiskStore(tmp_path, capacity_blocks=2)
    for h in (1, 2, 3):
        disk.save(BlockHash(h), block(h))
    assert BlockHash(1) not in disk and not disk.path(BlockHash(1)).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "0000000000000002.kvb",
        "0000000000000003.kvb",
    ]
