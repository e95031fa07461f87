"""Tiny block-level reference policies for the differential tests of the tree's policies.

Each reference keeps one record per block in plain dicts and lists and scans linearly: slow and
obviously correct. ``BlockCache`` reproduces the cache's request semantics around them: hit the
longest cached prefix, touch it, evict block by block (never the request's hit blocks, only
blocks without a cached child) until the missing blocks fit, insert what fits.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import strategies as st

from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.core.node import Node
from kvtide.costs.specs import model_preset
from kvtide.types import BlockHash


def chained(path: list[int]) -> list[BlockHash]:
    """Distinct chained ids standing for a path of labels (equal prefixes, equal ids)."""
    out, acc = [], 0
    for x in path:
        acc = hash((acc, x)) & 0xFFFFFFFFFFFFFFFF
        out.append(BlockHash(acc))
    return out


def cached_prefix(cache: KVCache, path: list[int]) -> int:
    """How many leading blocks of ``path`` are cached (the tree is not touched)."""
    return cache.match(chained(path), touch=False).num_blocks


def cached_hashes(cache: KVCache) -> set[int]:
    out: set[int] = set()
    stack: list[Node] = [cache.tree.root]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node.parent is not None:
            out.update(cache.tree.hashes(node).tolist()[node.depth :])
    return out


@dataclass
class Block:
    depth: int
    parent: int | None
    inserted_tick: int
    last_tick: int
    hits: int = 0
    data: dict[str, object] = field(default_factory=dict)


class BlockCache:
    """Request semantics of ``KVCache.access`` over a block-level policy."""

    def __init__(self, capacity: int, policy: RefPolicy) -> None:
        self.capacity = capacity
        self.policy = policy
        self.blocks: dict[int, Block] = {}
        self.tick = 0
        policy.cache = self

    def is_leaf(self, h: int) -> bool:
        return not any(b.parent == h for b in self.blocks.values())

    def access(self, hashes: list[BlockHash]) -> int:
        self.tick += 1
        hit = 0
        while hit < len(hashes) and hashes[hit] in self.blocks:
            hit += 1
        touched = hashes[:hit]
        for h in touched:
            b = self.blocks[h]
            b.hits += 1
            b.last_tick = self.tick
        self.policy.touch(touched)
        want = len(hashes) - hit
        locked = set(touched)
        while self.capacity - len(self.blocks) < want:
            candidates = [h for h in self.blocks if h not in locked and self.is_leaf(h)]
            # Asked even when nothing can go, as the tree asks: a search may move queue state.
            victim = self.policy.victim(candidates)
            if victim is None:
                assert not candidates
                break
            assert victim in candidates
            self.policy.evicted(victim)  # the block is still there to look at
            del self.blocks[victim]
        room = min(want, self.capacity - len(self.blocks))
        new = hashes[hit : hit + room]
        for i, h in enumerate(new):
            depth = hit + i
            parent = hashes[depth - 1] if depth else None
            self.blocks[h] = Block(depth, parent, self.tick, self.tick)
        if new:
            self.policy.inserted(new)
        return hit


class RefPolicy:
    cache: BlockCache

    def touch(self, path: list[BlockHash]) -> None:
        pass

    def inserted(self, new: list[BlockHash]) -> None:
        pass

    def victim(self, candidates: list[int]) -> int | None:
        raise NotImplementedError

    def evicted(self, h: int) -> None:
        pass


class RefGreedyDual(RefPolicy):
    """H = L + (hits + 1) · value(depth); L rises to each evicted H; ties: least recent, deepest."""

    def __init__(self, value: Callable[[int], float] = lambda depth: 1.0) -> None:
        self.value = value
        self.inflation = 0.0

    def _h(self, h: int) -> float:
        b = self.cache.blocks[h]
        base = b.data["base"]
        assert isinstance(base, float)
        return base + (b.hits + 1) * self.value(b.depth)

    def touch(self, path: list[BlockHash]) -> None:
        for h in path:
            self.cache.blocks[h].data["base"] = self.inflation

    def inserted(self, new: list[BlockHash]) -> None:
        self.touch(new)

    def victim(self, candidates: list[int]) -> int | None:
        blocks = self.cache.blocks
        return min(
            candidates,
            key=lambda h: (self._h(h), blocks[h].last_tick, -blocks[h].depth),
            default=None,
        )

    def evicted(self, h: int) -> None:
        self.inflation = max(self.inflation, self._h(h))


def recompute_value(model: str, block_tokens: int) -> Callable[[int], float]:
    """Prefill FLOPs of a block at ``depth`` over those of a first block (core.specs)."""
    spec = model_preset(model)
    t = block_tokens

    def flops(depth: int) -> float:
        p = depth * t
        return 2.0 * spec.matmul_params * t + spec.attention_flops_per_pair * (
            t * p + t * (t + 1) / 2
        )

    return lambda depth: flops(depth) / flops(0)


class RefS3FIFO(RefPolicy):
    """S3-FIFO over blocks; blocks that cannot go are passed to the back of their queue."""

    def __init__(self, capacity: int, small_ratio: float = 0.1, ghost_ratio: float = 0.9) -> None:
        self.small: list[int] = []
        self.main: list[int] = []
        self.freq: dict[int, int] = {}
        self.where: dict[int, str] = {}
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.small_target = max(1.0, small_ratio * capacity)
        self.ghost_limit = int(ghost_ratio * capacity)

    def touch(self, path: list[BlockHash]) -> None:
        for h in path:
            self.freq[h] = min(self.freq[h] + 1, 3)

    def inserted(self, new: list[BlockHash]) -> None:
        for h in reversed(new):  # the deepest block is the oldest of a run: it leaves first
            self.freq[h] = 0
            if h in self.ghost:
                del self.ghost[h]
                self.main.append(h)
                self.where[h] = "main"
            else:
                self.small.append(h)
                self.where[h] = "small"
        while len(self.ghost) > self.ghost_limit:
            self.ghost.popitem(last=False)

    def victim(self, candidates: list[int]) -> int | None:
        ok = set(candidates)
        if len(self.small) > self.small_target or not self.main:
            return self._small(ok) or self._main(ok)
        return self._main(ok) or self._small(ok) or self._main(ok)

    def _small(self, ok: set[int]) -> int | None:
        for _ in range(len(self.small)):
            h = self.small.pop(0)
            if self.freq[h] >= 1:
                self.freq[h] = 0
                self.main.append(h)
                self.where[h] = "main"
            elif h not in ok:
                self.small.append(h)
            else:
                self.small.insert(0, h)
                return h
        return None

    def _main(self, ok: set[int]) -> int | None:
        for _ in range(4 * len(self.main)):
            h = self.main.pop(0)
            if self.freq[h] > 0:
                self.freq[h] -= 1
                self.main.append(h)
            elif h not in ok:
                self.main.append(h)
            else:
                self.main.insert(0, h)
                return h
        return None

    def evicted(self, h: int) -> None:
        queue = self.small if self.where[h] == "small" else self.main
        queue.remove(h)
        if self.where.pop(h) == "small" and self.ghost_limit:
            self.ghost[h] = None
            self.ghost.move_to_end(h)
        del self.freq[h]


class RefSLRU(RefPolicy):
    """Probation and protected LRU lists of blocks; a hit path is applied deepest first."""

    def __init__(self, capacity: int, protected_ratio: float = 0.8) -> None:
        self.probation: list[int] = []
        self.protected: list[int] = []
        self.limit = protected_ratio * capacity

    def touch(self, path: list[BlockHash]) -> None:
        for h in reversed(path):
            if h in self.protected:
                self.protected.remove(h)
            else:
                self.probation.remove(h)
            self.protected.append(h)
        while len(self.protected) > self.limit:
            self.probation.append(self.protected.pop(0))

    def inserted(self, new: list[BlockHash]) -> None:
        self.probation.extend(reversed(new))

    def victim(self, candidates: list[int]) -> int | None:
        ok = set(candidates)
        return next((h for h in self.probation + self.protected if h in ok), None)

    def evicted(self, h: int) -> None:
        (self.probation if h in self.probation else self.protected).remove(h)


class RefTide(RefPolicy):
    """Probation and main over blocks; the victim is the older of each segment's least recent
    leaf block, probation ages divided by β; ghosts of evicted blocks teach β (ARC's rule)."""

    def __init__(self, capacity: int, ghost_ratio: float = 2.0, learning_rate: float = 4.0) -> None:
        self.segment: dict[int, str] = {}
        self.stamp: dict[int, int] = {}
        self.clock = 0
        self.ghost: dict[str, OrderedDict[int, None]] = {"p": OrderedDict(), "m": OrderedDict()}
        self.limit = int(ghost_ratio * capacity)
        self.step = learning_rate / capacity
        self.log_beta = 0.0

    def touch(self, path: list[BlockHash]) -> None:
        for h in path:
            self.segment[h] = "m"
            self.stamp[h] = self.clock

    def inserted(self, new: list[BlockHash]) -> None:
        stamp = self.clock
        self.clock += len(new)
        back = {g: ghost.pop(new[0], "gone") != "gone" for g, ghost in self.ghost.items()}
        gp, gm = len(self.ghost["p"]), len(self.ghost["m"])
        if back["p"]:
            self.log_beta += self.step * max(1.0, gm / max(gp, 1))
        if back["m"]:
            self.log_beta -= self.step * max(1.0, gp / max(gm, 1))
        self.log_beta = min(math.log(4.0), max(math.log(1 / 256), self.log_beta))
        for h in new:
            self.segment[h] = "m" if back["p"] or back["m"] else "p"
            self.stamp[h] = stamp
        for ghost in self.ghost.values():
            while len(ghost) > self.limit:
                ghost.popitem(last=False)

    def victim(self, candidates: list[int]) -> int | None:
        if not candidates:
            return None
        blocks = self.cache.blocks

        def lru_key(h: int) -> tuple[int, int]:
            return (blocks[h].last_tick, -blocks[h].depth)

        prob = [h for h in candidates if self.segment[h] == "p"]
        main = [h for h in candidates if self.segment[h] == "m"]
        if not prob or not main:
            return min(prob or main, key=lru_key)
        p, m = min(prob, key=lru_key), min(main, key=lru_key)
        age_p = self.clock - self.stamp[p]
        scaled_m = math.exp(self.log_beta) * (self.clock - self.stamp[m])
        if age_p != scaled_m:
            return p if age_p > scaled_m else m
        return min(p, m, key=lru_key)

    def evicted(self, h: int) -> None:
        if self.limit:
            ghost = self.ghost[self.segment[h]]
            ghost.pop(h, None)
            ghost[h] = None
        del self.segment[h], self.stamp[h]


def make_cache(policy: str, capacity: int, **options: object) -> KVCache:
    config = CacheConfig(
        capacity_blocks=capacity, block_tokens=1, policy=policy, policy_options=options
    )
    return KVCache(config, ManualClock())


def same_step(cache: KVCache, ref: BlockCache, path: list[int]) -> None:
    """One request through both; they must hit the same blocks and keep the same ones."""
    hashes = chained(path)
    got = cache.access(hashes, len(hashes))
    assert got.hit_blocks == ref.access(hashes)
    assert cached_hashes(cache) == set(ref.blocks)


def drive_one_block_at_a_time(data: st.DataObject, cache: KVCache, ref: BlockCache) -> None:
    """Requests that each add at most one block, so every tree node holds one block and the
    tree's node-level decisions must equal the reference's block-level ones exactly."""
    paths: list[list[int]] = [[]]
    for _ in range(data.draw(st.integers(1, 40), label="requests")):
        base = data.draw(st.sampled_from(paths))
        hashes = chained(base)
        cached = 0
        while cached < len(hashes) and hashes[cached] in ref.blocks:
            cached += 1
        keep = data.draw(st.integers(0, cached))
        label = data.draw(st.one_of(st.none(), st.integers(0, 2)))
        path = base[:keep] + ([] if label is None else [label])
        same_step(cache, ref, path)
        paths.append(path)


general_requests = st.lists(
    st.lists(st.integers(0, 3), min_size=0, max_size=12), min_size=1, max_size=60
)
