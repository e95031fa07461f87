"""Chained block hashes: a block's hash covers its tokens and its whole prefix, in a namespace.

The hash is vectorised over numpy so a 32k-token prompt hashes in tens of microseconds:

    c_i = mix(sum_k tokens[i, k] * K_k)        keyed multilinear hash of block i's content
    S_i = S_{i-1} * M + c_i   (mod 2**64)      linear chain over blocks, seeded by the namespace
    h_i = fin(S_i)                             the published block hash

mix (one xorshift-multiply round) makes the content hash non-linear, so nobody can aim block
differences at the linear chain (the Thue-Morse collisions of plain polynomial hashing) without
the keys. The chain is a linear recurrence, so all S_i come from one cumulative sum
(S_i = M**(i+1) * S_-1 + M**i * sum_{j<=i} c_j * M**-j). fin (xorshift, odd multiply,
xorshift) is a bijection, which lets a chain continue from a published parent hash. K and S_-1
come from the namespace, so two namespaces never share a block and a client who does not know
the server-side tenant salt cannot aim for a collision. Each step costs a few numpy calls over
all blocks at once; their count, not the arithmetic, is what a prompt's hashing time is made of.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
import numpy.typing as npt
import xxhash

from kvtide.errors import UsageError
from kvtide.types import BlockHash, Request

_U64 = np.uint64
_MASK = (1 << 64) - 1
# MurmurHash3 fmix64 multipliers and their inverses mod 2**64.
_F1 = 0xFF51AFD7ED558CCD
_F2 = 0xC4CEB9FE1A85EC53
_F1_INV = pow(_F1, -1, 1 << 64)
_F2_INV = pow(_F2, -1, 1 << 64)
# Chain multiplier: any odd constant works; this one is the 64-bit golden ratio.
_M = 0x9E3779B97F4A7C15
_M_INV = pow(_M, -1, 1 << 64)

U64Array = npt.NDArray[np.uint64]


class BlockHashes(Sequence[BlockHash]):
    """An immutable run of block hashes packed as little-endian uint64 bytes.

    The radix tree slices and compares these as bytes (memcpy/memcmp), which is what makes a
    750-block prompt cost a handful of C calls instead of 750 Python steps. Indexing gives an
    int; slicing (step 1) gives BlockHashes; ``tolist()`` converts in one numpy call.
    """

    __slots__ = ("raw",)

    def __init__(self, raw: bytes = b"") -> None:
        if len(raw) % 8:
            raise UsageError("BlockHashes needs a multiple of 8 bytes")
        self.raw = raw

    @classmethod
    def from_ints(cls, hashes: Iterable[int]) -> BlockHashes:
        if isinstance(hashes, BlockHashes):
            return hashes
        try:
            return cls(np.fromiter(hashes, dtype="<u8").tobytes())
        except (TypeError, ValueError, OverflowError) as exc:
            raise UsageError(
                f"block hashes must be integers in [0, 2**64) (from hash_tokens), got: {exc}"
            ) from exc

    @classmethod
    def from_array(cls, arr: npt.NDArray[np.uint64]) -> BlockHashes:
        return cls(arr.astype("<u8", copy=False).tobytes())

    def __len__(self) -> int:
        return len(self.raw) >> 3

    @overload
    def __getitem__(self, i: int) -> BlockHash: ...

    @overload
    def __getitem__(self, i: slice) -> BlockHashes: ...

    def __getitem__(self, i: int | slice) -> BlockHash | BlockHashes:
        if type(i) is int and 0 <= i < len(self.raw) >> 3:  # the common case, inline
            return BlockHash(int.from_bytes(self.raw[i << 3 : (i << 3) + 8], "little"))
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                raise UsageError("BlockHashes slices must be contiguous")
            return BlockHashes(self.raw[start << 3 : max(stop, start) << 3])
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("block index out of range")
        return BlockHash(int.from_bytes(self.raw[i << 3 : (i << 3) + 8], "little"))

    def __iter__(self) -> Iterator[BlockHash]:
        return iter(self.tolist())

    def tolist(self) -> list[BlockHash]:
        out: list[BlockHash] = np.frombuffer(self.raw, dtype="<u8").tolist()
        return out

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockHashes):
            return self.raw == other.raw
        if isinstance(other, Sequence):
            return self.tolist() == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.raw)

    def __add__(self, other: BlockHashes) -> BlockHashes:
        return BlockHashes(self.raw + other.raw)

    def __repr__(self) -> str:
        return f"BlockHashes({self.tolist()!r})"


def as_block_hashes(hashes: Sequence[int]) -> BlockHashes:
    """Any sequence of hashes as BlockHashes (free when it already is one)."""
    if isinstance(hashes, BlockHashes):
        return hashes
    return BlockHashes.from_ints(hashes)


@dataclass(frozen=True, slots=True)
class Namespace:
    """Everything that must separate two caches' blocks: model, tenant salt, LoRA adapter.

    ``tenant_salt`` is a server-side secret per tenant; never take it from a client.
    """

    model: str = "default"
    tenant_salt: bytes = b""
    lora: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not isinstance(self.lora, str | None):
            raise UsageError(f"Namespace model and lora are strings, got {self!r}")
        if not isinstance(self.tenant_salt, bytes):
            raise UsageError(
                "Namespace tenant_salt is bytes (a server-side secret), "
                f"got {type(self.tenant_salt).__name__}"
            )

    @property
    def seed(self) -> int:
        h = xxhash.xxh3_64()
        h.update(self.model.encode())
        h.update(b"\x00")
        h.update((self.lora or "").encode())
        h.update(b"\x00")
        h.update(self.tenant_salt)
        return h.intdigest()


_S29 = _U64(29)
_S32 = _U64(32)
_S33 = _U64(33)
_F1_U = _U64(_F1)
_F2_U = _U64(_F2)


def fmix64(x: U64Array) -> U64Array:
    """MurmurHash3's 64-bit finaliser, elementwise, into a new array (the input is kept)."""
    x = x ^ (x >> _S33)
    tmp = np.empty_like(x)
    np.multiply(x, _F1_U, out=x)
    np.right_shift(x, _S33, out=tmp)
    np.bitwise_xor(x, tmp, out=x)
    np.multiply(x, _F2_U, out=x)
    np.right_shift(x, _S33, out=tmp)
    np.bitwise_xor(x, tmp, out=x)
    return x


