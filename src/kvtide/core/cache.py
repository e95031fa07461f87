"""KVCache: the facade over pool + radix tree + eviction policy, with pins, quotas and counters.

Everything above the core (tiers, engines, the simulator, the router's index) talks to this class.
A request's typical use: ``access(hashes, prompt_tokens, lock=True)``, run, then ``unlock``.
"""

from __future__ import annotations

import heapq
import numbers
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvtide.clock import Clock, require_clock
from kvtide.core.block_pool import BlockPool
from kvtide.core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvtide.core.eviction import PolicyContext, make_policy
from kvtide.core.hashing import BlockHashes, as_block_hashes
from kvtide.core.node import Node
from kvtide.core.radix_tree import RadixTree, TouchListener, TreeListener
from kvtide.errors import ConfigError, UsageError
from kvtide.types import BlockHash, Tier


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """How one cache is sized and run.

    ``ghost_blocks`` bounds the memory of evicted hashes used to tell an *evicted* miss (a
    regretted eviction) from a *cold* one; 0 turns miss classification off (the fastest path).
    ``tenant_quota_blocks`` turns on per-tenant fair sharing; pins are refused beyond
    ``pin_budget_blocks`` overall and beyond a tenant's ``tenant_pin_budget_blocks``.
    """

    capacity_blocks: int
    block_tokens: int = 16
    policy: str = "tide"
    policy_options: Mapping[str, object] = field(default_factory=dict)
    record_events: bool = False
    ghost_blocks: int | None = None
    tenant_quota_blocks: Mapping[str, int] | None = None
    pin_budget_blocks: int | None = None
    tenant_pin_budget_blocks: Mapping[str, int] = field(default_factory=dict)
    namespace: str | None = None
    tier: Tier = Tier.DEVICE

    def __post_init__(self) -> None:
        for name in ("capacity_blocks", "block_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ConfigError(f"{name} must be an integer, got {value!r}")
        if self.capacity_blocks <= 0:
            raise ConfigError(f"capacity must be positive, got {self.capacity_blocks} blocks")
        if self.block_tokens <= 0:
            raise ConfigError(f"block size must be positive, got {self.block_tokens} tokens")
        if self.ghost_blocks is not None and self.ghost_blocks < 0:
            raise ConfigError("ghost_blocks must be >= 0")
        quotas = self.tenant_quota_blocks or {}
        if any(q <= 0 for q in quotas.values()):
            raise ConfigError("tenant quotas must be positive")
        if sum(quotas.values()) > self.capacity_blocks:
            raise ConfigError("tenant quotas add up to more than the capacity")

    @property
    def effective_ghost_blocks(self) -> int:
        return 4 * self.capacity_blocks if self.ghost_blocks is None else self.ghost_blocks

    @property
    def effective_pin_budget_blocks(self) -> int:
        # Half the cache by default: pins beyond that would starve everything else.
        if self.pin_budget_blocks is None:
            return self.capacity_blocks // 2
        return self.pin_budget_blocks


@dataclass(frozen=True, slots=True)
class Match:
    """The cached prefix of a request: ``num_blocks`` blocks ending at ``handle``."""

    num_blocks: int
    handle: Node
    tree: RadixTree
    version: int

    @property
    def block_ids(self) -> list[int]:
        return self.tree.block_ids(self.handle)


@dataclass(frozen=True, slots=True)
class Access:
    """One request's use of the cache: what hit, what was newly stored, where it ends.

    ``refused_blocks`` are full blocks ``access(insert=True)`` was asked to store but could
    not, because locked blocks left no room: the prompt is cached (and locked) only up to
    ``cached_blocks``. ``is_locked`` says whether the caller holds a lock it must ``unlock``;
    an ``access(lock=True)`` that found and stored nothing holds none.
    """

    hit_blocks: int
    new_blocks: int
    handle: Node
    tree: RadixTree
    refused_blocks: int = 0
    is_locked: bool = False

    @property
    def cached_blocks(self) -> int:
        return self.handle.end_depth

    @property
    def block_ids(self) -> list[int]:
        return self.tree.block_ids(self.handle)


@dataclass(frozen=True, slots=True)
class CacheStats:
    lookups: int
    prompt_tokens: int
    hit_tokens: int
    full_blocks: int
    hit_blocks: int
    miss_tokens_cold: int
    miss_tokens_evicted: int
    miss_tokens_other_namespace: int
    miss_tokens_partial: int
    inserted_blocks: int
    evicted_blocks: int
    allocations_total: int
    frees_total: int
    cached_blocks: int
    capacity_blocks: int
    pinned_blocks: int
    elapsed_s: float

    @property
    def hit_ratio(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def block_hit_ratio(self) -> float:
        return self.hit_blocks / self.full_blocks if self.full_blocks else 0.0

    @property
    def evictions_per_s(self) -> float:
        return self.evicted_blocks / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def allocations_per_s(self) -> float:
        return self.allocations_total / self.elapsed_s if self.elapsed_s > 0 else 0.0


class _Recorder:
    """Tree listener: events for subscribers, ghost hashes for miss classification."""

    __slots__ = (
        "block_tokens",
        "events",
        "ghost",
        "ghost_limit",
        "ghost_old",
        "namespace",
        "observers",
        "tier",
    )

    def __init__(self, config: CacheConfig) -> None:
        self.events: list[KVEvent] | None = [] if config.record_events else None
        # Two generations of evicted hashes, each up to half the limit: set.update and set
        # intersection run in C, where an ordered dict would cost a Python step per block.
        self.ghost: set[BlockHash] = set()
        self.ghost_old: set[BlockHash] = set()
        self.ghost_limit = config.effective_ghost_blocks
        self.block_tokens = config.block_tokens
        self.namespace = config.namespace
        self.tier = config.tier
        self.observers: list[TreeListener] = []

    def stored(self, node: Node, hashes: BlockHashes) -> None:
        for observer in self.observers:
            observer.stored(node, hashes)
        if self.events is not None:
            parent = node.parent
            parent_hash = None
            if parent is not None and parent.key:
                parent_hash = BlockHashes(parent.key[-8:])[0]
            self.events.append(
                BlockStored(
                    tuple(hashes.tolist()),
                    parent_hash,
                    None,
                    self.block_tokens,
                    self.tier,
                    self.namespace,
                )
            )

    def removed(self, node: Node, hashes: BlockHashes) -> None:
        for observer in self.observers:
            observer.removed(node, hashes)
        if self.events is not None:
            self.events.append(BlockRemoved(tuple(hashes.tolist()), self.tier))
        if self.ghost_limit:
            self.ghost.update(hashes.tolist())
            if 2 * len(self.ghost) >= self.ghost_limit:
                self.ghost_old = self.ghost
                self.ghost = set()

    def evicted_among(self, hashes: list[BlockHash]) -> set[BlockHash]:
        """The hashes in ``hashes`` that were evicted recently (within the ghost's memory)."""
        found = self.ghost.intersection(hashes)
        found.update(self.ghost_old.intersection(hashes))
        return found


def check_prompt_tokens(num_blocks: int, block_tokens: int, prompt_tokens: int) -> None:
    """A request's ``num_blocks`` full-block hashes need at least that many blocks of tokens
    (a negative or NaN count fails too): else hit ratios would pass 1."""
    if not num_blocks * block_tokens <= prompt_tokens:
        raise UsageError(
            f"prompt_tokens={prompt_tokens!r} is fewer than the {num_blocks} full blocks of "
            f"{block_tokens} tokens hashed for it (at least {num_blocks * block_tokens})"
        )


@dataclass(order=True, slots=True)
class _Pin:
    expires_s: float
    seq: int
    handle: Node = field(compare=False)


class KVCache:
    """One cache of blocks. ``clock`` is required: ``WallClock()`` in a server,
    ``ManualClock()`` in a simulation or a test (it dates pins, TTLs and recency)."""

    def __init__(self, config: CacheConfig, clock: Clock) -> None:
        self.config = config
        self.clock: Clock = require_clock(clock, "KVCache")
        self.pool = BlockPool(config.capacity_blocks)
        ctx = PolicyContext(config.capacity_blocks, config.block_tokens, self.clock)
        make_policy(config.policy, ctx, config.policy_options)  # fail fast on a bad name
        self._recorder = _Recorder(config)
        self.tree = RadixTree(
            self.pool,
            lambda: make_policy(config.policy, ctx, config.policy_options),
            self.clock,
            tenant_quota_blocks=config.tenant_quota_blocks,
            listener=self._recorder,
        )
        self._start_s = self.clock.now()
        self._shadow_owner: OrderedDict[BlockHash, str] = OrderedDict()
        self._pins: list[_Pin] = []
        self._pin_seq = 0
        self._pinned_by_tenant: dict[str, int] = {}
        self._lookups = 0
        self._prompt_tokens = 0
        self._hit_tokens = 0
        self._full_blocks = 0
        self._hit_blocks = 0
        self._miss_cold = 0
        self._miss_evicted = 0
        self._miss_other = 0
        self._miss_partial = 0
        self._inserted = 0
        self._tenant_tokens: dict[str, list[int]] = {}  # tenant -> [prompt, hit] tokens

    # --- the block-level API -------------------------------------------------------------

    @property
    def capacity_blocks(self) -> int:
        """Blocks in service: the configured capacity less any ``shrink``."""
        return self.pool.num_usable

    @property
    def num_cached_blocks(self) -> int:
        return self.tree.num_cached_blocks

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks no request or pin holds: what ``evict`` can free (O(1)). A request
        fits if it needs at most ``pool.num_free + num_evictable_blocks`` blocks once its own
        cached prefix is locked."""
        return self.tree.num_evictable_blocks

    def match(self, hashes: Sequence[BlockHash], *, touch: bool = True) -> Match:
        node, n = self.tree.match(hashes, touch=touch)
        return Match(n, node, self.tree, self.tree.version)

    def insert(
        self,
        hashes: Sequence[BlockHash],
        *,
        match: Match | None = None,
        tenant: str = "",
        priority: int = 0,
    ) -> Access:
        start = None
        if match is not None and match.version == self.tree.version:
            start = (match.handle, match.num_blocks)
        hit = match.num_blocks if match is not None else 0
        node, new = self.tree.insert(hashes, start=start, tenant=tenant, priority=priority)
        self._inserted += new
        return Access(hit, new, node, self.tree)

    def lock(self, handle: Node) -> None:
        self.tree.lock(handle)

    def unlock(self, handle: Node) -> None:
        self.tree.unlock(handle)

    def evict(self, num_blocks: int) -> int:
        return self.tree.evict(num_blocks)

    def shrink(self, num_blocks: int) -> int:
        """Takes up to ``num_blocks`` blocks out of service for good, evicting unlocked cached
        blocks to free them; returns how many went (fewer while locked blocks stand in the
        way). Models an engine given less KV memory."""
        short = num_blocks - self.pool.num_free
        if short > 0:
            self.tree.evict(short)
        return self.pool.withdraw(num_blocks)

    def discard(self, hashes: Sequence[BlockHash]) -> int:
        """Drops the last block of the path ``hashes`` and every block cached below it (a
        stored copy found corrupt); blocks in use stay. Returns the blocks removed."""
        return self.tree.remove(hashes)

    def clear(self) -> None:
        self.tree.clear()
        if self._recorder.events is not None:
            self._recorder.events.append(AllBlocksCleared())

    def add_observer(self, observer: TreeListener) -> None:
        """Calls ``observer.stored`` / ``observer.removed`` on every store and removal
        (synchronously, inside the cache operation: keep them cheap)."""
        self._recorder.observers.append(observer)

    def set_touch_listener(self, listener: TouchListener) -> None:
        """Calls ``listener.touched(path, now_s)`` on every touched path (reuse gaps)."""
        self.tree.touch_listener = listener

    def take_events(self) -> list[KVEvent]:
        """Drains the events recorded since the last call (``record_events`` must be on)."""
        events = self._recorder.events
        if events is None:
            return []
        self._recorder.events = []
        return events

    # --- the request-level API -----------------------------------------------------------

    def access(
        self,
        hashes: Sequence[BlockHash],
        prompt_tokens: int,
        *,
        tenant: str = "",
        priority: int = 0,
        insert: bool = True,
        lock: bool = False,
        shadow_hashes: Sequence[BlockHash] | None = None,
    ) -> Access:
        """Matches a request's full-block hashes, counts hits and classified misses, and
        (with ``insert``) stores the missing blocks. With ``lock`` the caller owns a lock on
        the returned handle and must ``unlock`` it. ``shadow_hashes`` are the same blocks
        hashed without the tenant salt: they let a miss be blamed on another namespace.
        """
        hashes = as_block_hashes(hashes)
        check_prompt_tokens(len(hashes), self.config.block_tokens, prompt_tokens)
        if self._pins:
            self.expire_pins()
        node, hit = self.tree.match(hashes)
        self.count_lookup(hashes, hit, prompt_tokens, tenant=tenant, shadow_hashes=shadow_hashes)
        new = 0
        if insert and hit < len(hashes):
            node, new = self.tree.insert(
                hashes, start=(node, hit), tenant=tenant, priority=priority
            )
            self._inserted += new
            if shadow_hashes is not None and new:
                self._remember_owner(shadow_hashes[hit : hit + new], tenant)
        refused = len(hashes) - hit - new if insert else 0
        if lock:
            self.tree.lock(node)
        return Access(hit, new, node, self.tree, refused, lock and node.parent is not None)

    def count_lookup(
        self,
        hashes: Sequence[BlockHash],
        hit: int,
        prompt_tokens: int,
        *,
        tenant: str = "",
        shadow_hashes: Sequence[BlockHash] | None = None,
    ) -> None:
        """Counts one request's lookup whose match found ``hit`` of ``hashes``' full blocks,
        and classifies the missed ones. ``access`` calls it; an engine that matches and
        inserts block by block calls it once per request, before or after its insert."""
        bt = self.config.block_tokens
        n = len(hashes)
        self._lookups += 1
        self._prompt_tokens += prompt_tokens
        self._hit_tokens += hit * bt
        by_tenant = self._tenant_tokens.get(tenant)
        if by_tenant is None:
            by_tenant = self._tenant_tokens[tenant] = [0, 0]
        by_tenant[0] += prompt_tokens
        by_tenant[1] += hit * bt
        self._full_blocks += n
        self._hit_blocks += hit
        self._miss_partial += max(prompt_tokens - n * bt, 0)
        if hit == n:
            return
        recorder = self._recorder
        if not recorder.ghost_limit and shadow_hashes is None:
            self._miss_cold += (n - hit) * bt
            return
        missed = as_block_hashes(hashes)[hit:].tolist()
        evicted = recorder.evicted_among(missed) if recorder.ghost_limit else set()
        self._miss_evicted += len(evicted) * bt
        if shadow_hashes is None:
            self._miss_cold += (len(missed) - len(evicted)) * bt
            return
        owners = self._shadow_owner
        shadow = list(shadow_hashes[hit:])
        for i, h in enumerate(missed):
            if h in evicted:
                continue
            if owners.get(shadow[i], tenant) != tenant:
                self._miss_other += bt
            else:
                self._miss_cold += bt

    def _remember_owner(self, shadow: Sequence[BlockHash], tenant: str) -> None:
        owners = self._shadow_owner
        for h in shadow:
            owners[h] = tenant
            owners.move_to_end(h)
        limit = max(self._recorder.ghost_limit, self.config.capacity_blocks)
        while len(owners) > limit:
            owners.popitem(last=False)

    # --- pins ----------------------------------------------------------------------------

    def pin(self, handle: Node, ttl_s: float) -> bool:
        """Keeps the path to ``handle`` cached for ``ttl_s`` seconds; ``False`` if that would
        exceed the global pin budget or the budget of a tenant owning blocks on the path
        (nothing is pinned then). A block is charged to the tenant that stored it."""
        if not ttl_s > 0:  # NaN too: a NaN expiry would never come
            raise ConfigError(f"pin TTL must be positive, got {ttl_s}")
        self.expire_pins()
        path = self._path(handle)
        new_by_tenant: dict[str, int] = {}
        for node in path:
            if node.pin_ref == 0:
                new_by_tenant[node.tenant] = new_by_tenant.get(node.tenant, 0) + node.num_blocks
        budget = self.config.effective_pin_budget_blocks
        if self.pinned_blocks + sum(new_by_tenant.values()) > budget:
            return False
        for tenant, blocks in new_by_tenant.items():
            tenant_budget = self.config.tenant_pin_budget_blocks.get(tenant)
            used = self._pinned_by_tenant.get(tenant, 0)
            if tenant_budget is not None and used + blocks > tenant_budget:
                return False
        for tenant, blocks in new_by_tenant.items():
            self._pinned_by_tenant[tenant] = self._pinned_by_tenant.get(tenant, 0) + blocks
        for node in path:
            node.pin_ref += 1
        self.tree.lock(handle)
        self._pin_seq += 1
        heapq.heappush(self._pins, _Pin(self.clock.now() + ttl_s, self._pin_seq, handle))
        return True

    @staticmethod
    def _path(handle: Node) -> list[Node]:
        path = []
        node: Node | None = handle
        while node is not None and node.parent is not None:
            path.append(node)
            node = node.parent
        return path

    def expire_pins(self) -> int:
        """Releases every pin whose TTL has passed; returns how many."""
        now = self.clock.now()
        released = 0
        while self._pins and self._pins[0].expires_s <= now:
            pin = heapq.heappop(self._pins)
            for node in self._path(pin.handle):
                node.pin_ref -= 1
                if node.pin_ref == 0:
                    self._pinned_by_tenant[node.tenant] -= node.num_blocks
            self.tree.unlock(pin.handle)
            released += 1
        return released

    @property
    def pinned_blocks(self) -> int:
        return sum(self._pinned_by_tenant.values())

    def tenant_tokens(self) -> dict[str, tuple[int, int]]:
        """Per tenant, (prompt tokens, hit tokens) counted by ``count_lookup`` so far."""
        return {t: (c[0], c[1]) for t, c in self._tenant_tokens.items()}

    # --- counters ------------------------------------------------------------------------

    def stats(self) -> CacheStats:
        return CacheStats(
            lookups=self._lookups,
            prompt_tokens=self._prompt_tokens,
            hit_tokens=self._hit_tokens,
            full_blocks=self._full_blocks,
            hit_blocks=self._hit_blocks,
            miss_tokens_cold=self._miss_cold,
            miss_tokens_evicted=self._miss_evicted,
            miss_tokens_other_namespace=self._miss_other,
            miss_tokens_partial=self._miss_partial,
            inserted_blocks=self._inserted,
            evicted_blocks=self.tree.num_evicted_total,
            allocations_total=self.pool.num_allocations_total,
            frees_total=self.pool.num_frees_total,
            cached_blocks=self.tree.num_cached_blocks,
            capacity_blocks=self.capacity_blocks,
            pinned_blocks=self.pinned_blocks,
            elapsed_s=self.clock.now() - self._start_s,
        )
