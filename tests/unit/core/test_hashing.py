from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.core.hashing import (
    BlockHashes,
    Namespace,
    as_block_hashes,
    expand_block_ids,
    finalize_inverse,
    fmix64,
    fmix64_inverse,
    hash_block_ids,
    hash_tokens,
    request_block_hashes,
)
from kvtide.types import Request

SEED = Namespace(model="m").seed


def test_only_full_blocks_are_hashed() -> None:
    assert len(hash_tokens(list(range(47)), 16, SEED)) == 2
    assert len(hash_tokens(list(range(15)), 16, SEED)) == 0


def test_a_block_hash_covers_its_whole_prefix() -> None:
    a = np.arange(64, dtype=np.int32)
    b = a.copy()
    b[20] += 1  # second block differs
    ha, hb = hash_tokens(a, 16, SEED), hash_tokens(b, 16, SEED)
    assert ha[0] == hb[0]
    assert all(x != y for x, y in zip(ha[1:], hb[1:], strict=True))


def test_equal_blocks_at_different_depths_hash_differently() -> None:
    h = hash_tokens([7] * 48, 16, SEED)
    assert len(set(h)) == 3


def test_namespaces_never_share_a_block() -> None:
    tokens = list(range(32))
    seeds = {
        Namespace(model="m").seed,
        Namespace(model="m", tenant_salt=b"a").seed,
        Namespace(model="m", tenant_salt=b"b").seed,
        Namespace(model="m", lora="adapter").seed,
        Namespace(model="other").seed,
    }
    assert len(seeds) == 5
    firsts = {hash_tokens(tokens, 16, s)[0] for s in seeds}
    assert len(firsts) == 5


def test_a_chain_continues_from_its_published_parent() -> None:
    tokens = np.random.default_rng(1).integers(0, 50_000, 16 * 40)
    whole = hash_tokens(tokens, 16, SEED)
    tail = hash_tokens(tokens[16 * 25 :], 16, SEED, parent=whole[24])
    assert tail == whole[25:]


def test_list_and_array_inputs_agree() -> None:
    tokens = list(range(100, 164))
    assert hash_tokens(tokens, 16, SEED) == hash_tokens(np.array(tokens, np.int32), 16, SEED)


def test_the_published_hash_inverts_to_its_chain_state() -> None:
    from kvtide.core.hashing import _finalize_inplace

    xs = np.array([0, 1, 2**63 + 5, 2**64 - 1, 0x123456789ABCDEF], dtype=np.uint64)
    for x, h in zip(xs.tolist(), _finalize_inplace(xs.copy()).tolist(), strict=True):
        assert finalize_inverse(h) == x


def test_fmix64_inverse_roundtrips() -> None:
    xs = np.array([0, 1, 2**63 + 5, 2**64 - 1], dtype=np.uint64)
    for x, h in zip(xs.tolist(), fmix64(xs).tolist(), strict=True):
        assert fmix64_inverse(h) == x


def test_block_ids_are_chained_even_when_content_ids_repeat() -> None:
    # Bailian-style content ids: the same id at two positions is two different blocks.
    h = hash_block_ids([5, 5, 5], SEED)
    assert len(set(h)) == 3
    assert hash_block_ids([5, 6], SEED)[1] != hash_block_ids([4, 6], SEED)[1]
    assert hash_block_ids([1, 2, 3], SEED, parent=None)[:2] == hash_block_ids([1, 2], SEED)


def test_expand_block_ids_is_deterministic_per_block_and_position() -> None:
    t = expand_block_ids([9, 10], 4, 7)
    assert t.tolist()[:4] == expand_block_ids([9], 4, 4).tolist()
    assert len(t) == 7
    assert t[0] != t[1]


def test_request_hashes_at_another_block_size_use_expanded_tokens() -> None:
    req = Request("r", 0.0, prompt_tokens=40, output_tokens=1, block_tokens=16, block_ids=(1, 2, 3))
    native = request_block_hashes(req, 16, SEED)
    assert native == hash_block_ids([1, 2], SEED)
    reblocked = request_block_hashes(req, 8, SEED)
    assert len(reblocked) == 5
    assert reblocked == hash_tokens(expand_block_ids([1, 2, 3], 16, 40), 8, SEED)


def test_block_hashes_behave_like_a_sequence() -> None:
    h = BlockHashes.from_ints([3, 2**64 - 1, 7])
    assert len(h) == 3
    assert h[1] == 2**64 - 1 and h[-1] == 7
    assert h[1:] == [2**64 - 1, 7]
    assert list(h) == [3, 2**64 - 1, 7]
    assert as_block_hashes(h) is h
    assert h[:1] + h[1:] == h
    with pytest.raises(IndexError):
        _ = h[3]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**31 - 1), max_size=200), st.integers(1, 32))
def test_hashing_a_prefix_gives_a_prefix(tokens: list[int], block_tokens: int) -> None:
    whole = hash_tokens(tokens, block_tokens, SEED)
    cut = len(tokens) // 2
    assert hash_tokens(tokens[:cut], block_tokens, SEED) == whole[: cut // block_tokens]


def test_a_block_size_hashes_the_same_whatever_was_hashed_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Regression: position keys came from one stream per seed, so a 16-token block's hash
    # depended on whether 512-token blocks were hashed first in the same process.
    from kvtide.core import hashing

    tokens = list(range(1024))
    monkeypatch.setattr(hashing, "_KEYS_BY_SEED", {})
    alone = hash_tokens(tokens, 16, seed=12345)
    monkeypatch.setattr(hashing, "_KEYS_BY_SEED", {})
    hash_tokens(tokens, 512, seed=12345)
    assert hash_tokens(tokens, 16, seed=12345) == alone