def _mix_inplace(x: U64Array) -> U64Array:
    """One xorshift-multiply round, in place: cheap non-linearity for content hashes."""
    x ^= x >> _S29
    x *= _F1_U
    return x


def _finalize_inplace(x: U64Array) -> U64Array:
    """The published hash of a chain state, in place: a bijection (see finalize_inverse)."""
    x ^= x >> _S32
    x *= _F2_U
    x ^= x >> _S29
    return x


def finalize_inverse(h: int) -> int:
    """The chain state behind a published block hash."""
    x = h ^ (h >> 29) ^ (h >> 58)
    x = (x * _F2_INV) & _MASK
    return x ^ (x >> 32)


def _unxorshift33(x: int) -> int:
    # x ^ (x >> 33) is its own inverse for shifts of at least half the width.
    return x ^ (x >> 33)


def fmix64_inverse(h: int) -> int:
    x = _unxorshift33(h)
    x = (x * _F2_INV) & _MASK
    x = _unxorshift33(x)
    x = (x * _F1_INV) & _MASK
    return _unxorshift33(x)


class _Keys:
    """Per-seed position keys and chain powers, grown on demand and reused across calls."""

    __slots__ = ("m_inv_pows", "m_pows", "position_keys", "seed", "seed_state", "start_terms")

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.position_keys: dict[int, U64Array] = {}
        self.seed_state = int(self._stream().integers(0, 2**63, dtype=np.int64)) * 2 + 1
        self.m_pows: U64Array = np.ones(1, dtype=np.uint64)
        self.m_inv_pows: U64Array = np.ones(1, dtype=np.uint64)
        self.start_terms: U64Array = np.ones(0, dtype=np.uint64)  # M**(i+1) * S_-1

    def keys_for(self, block_tokens: int) -> U64Array:
        keys = self.position_keys.get(block_tokens)
        if keys is None:
            # Each block size draws from a fresh stream, so its keys do not depend on which
            # sizes this process hashed before (a shared stream made a 16-token run's hashes
            # differ after a 512-token run: same scenario, different result).
            rng = self._stream()
            rng.integers(0, 2**63, dtype=np.int64)  # the seed state's draw
            raw = rng.integers(0, 2**63, size=block_tokens, dtype=np.int64)
            keys = raw.astype(np.uint64) * _U64(2) + _U64(1)
            self.position_keys[block_tokens] = keys
        return keys

    def _stream(self) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(self.seed))

    def powers(self, n: int) -> tuple[U64Array, U64Array]:
        if len(self.m_pows) < n + 1:
            size = max(n + 1, 2 * len(self.m_pows))
            self.m_pows = _powers(_M, size)
            self.m_inv_pows = _powers(_M_INV, size)
            self.start_terms = self.m_pows[1:] * _U64(self.seed_state)
        return self.m_pows, self.m_inv_pows


