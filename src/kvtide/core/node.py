"""A radix-tree node: one run of blocks that were always touched together."""

from __future__ import annotations

from array import array


class Node:
    """A compressed edge of the prefix tree holding blocks ``depth .. depth + num_blocks - 1``.

    ``key`` packs those blocks' hashes as little-endian uint64 bytes and ``blocks`` their pool
    ids, so a split, a trim or a comparison is one C-level slice or memcmp.

    Every block of a node shares one access history (the tree splits a node when a request
    touches only part of it), so a policy can rank nodes and evict a node's blocks from its tail.
    ``lock_ref`` counts users of this node or of any descendant; only an unlocked leaf is
    evictable. ``handle_locks`` counts the locks taken with this very node as the handle, so
    that a second unlock of a handle is caught even while a descendant's lock keeps
    ``lock_ref`` up. ``heap_seq`` belongs to the eviction policy (lazy-heap validity).
    """

    __slots__ = (
        "blocks",
        "children",
        "created_s",
        "depth",
        "handle_locks",
        "heap_seq",
        "hits",
        "key",
        "last_access",
        "last_access_s",
        "lock_ref",
        "parent",
        "pin_ref",
        "policy_data",
        "priority",
        "tenant",
    )

    def __init__(
        self,
        parent: Node | None,
        key: bytes,
        blocks: array[int],
        depth: int,
        tenant: str = "",
    ) -> None:
        self.parent = parent
        self.key = key
        self.blocks = blocks
        self.depth = depth
        self.children: dict[bytes, Node] = {}  # keyed by the child's first hash (8 bytes)
        self.lock_ref = 0
        self.handle_locks = 0
        self.pin_ref = 0
        self.last_access = 0
        self.last_access_s = 0.0
        self.created_s = 0.0
        self.hits = 0
        self.priority = 0
        self.tenant = tenant
        self.heap_seq = -1
        self.policy_data: object = None

    @property
    def num_blocks(self) -> int:
        return len(self.key) >> 3

    @property
    def end_depth(self) -> int:
        """Number of blocks from the root through the end of this node."""
        return self.depth + (len(self.key) >> 3)

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def is_evictable(self) -> bool:
        return not self.children and self.lock_ref == 0 and self.parent is not None

    def __repr__(self) -> str:
        return f"Node(depth={self.depth}, blocks={self.num_blocks}, lock={self.lock_ref})"
