"""TensorMover on random request streams: the bytes follow the tiers' decisions exactly.

No model: a block's KV is a tensor determined by its hash, written when the "prefill" computes
it. After every request (some prefetched first, some followed by a device flush), each block
the request uses without computing (device hit or reload) holds its own bytes, and each lower
tier's store holds exactly the blocks its index holds, each with its own bytes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from kvtide.clock import ManualClock  # noqa: E402
from kvtide.core.hashing import BlockHashes, hash_block_ids  # noqa: E402
from kvtide.core.radix_tree import RadixTree  # noqa: E402
from kvtide.core.tiers import TieredCache, TieredCacheConfig, TierSpec, WriteMode  # noqa: E402
from kvtide.tensors.model import LlamaConfig  # noqa: E402
from kvtide.tensors.offload import TensorMover  # noqa: E402
from kvtide.tensors.paged_kv import PagedKV  # noqa: E402
from kvtide.types import Tier  # noqa: E402

pytestmark = pytest.mark.torch

BT = 2
CONFIG = LlamaConfig(
    vocab_size=16,
    hidden_size=8,
    intermediate_size=8,
    num_layers=1,
    num_heads=1,
    num_kv_heads=1,
    head_dim=2,
    rope_theta=10000.0,
    max_positions=64,
)


def kv_of(block_hash: int) -> torch.Tensor:
    shape = PagedKV(CONFIG, 1, BT).block_shape
    return torch.full(shape, float(block_hash % 1_000_003))


def held(tree: RadixTree) -> set[int]:
    out: set[int] = set()
    stack = [tree.root]
    while stack:
        node = stack.pop()
        out.update(BlockHashes(node.key).tolist())
        stack.extend(node.children.values())
    return out


requests = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=7), min_size=1, max_size=30)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    requests=requests,
    device=st.integers(1, 5),
    host=st.integers(0, 6),
    disk=st.integers(0, 8),
    admission=st.sampled_from(["none", "seen-twice"]),
    write_mode=st.sampled_from(list(WriteMode)),
    flush_every=st.integers(0, 4),
    prefetch_every=st.integers(0, 3),
)
def test_bytes_follow_the_tiers(
    tmp_path: Path,
    requests: list[list[int]],
    device: int,
    host: int,
    disk: int,
    admission: str,
    write_mode: WriteMode,
    flush_every: int,
    prefetch_every: int,
) -> None:
    tiers = TieredCache(
        TieredCacheConfig(
            TierSpec(device),
            TierSpec(host, admission=admission) if host else None,
            TierSpec(disk) if disk else None,
            block_tokens=BT,
            write_mode=write_mode,
        ),
        ManualClock(),
    )
    directory = tmp_path / f"kv-{len(list(tmp_path.iterdir()))}"  # hypothesis reuses tmp_path
    kv = PagedKV(CONFIG, tiers.device.pool.num_blocks, BT)
    mover = TensorMover(kv, tiers, directory)
    for step, path in enumerate(requests):
        hashes = hash_block_ids(path, seed=1)
        ids = hashes.tolist()
        if prefetch_every and step % prefetch_every == 0:
            tiers.prefetch(hashes)  # its reloads land in device slots before the request
        access = tiers.access(hashes, len(ids) * BT, lock=True)
        prefix = min(access.usable_blocks, access.cached_blocks)
        slots = access.block_ids
        for i in range(prefix):  # used without computing: must hold its own bytes
            if ids[i] in mover.failed:
                prefix = i
                break
            assert torch.equal(kv.block(slots[i]), kv_of(ids[i])), (step, i)
        for i in range(prefix, len(slots)):  # "compute" the rest
            kv.write(slots[i], kv_of(ids[i]))
            mover.computed(ids[i])
        mover.flush()
        tiers.unlock(access.handle)
        if flush_every and step % flush_every == 0:
            tiers.device.clear()  # everything evictable goes down at once
        if mover.host is not None:
            in_host = held(tiers.caches[Tier.HOST].tree)
            assert set(mover.host._slot) == in_host
            for h in in_host:
                got = mover.host.get(h)
                assert got is not None and torch.equal(got, kv_of(h))
        if mover.disk is not None:
            in_disk = held(tiers.caches[Tier.DISK].tree)
            assert set(mover.disk._blocks) == in_disk
            assert {int(p.stem, 16) for p in directory.glob("*.kvb")} == in_disk
            for h in in_disk:
                got = mover.disk.load(h)
                assert got is not None and torch.equal(got, kv_of(h))
    assert not mover.pending
    assert mover.num_corrupt_blocks == 0