_KEYS_BY_SEED: dict[int, _Keys] = {}


def _keys(seed: int) -> _Keys:
    keys = _KEYS_BY_SEED.get(seed)
    if keys is None:
        if len(_KEYS_BY_SEED) > 4096:  # tenants come and go; keep the memo bounded
            _KEYS_BY_SEED.clear()
        keys = _KEYS_BY_SEED[seed] = _Keys(seed)
    return keys


def _powers(base: int, n: int) -> U64Array:
    out = np.empty(n, dtype=np.uint64)
    acc = 1
    for i in range(n):
        out[i] = acc
        acc = (acc * base) & _MASK
    return out


def _chain(content: U64Array, keys: _Keys, parent: BlockHash | None) -> BlockHashes:
    n = len(content)
    if n == 0:
        return BlockHashes()
    m_pows, m_inv_pows = keys.powers(n)
    # S_i = M^(i+1) * S_-1 + M^i * sum_{j<=i} c_j * M^-j  (mod 2**64: uint64 arrays wrap
    # silently, which is exactly the arithmetic wanted)
    content *= m_inv_pows[:n]
    state = np.cumsum(content, dtype=np.uint64)
    state *= m_pows[:n]
    if parent is None:
        state += keys.start_terms[:n]
    else:
        state += m_pows[1 : n + 1] * _U64(finalize_inverse(parent))
    return BlockHashes(_finalize_inplace(state).astype("<u8", copy=False).tobytes())


def _check_seed(seed: object) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        hint = " (pass namespace.seed)" if isinstance(seed, Namespace) else ""
        raise UsageError(f"seed must be an integer{hint}, got {type(seed).__name__}")
    if not 0 <= seed < 1 << 64:
        raise UsageError(f"seed must lie in [0, 2**64) like Namespace.seed, got {seed}")


def _id_array(values: object, what: str) -> npt.NDArray[np.integer]:
    """``values`` as a 1-D numpy integer array (no copy when it already is one), or a
    ``UsageError`` that says what was wrong with it."""
    if isinstance(values, (str, bytes)):
        raise UsageError(f"{what} must be a sequence of integers, not {type(values).__name__}")
    arr = np.asarray(values)
    if arr.ndim != 1:
        kind = "a generator or scalar" if arr.ndim == 0 else f"a {arr.ndim}-D array"
        raise UsageError(f"{what} must be a one-dimensional sequence of integers, got {kind}")
    if arr.dtype.kind not in "iu":
        if len(arr) == 0:  # np.asarray([]) is float64: an empty prompt is still a prompt
            return np.empty(0, dtype=np.int64)
        raise UsageError(f"{what} must be integers, got an array of {arr.dtype}")
    # min() is one C pass: 2-6 us, 2-9% of hashing a 2k- to 32k-token prompt as measured here.
    if arr.dtype.kind == "i" and len(arr) and arr.min() < 0:
        raise UsageError(f"{what} must be >= 0, got {int(arr.min())}")
    return arr


