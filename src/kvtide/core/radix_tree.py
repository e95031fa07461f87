"""A compressed radix tree over chained block hashes: match / insert / lock / unlock / evict.

Each node holds a run of blocks (``Node.key``, packed hash bytes), so matching costs O(nodes on
the path) memcmp calls, not O(blocks) Python steps. The tree knows no policy: it reports every
change to the ``EvictionPolicy`` of the node's partition and trims the tail of whichever leaf
the policy names, block by block, so eviction is exact (no whole-node over-eviction).

Partitions: with per-tenant quotas each tenant's nodes are ranked by a policy of their own,
and eviction takes from the tenant furthest above its fair share, so one tenant's burst
cannot flush another tenant's hot prefixes. Without quotas one policy ranks every node.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from kvtide.clock import Clock
from kvtide.core.block_pool import BlockPool
from kvtide.core.eviction import EvictionPolicy
from kvtide.core.hashing import BlockHashes, as_block_hashes
from kvtide.core.node import Node
from kvtide.errors import UsageError


class TreeListener(Protocol):
    """Told of every store and removal. ``removed`` runs before an emptied node is detached,
    so ``tree.hashes(node) + hashes`` is the full prefix path of the removed blocks."""

    def stored(self, node: Node, hashes: BlockHashes) -> None: ...

    def removed(self, node: Node, hashes: BlockHashes) -> None: ...


class NullListener:
    __slots__ = ()

    def stored(self, node: Node, hashes: BlockHashes) -> None:
        pass

    def removed(self, node: Node, hashes: BlockHashes) -> None:
        pass


class TouchListener(Protocol):
    """Told of every touched path before its nodes' ``last_access_s`` move to ``now_s``, so
    ``now_s - node.last_access_s`` is each block's reuse gap (telemetry's reuse-gap histogram
    over every block). Called once per ``match``; keep it cheap."""

    def touched(self, path: list[Node], now_s: float) -> None: ...


class NullTouchListener:
    __slots__ = ()

    def touched(self, path: list[Node], now_s: float) -> None:
        pass


def _common_blocks(key: bytes, raw: bytes, p: int) -> int:
    """Blocks shared by ``key`` and ``raw[p:]`` (byte offsets); their first block matched."""
    lo, hi = 1, min(len(key), len(raw) - p) >> 3
    while lo < hi:  # binary search over memcmp: O(log n) C calls
        mid = (lo + hi + 1) >> 1
        if key[: mid << 3] == raw[p : p + (mid << 3)]:
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
        self.root = Node(None, b"", array("i"), 0)
        self.root.lock_ref = 1  # the root is never evicted
        self.listener: TreeListener = listener or NullListener()
        self.touch_listener: TouchListener = NullTouchListener()
        self.tick = 0
        self.num_cached_blocks = 0
        self.num_locked_blocks = 0  # blocks of nodes with lock_ref > 0 (the rest is evictable)
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

    def _victim(self, requester: str) -> Node | None:
        if self._single is not None:
            return self._single.victim()
        # Furthest above its fair share goes first; on a tie the tenant asking for room pays.
        order = sorted(
            self._policies,
            key=lambda t: (self.usage_blocks.get(t, 0) / self.fair_share_blocks(t), t == requester),
            reverse=True,
        )
        for tenant in order:
            node = self._policies[tenant].victim()
            if node is not None:
                return node
        return None

    # --- matching ------------------------------------------------------------------------

    def match(
        self, hashes: Sequence[int], *, touch: bool = True, root: Node | None = None
    ) -> tuple[Node, int]:
        """The deepest node fully matched by a prefix of ``hashes`` and the matched block count.

        With ``touch`` the path counts as used (and a partly matched node is split so that
        each node keeps one access history); without it the tree is left exactly as it was.
        ``root`` starts the walk below an already matched node (``hashes`` then continue it).
        """
        raw = as_block_hashes(hashes).raw
        node = self.root if root is None else root
        p = 0
        n = len(raw)
        path: list[Node] = []
        while p < n:
            child = node.children.get(raw[p : p + 8])
            if child is None:
                break
            key = child.key
            kl = len(key)
            if raw[p : p + kl] != key:
                if not touch:
                    return node, p >> 3  # a partial node is no usable handle without a split
                kb = _common_blocks(key, raw, p)
                child = self._split(child, kb)
                kl = kb << 3
            p += kl
            node = child
            path.append(node)
        if touch:
            self._touch(path)
        return node, p >> 3

    def cached_prefix_blocks(self, hashes: Sequence[int]) -> int:
        """Blocks of the longest cached prefix of ``hashes``, a partly matched node's shared
        blocks included, leaving the tree as it was (``match`` without ``touch`` stops above
        such a node: it answers with a handle, this with a count)."""
        raw = as_block_hashes(hashes).raw
        node = self.root
        p = 0
        n = len(raw)
        while p < n:
            child = node.children.get(raw[p : p + 8])
            if child is None:
                break
            key = child.key
            if raw[p : p + len(key)] != key:
                return (p >> 3) + _common_blocks(key, raw, p)
            p += len(key)
            node = child
        return p >> 3

    def _touch(self, path: list[Node]) -> None:
        self.tick += 1
        tick = self.tick
        now = self.clock.now()
        self.touch_listener.touched(path, now)
        single = self._single
        for node in path:
            node.last_access = tick
            node.last_access_s = now
            node.hits += 1
            (single or self.policy_for(node)).on_access(node)

    def _split(self, node: Node, k: int) -> Node:
        """Splits ``node`` after its first ``k`` blocks and returns the new head node."""
        parent = node.parent
        assert parent is not None
        head = Node(parent, node.key[: k << 3], node.blocks[:k], node.depth, node.tenant)
        head.lock_ref = node.lock_ref
        head.pin_ref = node.pin_ref
        head.last_access = node.last_access
        head.last_access_s = node.last_access_s
        head.created_s = node.created_s
        head.hits = node.hits
        head.priority = node.priority
        parent.children[head.key[:8]] = head
        node.key = node.key[k << 3 :]
        del node.blocks[:k]
        node.depth += k
        node.parent = head
        head.children[node.key[:8]] = node
        self.policy_for(node).on_split(head, node)
        self.version += 1
        return head

    def block_ids(self, node: Node) -> list[int]:
        """Pool block ids from the root through ``node``, in prefix order."""
        runs: list[array[int]] = []
        while node.parent is not None:
            runs.append(node.blocks)
            node = node.parent
        out = array("i")
        for run in reversed(runs):
            out.extend(run)
        return out.tolist()

    def hashes(self, node: Node) -> BlockHashes:
        """The block hashes from the root through ``node``."""
        runs: list[bytes] = []
        while node.parent is not None:
            runs.append(node.key)
            node = node.parent
        return BlockHashes(b"".join(reversed(runs)))

    # --- insertion -----------------------------------------------------------------------

    def insert(
        self,
        hashes: Sequence[int],
        *,
        start: tuple[Node, int] | None = None,
        tenant: str = "",
        priority: int = 0,
    ) -> tuple[Node, int]:
        """Caches the blocks of ``hashes`` not cached yet; returns the deepest node and the
        number of new blocks. Evicts as needed; when locked blocks leave too little room, only
        the prefix that fits is inserted. ``start`` is a fresh ``match`` result to skip the walk.
        """
        seq = as_block_hashes(hashes)
        n = len(seq)
        if start is None:
            node, pos = self.match(seq)
        else:
            node, pos = start
            if pos < n and seq.raw[pos << 3 : (pos << 3) + 8] in node.children:
                # ``start`` matched a shorter list: walk on rather than store a block twice.
                node, more = self.match(seq[pos:], root=node)
                pos += more
        if pos >= n:
            return node, 0
        want = n - pos
        blocks = self.pool.try_allocate(want)
        locked = blocks is None
        if blocks is None:
            self.lock(node)  # the path we extend must survive the evictions below
            self.evict(want - self.pool.num_free, requester=tenant)
            blocks = self.pool.try_allocate(min(want, self.pool.num_free))
            assert blocks is not None
            if not blocks:
                self.unlock(node)
                return node, 0
        key = seq.raw[pos << 3 : (pos + len(blocks)) << 3]
        leaf = Node(node, key, blocks, pos, tenant)
        leaf.last_access = self.tick
        leaf.last_access_s = leaf.created_s = self.clock.now()
        leaf.priority = priority
        if node.parent is not None and not node.children:
            self.policy_for(node).on_unevictable(node)
        node.children[key[:8]] = leaf
        self.num_cached_blocks += len(blocks)
        self.usage_blocks[tenant] = self.usage_blocks.get(tenant, 0) + len(blocks)
        self.version += 1
        self.policy_for(leaf).on_insert(leaf)
        self.listener.stored(leaf, BlockHashes(key))
        if locked:
            self.unlock(node)
        return leaf, len(blocks)

    # --- locking -------------------------------------------------------------------------

    def lock(self, node: Node) -> None:
        """Protects ``node`` and its ancestors from eviction until ``unlock(node)``."""
        if node.parent is None:
            if node is not self.root:
                raise UsageError(
                    "lock of a handle whose blocks were evicted: take a fresh handle from "
                    "match() or access() and lock that"
                )
            return  # the root is always cached: nothing to hold
        node.handle_locks += 1
        while node.parent is not None:
            if node.lock_ref == 0:
                self.num_locked_blocks += len(node.key) >> 3
                if not node.children:
                    self.policy_for(node).on_unevictable(node)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        """Releases one ``lock(node)``. A handle with no lock of its own left (a second
        unlock, or one never locked) fails before any count moves; so does an evicted one
        (detached, not the root), which can only have been unlocked already."""
        if node.parent is None:
            if node is not self.root:
                raise UsageError(
                    "unlock of a handle whose blocks were evicted: it was unlocked already "
                    "(a double unlock)"
                )
            return
        if node.handle_locks <= 0:
            raise UsageError(
                "unlock without a matching lock: this handle was unlocked already "
                "(a double unlock) or never locked"
            )
        node.handle_locks -= 1
        while node.parent is not None:
            assert node.lock_ref > 0, "an ancestor holds fewer locks than its descendants"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.num_locked_blocks -= len(node.key) >> 3
                if not node.children:
                    self.policy_for(node).on_evictable(node)
            node = node.parent

    # --- eviction ------------------------------------------------------------------------

    @property
    def num_evictable_blocks(self) -> int:
        """Blocks ``evict`` can free now, O(1): every block of an unlocked node (an unlocked
        node has no locked descendant, so its whole subtree can go, leaves first)."""
        return self.num_cached_blocks - self.num_locked_blocks

    def evict(self, num_blocks: int, *, requester: str = "") -> int:
        """Frees up to ``num_blocks`` blocks from unlocked leaves; returns how many it freed.
        ``requester`` is the tenant that needs the room (it pays on fair-share ties)."""
        freed = 0
        while freed < num_blocks:
            node = self._victim(requester)
            if node is None:
                break
            freed += self._trim(node, min(num_blocks - freed, node.num_blocks))
        return freed

    def _trim(self, node: Node, k: int) -> int:
        key = node.key
        cut = len(key) - (k << 3)
        hashes = BlockHashes(key[cut:])
        blocks = node.blocks[-k:]
        first = key[:8]
        node.key = key[:cut]
        del node.blocks[-k:]
        self.pool.free(blocks)
        self.num_cached_blocks -= k
        self.num_evicted_total += k
        self.usage_blocks[node.tenant] -= k
        self.version += 1
        policy = self.policy_for(node)
        parent = node.parent
        assert parent is not None
        # Listeners see the node still attached: tree.hashes(node) + hashes is the full path.
        self.listener.removed(node, hashes)
        if not node.key:
            del parent.children[first]
            node.parent = None
        policy.on_evict(node, k, hashes)
        if node.parent is None and parent.parent is not None and parent.is_evictable:
            self.policy_for(parent).on_evictable(parent)
        return k

    def remove(self, hashes: Sequence[int]) -> int:
        """Drops the last block of ``hashes`` and every block cached below it (a copy known to
        be bad), as evictions; blocks in use stay. ``hashes`` is a path from the root, cached
        up to its last block (otherwise nothing happens). Recency is left as it was. Returns
        the blocks removed."""
        raw = as_block_hashes(hashes).raw
        target = len(raw) - 8  # byte offset of the block to drop
        if target < 0:
            return 0
        node, p = self.root, 0
        while True:
            child = node.children.get(raw[p : p + 8])
            if child is None:
                return 0
            kl = len(child.key)
            common = _common_blocks(child.key, raw, p) << 3
            if p + kl > target:  # the block lies in this child
                if common < target - p + 8:
                    return 0
                if target > p:
                    child = self._split(child, (target - p) >> 3).children[raw[target : target + 8]]
                break
            if common < kl:
                return 0
            node, p = child, p + kl
        subtree: list[Node] = []
        stack = [child]
        while stack:
            n = stack.pop()
            subtree.append(n)
            stack.extend(n.children.values())
        removed = 0
        for n in reversed(subtree):  # children before their parents
            if n.lock_ref == 0 and not n.children and n.parent is not None:
                self.policy_for(n).on_unevictable(n)  # out of the policy's queues first
                removed += self._trim(n, n.num_blocks)
        return removed

    def clear(self) -> None:
        """Drops every unlocked block."""
        self.evict(self.num_cached_blocks)
