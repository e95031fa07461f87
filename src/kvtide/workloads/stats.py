"""One pass over a workload: its size, lengths and how much prefix reuse it offers."""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Iterable

import numpy as np

from kvtide.types import Request


def stats(requests: Iterable[Request]) -> dict[str, object]:
    """Summary for reports; JSON-ready.

    ``infinite_cache_hit_ratio`` is the share of prompt tokens an unbounded cache would serve
    at each request's own (native) block size: the full blocks of the longest prefix already
    seen, over all prompt tokens. Blocks are keyed by their whole prefix (``_PrefixKeys``).
    ``unique_block_fraction`` is distinct full blocks over all full blocks.
    """
    keys = _PrefixKeys()
    prompt_tokens: list[int] = []
    num_output_tokens = num_hit_tokens = num_blocks = 0
    first_s = last_s = 0.0
    tenants: set[str] = set()
    sessions: set[str] = set()
    for request in requests:
        if not prompt_tokens:
            first_s = request.arrival_s
        last_s = request.arrival_s
        prompt_tokens.append(request.prompt_tokens)
        num_output_tokens += request.output_tokens
        tenants.add(request.tenant)
        if request.session_id is not None:
            sessions.add(request.session_id)
        num_hit_blocks = 0
        is_hit = True
        for _, is_new in keys.of(request):
            is_hit = is_hit and not is_new
            num_hit_blocks += is_hit
            num_blocks += 1
        num_hit_tokens += num_hit_blocks * request.block_tokens
    num_prompt_tokens = sum(prompt_tokens)
    return {
        "requests": len(prompt_tokens),
        "duration_s": last_s - first_s,
        "prompt_tokens": num_prompt_tokens,
        "output_tokens": num_output_tokens,
        "mean_prompt_tokens": num_prompt_tokens / len(prompt_tokens) if prompt_tokens else 0.0,
        "p50_prompt_tokens": statistics.median(prompt_tokens) if prompt_tokens else 0.0,
        "tenants": len(tenants),
        "sessions": len(sessions),
        "unique_block_fraction": len(keys) / num_blocks if num_blocks else 0.0,
        "infinite_cache_hit_ratio": num_hit_tokens / num_prompt_tokens
        if num_prompt_tokens
        else 0.0,
    }


def _full_blocks(request: Request) -> Iterable[Hashable]:
    """The request's full blocks: token bytes, or block ids (the partial last block dropped)."""
    num_full = request.prompt_tokens // request.block_tokens
    if request.token_ids is not None:
        data = np.asarray(request.token_ids, dtype=np.int32).tobytes()
        size = 4 * request.block_tokens
        return (data[i * size : (i + 1) * size] for i in range(num_full))
    if request.block_ids is not None:
        return request.block_ids[:num_full]
    return ()


class _PrefixKeys:
    """Interns full blocks by their whole prefix (the same chain of blocks, the same key), so
    content ids such as Bailian's are chained, never matched alone. Keys count from 0."""

    def __init__(self) -> None:
        self._keys: dict[tuple[int, Hashable], int] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def of(self, request: Request) -> list[tuple[int, bool]]:
        """Each full block's key and whether this request is the first to hold it."""
        out = []
        parent = -1
        for block in _full_blocks(request):
            key = self._keys.get((parent, block))
            if key is None:
                key = self._keys[(parent, block)] = len(self._keys)
                out.append((key, True))
            else:
                out.append((key, False))
            parent = key
        return out


def peak_reused_tokens(requests: Iterable[Request]) -> int:
    """The most prompt tokens that are, at one moment, cached and still to be reused: the
    KV capacity a fleet needs to serve every prefix hit an unbounded cache would.

    A full block (keyed by its whole prefix, as in ``stats``) is live from the request that
    first computes it until the last request that reuses it; a block used once is never
    live. The peak, over the requests in arrival order, of the live blocks' tokens is what a
    cache with perfect (next-use) eviction must hold; an LRU cache, or a fleet that splits
    a prefix over replicas, needs more. Sizing a benchmark's KV as a fraction of this puts
    its capacity under pressure by construction, whatever the workload's lengths.
    """
    keys = _PrefixKeys()
    first: list[int] = []  # per key: index of the request that first held it
    last: list[int] = []  # ... and of the last one that used it
    tokens: list[int] = []
    n = 0
    for n, request in enumerate(requests):
        for key, is_new in keys.of(request):
            if is_new:
                first.append(n)
                last.append(n)
                tokens.append(request.block_tokens)
            else:
                last[key] = n
    delta = np.zeros(n + 2, dtype=np.int64)
    for f, x, t in zip(first, last, tokens, strict=True):
        if x > f:
            delta[f] += t
            delta[x] -= t
    return int(np.cumsum(delta).max()) if first else 0


def lru_reuse_tokens(requests: Iterable[Request], share: float = 0.9) -> int:
    """The smallest LRU cache, in tokens, that serves ``share`` of the workload's reused
    blocks: the ``share`` quantile of their LRU stack distances (Mattson et al., 1970: the
    distinct blocks referenced since the block's previous use, counted here in a Fenwick tree
    over reference times). Blocks are prefix-keyed as in ``stats``.

    It complements ``peak_reused_tokens``: that is what perfect eviction needs, this what the
    engines' LRU needs, which is far more when reuse gaps are long against the rate of new
    tokens (a trace's conversations coming back minutes later).
    """
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be in (0, 1], got {share}")
    keys = _PrefixKeys()
    refs: list[int] = []
    block_tokens = 0
    for request in requests:
        block_tokens = request.block_tokens
        refs.extend(key for key, _ in keys.of(request))
    n = len(refs)
    tree = [0] * (n + 1)  # Fenwick tree: 1 at each block's latest reference time

    def add(i: int, value: int) -> None:
        i += 1
        while i <= n:
            tree[i] += value
            i += i & -i

    def prefix(i: int) -> int:  # sum over times [0, i]
        total = 0
        i += 1
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total

    last: dict[int, int] = {}
    distances: list[int] = []
    for t, key in enumerate(refs):
        before = last.get(key)
        if before is not None:
            distances.append(prefix(t - 1) - prefix(before) + 1)  # + itself: blocks held
            add(before, -1)
        add(t, 1)
        last[key] = t
    if not distances:
        return 0
    return int(np.quantile(np.asarray(distances), share, method="inverted_cdf")) * block_tokens