def hash_tokens(
    tokens: Sequence[int] | npt.NDArray[np.integer],
    block_tokens: int,
    seed: int,
    parent: BlockHash | None = None,
) -> BlockHashes:
    """Chained hashes of the full blocks of ``tokens``; a partial tail block is not hashed.

    ``tokens`` is a one-dimensional run of non-negative integer token ids: a list, tuple or
    ``range`` of ints, an ``array.array`` with an integer type code, or a numpy integer array
    of any width (int32 and int64 arrays hash without a conversion). Floats, bools, strings,
    generators, arrays of more than one dimension and negative ids raise ``UsageError``, as
    does a ``block_tokens`` below 1. ``parent`` continues a chain from a published hash.
    """
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int | np.integer):
        raise UsageError(f"block_tokens must be an integer >= 1, got {block_tokens!r}")
    if block_tokens < 1:
        raise UsageError(f"block_tokens must be an integer >= 1, got {block_tokens!r}")
    _check_seed(seed)
    arr = _id_array(tokens, "token ids")
    n_blocks = len(arr) // block_tokens
    if n_blocks == 0:
        return BlockHashes()
    keys = _keys(seed)
    head = arr[: n_blocks * block_tokens]
    # Same-width signed ints reinterpret for free; _id_array refused negative ids.
    flat: U64Array = head.view(np.uint64) if head.dtype == np.int64 else head.astype(np.uint64)
    content = _mix_inplace(flat.reshape(n_blocks, block_tokens) @ keys.keys_for(block_tokens))
    return _chain(content, keys, parent)


def hash_block_ids(
    ids: Sequence[int] | npt.NDArray[np.integer], seed: int, parent: BlockHash | None = None
) -> BlockHashes:
    """Chained hashes of per-block ids from a trace (content ids or already-chained ids alike).

    ``ids`` takes what ``hash_tokens`` takes: non-negative integers, one dimension."""
    _check_seed(seed)
    arr = _id_array(ids, "block ids")
    if len(arr) == 0:
        return BlockHashes()
    keys = _keys(seed)
    u = arr.astype(np.uint64, copy=False)
    content = _mix_inplace(u * keys.keys_for(1)[0] + _U64(0x632BE59BD9B4E019))
    return _chain(content, keys, parent)


def expand_block_ids(
    ids: Sequence[int], native_block_tokens: int, num_tokens: int
) -> npt.NDArray[np.int64]:
    """Token ids standing for trace blocks: position j of block id h becomes a token from (h, j).

    Lets a trace recorded at one block size be replayed at another. Token ids are 31-bit.
    """
    arr = np.asarray(ids, dtype=np.uint64)
    pos = np.arange(native_block_tokens, dtype=np.uint64)
    grid = fmix64(arr[:, None] * _U64(0x9E3779B97F4A7C15) + pos[None, :])
    return (grid.reshape(-1)[:num_tokens] >> _U64(33)).astype(np.int64)


def request_block_hashes(req: Request, block_tokens: int, seed: int) -> BlockHashes:
    """The chained hashes of a request's full blocks at ``block_tokens`` tokens per block."""
    if req.token_ids is not None:
        return hash_tokens(req.token_ids[: req.prompt_tokens], block_tokens, seed)
    if req.block_ids is None:
        return BlockHashes()
    if block_tokens == req.block_tokens:
        return hash_block_ids(req.block_ids[: req.prompt_tokens // block_tokens], seed)
    tokens = expand_block_ids(req.block_ids, req.block_tokens, req.prompt_tokens)
    return hash_tokens(tokens, block_tokens, seed)
