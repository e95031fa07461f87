"""A compressed radix tree over chained block hashes: match / insert / lock / unlock / evict.

Each node holds a run of blocks (``Node.key``), so matching costs O(nodes on the path) list
comparisons done in C, not O(blocks) Python steps. The tree knows no policy: it reports every
change to the ``EvictionPolicy`` of the node's partition and trims the tail of whichever leaf
the policy names, block by block, so eviction is exact (no whole-node over-eviction).

Partitions: with per-tenant quotas each tenant's nodes are ranked by a policy of their own,
and eviction takes from the tenant furthest above its fair share, so one tenant's burst
cannot flush another tenant's hot prefixes. Without quotas one policy ranks every node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from kvtide.clock import Clock
from kvtide.core.block_pool import BlockPool
from kvtide.core.eviction import EvictionPolicy
from kvtide.core.node import Node
from kvtide.types import BlockHash


class TreeListener(Protocol):
    def stored(self, node: Node, hashes: list[BlockHash]) -> None: ...

    def removed(self, node: Node, hashes: list[BlockHash]) -> None: ...


class NullListener:
    __slots__ = ()

    def stored(self, node: Node, hashes: list[BlockHash]) -> None:
        pass

    def removed(self, node: Node, hashes: list[BlockHash]) -> None:
        pass


def _common_prefix(key: list[BlockHash], hashes: Sequence[BlockHash], pos: int) -> int:
    """Length of the common prefix of ``key`` and ``hashes[pos:]``; ``key[0]`` already matched."""
    lo, hi = 1, min(len(key), len(hashes) - pos)
    while lo < hi:  # galloping would also do; slices compare in C either way
        mid = (lo + hi + 1) // 2
        if key[:mid] == hashes[pos : pos + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class RadixTree:
    def __init__(
        self,
        pool: BlockPool,
        make_policy: Callable[[], EvictionPolicy],
        clock: Clock,
        *,
        tenant_quota_blocks: Mapping[str, int] | None = None,
        listener: TreeListener | None = None,
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.root = Node(None, [], [], 0)
        self.root.lock_ref = 1  # the root is never evicted
        self.listener: TreeListener = listener or NullListener()
        self.tick = 0
        self.num_cached_blocks = 0
        self.num_evicted_total = 0
        self.version = 0  # bumped by anything that can invalidate a match result
        self._make_policy = make_policy
        self._quotas = dict(tenant_quota_blocks) if tenant_quota_blocks else None
        self._single: EvictionPolicy | None = None if self._quotas else make_policy()
        self._policies: dict[str, EvictionPolicy] = {}
        self.usage_blocks: dict[str, int] = {}

    # --- policies and partitions -------------------------------------------------------

    def policy_for(self, node: Node) -> EvictionPolicy:
        if self._single is not None:
            return self._single
        policy = self._policies.get(node.tenant)
        if policy is None:
            policy = self._policies[node.tenant] = self._make_policy()
        return policy

    def fair_share_blocks(self, tenant: str) -> float:
        """The blocks a tenant is guaranteed: its quota, or an equal part of what is left."""
        assert self._quotas is not None
        quota = self._quotas.get(tenant)
        if quota is not None:
            return float(quota)
        unlisted = [t for t in self.usage_blocks if t not in self._quotas] or [tenant]
        left = max(self.pool.num_blocks - sum(self._quotas.values()), len(unlisted))
        return left / len(unlisted)

    def _victim(self) -> Node | None:
        if self._single is not None:
            return self._single.victim()
        order = sorted(
            self._policies,
            key=lambda t: self.usage_blocks.get(t, 0) / self.fair_share_blocks(t),
            reverse=True,
        )
        for tenant in order:
            node = self._policies[tenant].victim()
            if node is not None:
                return node
        return None

    # --- matching ------------------------------------------------------------------------

    def match(self, hashes: Sequence[BlockHash], *, touch: bool = True) -> tuple[Node, int]:
        """The deepest node fully matched by a prefix of ``hashes`` and the matched block count.

        With ``touch`` the path counts as used (and a partly matched node is split so that
        each node keeps one access history); without it the tree is left exactly as it was.
        """
        node = self.root
        pos = 0
        n = len(hashes)
        path: list[Node] = []
        while pos < n:
            child = node.children.get(hashes[pos])
            if child is None:
                break
            key = child.key
            k = len(key)
            if hashes[pos : pos + k] != key:
                k = _common_prefix(key, hashes, pos)
                if not touch:
                    return node, pos  # a partial node is not a usable handle without a split
                child = self._split(child, k)
            pos += k
            node = child
            path.append(node)
        if touch:
            self._touch(path)
        return node, pos

    def _touch(self, path: list[Node]) -> None:
        self.tick += 1
        tick = self.tick
        now = self.clock.now()
        for node in path:
            node.last_access = tick
            node.last_access_s = now
            node.hits += 1
            self.policy_for(node).on_access(node)

    def _split(self, node: Node, k: int) -> Node:
        """Splits ``node`` after its first ``k`` blocks and returns the new head node."""
        parent = node.parent
        assert parent is not None
        head = Node(parent, node.key[:k], node.blocks[:k], node.depth, node.tenant)
        head.lock_ref = node.lock_ref
        head.pin_ref = node.pin_ref
        head.last_access = node.last_access
        head.last_access_s = node.last_access_s
        head.created_s = node.created_s
        head.hits = node.hits
        head.priority = node.priority
        parent.children[head.key[0]] = head
        del node.key[:k]
        del node.blocks[:k]
        node.depth += k
        node.parent = head
        head.children[node.key[0]] = node
        self.policy_for(node).on_split(head, node)
        self.version += 1
        return head

    def block_ids(self, node: Node) -> list[int]:
        """Pool block ids from the root through ``node``, in prefix order."""
        runs: list[list[int]] = []
        while node.parent is not None:
            runs.append(node.blocks)
            node = node.parent
        out: list[int] = []
        for run in reversed(runs):
            out.extend(run)
        return out

    def hashes(self, node: Node) -> list[BlockHash]:
        runs: list[list[BlockHash]] = []
        while node.parent is not None:
            runs.append(node.key)
            node = node.parent
        out: list[BlockHash] = []
        for run in reversed(runs):
            out.extend(run)
        return out

    # --- insertion -----------------------------------------------------------------------

    def insert(
        self,
        hashes: Sequence[BlockHash],
        *,
        start: tuple[Node, int] | None = None,
        tenant: str = "",
        priority: int = 0,
    ) -> tuple[Node, int]:
        """Caches the blocks of ``hashes`` not cached yet; returns the deepest node and the
        number of new blocks. Evicts as needed; when locked blocks leave too little room, only
        the prefix that fits is inserted. ``start`` is a fresh ``match`` result to skip the walk.
        """
        node, pos = start if start is not None else self.match(hashes)
        n = len(hashes)
        if pos >= n:
            return node, 0
        self.lock(node)  # the path we extend must survive the evictions below
        want = n - pos
        blocks = self.pool.try_allocate(want)
        if blocks is None:
            self.evict(want - self.pool.num_free)
            blocks = self.pool.try_allocate(min(want, self.pool.num_free))
            assert blocks is not None
        if not blocks:
            self.unlock(node)
            return node, 0
        key = list(hashes[pos : pos + len(blocks)])
        leaf = Node(node, key, blocks, pos, tenant)
        leaf.last_access = self.tick
        leaf.last_access_s = leaf.created_s = self.clock.now()
        leaf.priority = priority
        if node.parent is not None and not node.children:
            self.policy_for(node).on_unevictable(node)
        node.children[key[0]] = leaf
        self.num_cached_blocks += len(blocks)
        self.usage_blocks[tenant] = self.usage_blocks.get(tenant, 0) + len(blocks)
        self.version += 1
        self.policy_for(leaf).on_insert(leaf)
        self.listener.stored(leaf, key)
        self.unlock(node)
        return leaf, len(blocks)

    # --- locking -------------------------------------------------------------------------

    def lock(self, node: Node) -> None:
        """Protects ``node`` and its ancestors from eviction until ``unlock(node)``."""
        while node.parent is not None:
            if node.lock_ref == 0 and not node.children:
                self.policy_for(node).on_unevictable(node)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node.parent is not None:
            if node.lock_ref <= 0:
                raise ValueError("unlock without a matching lock")
            node.lock_ref -= 1
            if node.lock_ref == 0 and not node.children:
                self.policy_for(node).on_evictable(node)
            node = node.parent

    # --- eviction ------------------------------------------------------------------------

    def evict(self, num_blocks: int) -> int:
        """Frees up to ``num_blocks`` blocks from unlocked leaves; returns how many it freed."""
        freed = 0
        while freed < num_blocks:
            node = self._victim()
            if node is None:
                break
            freed += self._trim(node, min(num_blocks - freed, len(node.key)))
        return freed

    def _trim(self, node: Node, k: int) -> int:
        hashes = node.key[-k:]
        blocks = node.blocks[-k:]
        first = node.key[0]
        del node.key[-k:]
        del node.blocks[-k:]
        self.pool.free(blocks)
        self.num_cached_blocks -= k
        self.num_evicted_total += k
        self.usage_blocks[node.tenant] -= k
        self.version += 1
        policy = self.policy_for(node)
        parent = node.parent
        assert parent is not None
        if not node.key:
            del parent.children[first]
            node.parent = None
        policy.on_evict(node, k, hashes)
        self.listener.removed(node, hashes)
        if node.parent is None and parent.parent is not None and parent.is_evictable:
            self.policy_for(parent).on_evictable(parent)
        return k

    def clear(self) -> None:
        """Drops every unlocked block."""
        self.evict(self.num_cached_blocks)
