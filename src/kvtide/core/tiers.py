"""Device -> host -> disk: one ``KVCache`` per tier over the same chained block hashes.

Blocks evicted from a tier are written lower (write-back) or written when stored
(write-through), through per-tier admission filters; a hit in a lower tier is reloaded,
recomputed or split as the cost model decides, over links that concurrent transfers share.

Tier semantics (the choice and why):

* **Each tier is prefix-closed.** A tier holds a block only together with all its ancestors
  (each tier is a radix tree). Writing a block down therefore also writes those of its
  ancestors the lower tier lacks; they are usually still on the device, and would be written
  when the device evicts them anyway, so this moves writes earlier rather than adding them.
  Because every tier is closed, the cached prefix of a request is simply the longest of the
  tiers' own matches, and each block of it is served by the fastest tier holding it.
* **Tiers are non-exclusive (copy, not move).** A reload copies a block up and leaves the lower
  copy in place, so a block may sit in several tiers; evicting a block that the lower tier
  still holds costs no write. Exclusive tiers (move up on hit) would add up to one device's
  worth of distinct capacity but re-write every promoted block on its next eviction; writes
  are what the admission filter exists to save, so kvtide keeps copies (as vLLM's offloading
  connector, which skips stores of blocks already offloaded).
* **Write-back by default**, as vLLM's offloading connector: a block goes down when its tier
  evicts it, if the admission filter admits it (else it is dropped). **Write-through** (SGLang
  HiCache's default) writes a block down as soon as it is stored, if admitted, and still writes
  back on eviction a block the lower tier has since dropped; so the lower tier is a superset
  whenever the filter admits everything, and never loses a block that write-back would keep.
  With a filter, a device hit that the filter now admits is written down at once.
* **Admission per tier, with write-around.** Each lower tier names the filter guarding writes
  into it. A block the host refuses is offered to the disk (so "seen twice" on the host keeps
  one-off blocks out of host memory while the disk still catches their first reuse); a block
  no tier takes is dropped. Dynamo's KVBM sends a block to disk after two hits: that is
  ``admission="seen-twice"`` on the disk tier.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvtide.clock import Clock, require_clock
from kvtide.core.admission import AdmissionFilter, make_admission
from kvtide.core.cache import CacheConfig, CacheStats, KVCache
from kvtide.core.events import KVEvent
from kvtide.core.hashing import BlockHashes, as_block_hashes
from kvtide.core.node import Node
from kvtide.core.radix_tree import RadixTree
from kvtide.costs.link import Link
from kvtide.errors import ConfigError
from kvtide.types import BlockHash, Tier

LOWER_TIERS = (Tier.HOST, Tier.DISK)


class WriteMode(enum.StrEnum):
    WRITE_BACK = "write-back"
    WRITE_THROUGH = "write-through"


# --- the cost model as the tiers use it ----------------------------------------------------


class OnboardPlan(Protocol):
    """What a cost model decides for a prefix hit in a lower tier (``OnboardDecision``)."""

    @property
    def action(self) -> str: ...  # "reload", "recompute" or "split"

    @property
    def reload_tokens(self) -> int: ...  # tokens taken from the tier; the rest is computed

    @property
    def time_s(self) -> float: ...  # the chosen plan's time

    @property
    def recompute_s(self) -> float: ...  # the time of recomputing everything instead


class OnboardCost(Protocol):
    """The part of ``kvtide.costs.cost_model.CostModel`` the tiers call."""

    def kv_bytes(self, tokens: int) -> int: ...

    def prefill_time(self, new_tokens: int, cached_tokens: int = 0) -> float: ...

    def link_bytes_per_s(
        self, tier: Tier, link_load: float = 0.0, *, to_device: bool = True
    ) -> float: ...

    def decide_onboard(
        self,
        cached_tokens_in_tier: int,
        tier: Tier,
        new_tokens: int = 0,
        link_load: float = 0.0,
        *,
        block_tokens: int = 1,
        with_break_even: bool = True,
    ) -> OnboardPlan: ...


@dataclass(frozen=True, slots=True)
class _FreePlan:
    action: str
    reload_tokens: int
    time_s: float = 0.0
    recompute_s: float = 0.0


class FreeReload:
    """No cost model: every lower-tier hit is reloaded, and nothing takes time or saves any."""

    def kv_bytes(self, tokens: int) -> int:
        return 0

    def prefill_time(self, new_tokens: int, cached_tokens: int = 0) -> float:
        return 0.0

    def link_bytes_per_s(
        self, tier: Tier, link_load: float = 0.0, *, to_device: bool = True
    ) -> float:
        return math.inf

    def decide_onboard(
        self,
        cached_tokens_in_tier: int,
        tier: Tier,
        new_tokens: int = 0,
        link_load: float = 0.0,
        *,
        block_tokens: int = 1,
        with_break_even: bool = True,
    ) -> OnboardPlan:
        return _FreePlan("reload", cached_tokens_in_tier)


# --- configuration ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TierSpec:
    """One tier: its capacity in blocks, its eviction policy and the admission filter guarding
    writes into it (both by registered name; the device takes no writes, so no filter)."""

    capacity_blocks: int
    policy: str = "lru"
    policy_options: Mapping[str, object] = field(default_factory=dict)
    admission: str = "none"
    admission_options: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TieredCacheConfig:
    """Tiers absent (``None``) are skipped: a disk without a host is allowed."""

    device: TierSpec
    host: TierSpec | None = None
    disk: TierSpec | None = None
    block_tokens: int = 16
    write_mode: WriteMode = WriteMode.WRITE_BACK
    record_events: bool = False
    record_moves: bool = False
    namespace: str | None = None
    ghost_blocks: int | None = None
    """Device miss classification (see ``CacheConfig``); lower tiers keep no ghosts."""

    def spec(self, tier: Tier) -> TierSpec | None:
        return {Tier.DEVICE: self.device, Tier.HOST: self.host, Tier.DISK: self.disk}[tier]

    @property
    def lower_capacity_blocks(self) -> int:
        return sum(s.capacity_blocks for s in (self.host, self.disk) if s is not None)


# --- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TierMove:
    """Blocks copied between tiers, in prefix order: what a tensor mover must carry out."""

    hashes: tuple[BlockHash, ...]
    src: Tier
    dst: Tier


Mover = Callable[[TierMove], None]
"""Carries out one ``TierMove`` (see ``TieredCache.add_mover``)."""


@dataclass(frozen=True, slots=True)
class TieredAccess:
    """One request's lookup across tiers.

    The cached prefix is ``hit_blocks`` long: the first ``device_blocks`` on the device, then
    ``host_blocks`` found in host memory, then ``disk_blocks`` on disk (each block counted once,
    in the fastest tier holding it). Of the lower-tier blocks the plan reloads
    ``reload_blocks[tier]``; the rest are recomputed. ``onboard_s`` is the cost model's time
    until the prompt's KV is resident and prefilled; ``prefill_s_saved`` what the hits save.
    ``handle`` is the device node to ``unlock`` when the access was locked.
    """

    device_blocks: int
    host_blocks: int
    disk_blocks: int
    reload_blocks: Mapping[Tier, int]
    new_blocks: int
    onboard_s: float
    prefill_s_saved: float
    handle: Node
    tree: RadixTree

    @property
    def hit_blocks(self) -> int:
        return self.device_blocks + self.host_blocks + self.disk_blocks

    @property
    def usable_blocks(self) -> int:
        """Blocks the request does not compute: device hits plus reloaded blocks."""
        return self.device_blocks + sum(self.reload_blocks.values())

    @property
    def cached_blocks(self) -> int:
        return self.handle.end_depth

    @property
    def block_ids(self) -> list[int]:
        """Device pool ids of the request's cached path, in prefix order."""
        return self.tree.block_ids(self.handle)


@dataclass(frozen=True, slots=True)
class TierStats:
    """Counters of one tier. ``hit_tokens`` are the tokens found in this tier (the fastest
    holding them); ``reloaded_tokens`` those of them the plans reloaded (all, on the device).
    ``written_blocks`` counts blocks written into this tier from above (0 for the device);
    ``dropped_blocks`` blocks it evicted that went nowhere lower."""

    tier: Tier
    capacity_blocks: int
    cached_blocks: int
    hit_tokens: int
    reloaded_tokens: int
    written_blocks: int
    evicted_blocks: int
    dropped_blocks: int
    prefetched_blocks: int
    prefill_s_saved: float


@dataclass(frozen=True, slots=True)
class TieredStats:
    lookups: int
    prompt_tokens: int
    tiers: Mapping[Tier, TierStats]
    device: CacheStats

    @property
    def hit_tokens(self) -> int:
        return sum(t.hit_tokens for t in self.tiers.values())

    @property
    def hit_ratio(self) -> float:
        """Tokens found in any tier over prompt tokens (recomputed lower-tier hits included)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def reloaded_ratio(self) -> float:
        """Tokens the plans did not compute (device hits and reloads) over prompt tokens."""
        used = sum(t.reloaded_tokens for t in self.tiers.values())
        return used / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def hit_ratio_by_tier(self) -> dict[str, float]:
        """``{"device": .., "host": .., "disk": ..}``; absent tiers report 0."""
        total = self.prompt_tokens or 1
        out = {tier.name.lower(): 0.0 for tier in Tier}
        for tier, stats in self.tiers.items():
            out[tier.name.lower()] = stats.hit_tokens / total
        return out

    @property
    def prefill_s_saved(self) -> float:
        return sum(t.prefill_s_saved for t in self.tiers.values())

    def written_blocks(self, tier: Tier) -> int:
        stats = self.tiers.get(tier)
        return stats.written_blocks if stats is not None else 0


@dataclass(slots=True)
class _Counters:
    hit_tokens: int = 0
    reloaded_tokens: int = 0
    written_blocks: int = 0
    dropped_blocks: int = 0
    prefetched_blocks: int = 0
    prefill_s_saved: float = 0.0


# --- the cache -------------------------------------------------------------------------------


class _WriteDown:
    """Observer of one tier: writes its evicted (and, write-through, stored) blocks lower."""

    __slots__ = ("owner", "src", "write_through")

    def __init__(self, owner: TieredCache, src: Tier, write_through: bool) -> None:
        self.owner = owner
        self.src = src
        self.write_through = write_through

    def stored(self, node: Node, hashes: BlockHashes) -> None:
        if self.write_through:
            # The new leaf is attached and holds exactly ``hashes``: its path is the full prefix.
            tree = self.owner.caches[self.src].tree
            self.owner.write_down(self.src, tree.hashes(node), len(hashes), on_evict=False)

    def removed(self, node: Node, hashes: BlockHashes) -> None:
        # Called while the node is attached and already trimmed: path + hashes is the prefix.
        tree = self.owner.caches[self.src].tree
        self.owner.write_down(self.src, tree.hashes(node) + hashes, len(hashes), on_evict=True)


class _Drop:
    """Observer of the lowest tier: its evictions go nowhere."""

    __slots__ = ("counters",)

    def __init__(self, counters: _Counters) -> None:
        self.counters = counters

    def stored(self, node: Node, hashes: BlockHashes) -> None:
        pass

    def removed(self, node: Node, hashes: BlockHashes) -> None:
        self.counters.dropped_blocks += len(hashes)


class TieredCache:
    """Device, host and disk ``KVCache``s behind one request-level ``access``.

    ``access`` counts each block of a request's cached prefix once, in the fastest tier holding
    it, asks the cost model whether to reload or recompute the lower-tier part, and stores the
    whole prompt on the device (reloaded and computed blocks alike); evictions cascade down
    through the admission filter. ``prefetch`` copies a prefix up ahead of its request.
    Transfers of reloaded bytes go onto ``links[tier]``, whose load feeds the next decisions.
    ``clock`` is required, as for ``KVCache``: every tier and link runs on it.
    """

    def __init__(
        self,
        config: TieredCacheConfig,
        clock: Clock,
        cost: OnboardCost | None = None,
    ) -> None:
        self.config = config
        self.clock: Clock = require_clock(clock, "TieredCache")
        self.cost: OnboardCost = cost or FreeReload()
        self.block_tokens = config.block_tokens
        self.caches: dict[Tier, KVCache] = {}
        for tier in Tier:
            spec = config.spec(tier)
            if spec is None:
                if tier is Tier.DEVICE:
                    raise ConfigError("a tiered cache needs a device tier")
                continue
            self.caches[tier] = KVCache(
                CacheConfig(
                    capacity_blocks=spec.capacity_blocks,
                    block_tokens=config.block_tokens,
                    policy=spec.policy,
                    policy_options=spec.policy_options,
                    record_events=config.record_events,
                    ghost_blocks=config.ghost_blocks if tier is Tier.DEVICE else 0,
                    namespace=config.namespace,
                    tier=tier,
                ),
                self.clock,
            )
        self.device = self.caches[Tier.DEVICE]
        self.lower: list[tuple[Tier, KVCache]] = [
            (t, c) for t, c in self.caches.items() if t is not Tier.DEVICE
        ]
        below = dict(itertools.pairwise(self.caches))
        if config.device.admission != "none":
            raise ConfigError("the device tier takes no writes from above: no admission filter")
        # One filter per distinct (name, options), shared by the tiers that name it, so a
        # request is counted once per filter; each is sized to all lower tiers together.
        self.filters: dict[Tier, AdmissionFilter] = {}
        shared: dict[str, AdmissionFilter] = {}
        for tier, _ in self.lower:
            spec = config.spec(tier)
            assert spec is not None
            key = f"{spec.admission}{sorted(spec.admission_options.items())!r}"
            if key not in shared:
                shared[key] = make_admission(
                    spec.admission, config.lower_capacity_blocks, spec.admission_options
                )
            self.filters[tier] = shared[key]
        self._recorders = list(shared.values())
        self._lower_than = {tier: [t for t, _ in self.lower if t > tier] for tier in self.caches}
        write_through = config.write_mode is WriteMode.WRITE_THROUGH
        self._write_hits = write_through and Tier.DEVICE in below
        for tier in below:
            self.caches[tier].add_observer(_WriteDown(self, tier, write_through))
        self._counters = {tier: _Counters() for tier in self.caches}
        bottom = list(self.caches)[-1]
        self.caches[bottom].add_observer(_Drop(self._counters[bottom]))
        self.links: dict[Tier, Link] = {}
        for tier, _ in self.lower:
            rate = self.cost.link_bytes_per_s(tier)
            if math.isfinite(rate):
                self.links[tier] = Link(rate, self.clock, name=f"{tier.name.lower()}->device")
        self._moves: list[TierMove] = []
        self._movers: list[Mover] = []
        self._moving = config.record_moves
        self._lookups = 0
        self._prompt_tokens = 0

    # --- request level -------------------------------------------------------------------

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
    ) -> TieredAccess:
        """Looks a request up across tiers, decides its onboarding and (with ``insert``)
        stores its whole prompt on the device. With ``lock`` the caller must ``unlock``.
        ``shadow_hashes`` classify device misses as in ``KVCache.access``.

        Lower tiers are decided fastest first, each plan treating everything after its own
        part as computed; a tier's part is used only if everything before it was reloaded
        (a split stops the prefix). A split reloads whole blocks.
        """
        hashes = as_block_hashes(hashes)
        n, bt = len(hashes), self.block_tokens
        if prompt_tokens < n * bt:
            raise ValueError(f"{n} full blocks need at least {n * bt} prompt tokens")
        self._lookups += 1
        self._prompt_tokens += prompt_tokens
        for admission in self._recorders:
            admission.record(hashes)
        # Lower tiers are looked up before the device stores the prompt, since its evictions
        # write into them; a peek (no touch, may stop short) skips them on a full device hit.
        lower_ends: dict[Tier, int] = {}
        if self.lower and self.device.match(hashes, touch=False).num_blocks < n:
            end = 0
            for tier, cache in self.lower:
                lower_ends[tier] = m = cache.match(hashes).num_blocks
                end = max(end, m)
                if end >= n:
                    break
        dev = self.device.access(
            hashes,
            prompt_tokens,
            tenant=tenant,
            priority=priority,
            insert=insert,
            lock=lock,
            shadow_hashes=shadow_hashes,
        )
        d = dev.hit_blocks
        found = {tier: 0 for tier in LOWER_TIERS}
        end = d
        for tier, m in lower_ends.items():
            if m > end:
                found[tier] = m - end
                end = m
        cost = self.cost
        counters = self._counters
        counters[Tier.DEVICE].hit_tokens += d * bt
        counters[Tier.DEVICE].reloaded_tokens += d * bt
        saved = 0.0
        if d:
            saved = cost.prefill_time(prompt_tokens, 0) - cost.prefill_time(
                prompt_tokens - d * bt, d * bt
            )
            counters[Tier.DEVICE].prefill_s_saved += saved
        onboard_s = -1.0  # the longest lower-tier plan (host and disk links work in parallel)
        reload = {tier: 0 for tier in LOWER_TIERS}
        pos = usable = d
        for tier in LOWER_TIERS:
            k = found[tier]
            if not k:
                continue
            c = counters[tier]
            c.hit_tokens += k * bt
            if usable == pos:  # a lower tier continues the prefix only after full reloads
                plan = cost.decide_onboard(
                    k * bt,
                    tier,
                    prompt_tokens - (pos + k) * bt,
                    self._load(tier),
                    block_tokens=bt,
                    with_break_even=False,
                )
                r = min(plan.reload_tokens // bt, k)
                if r:
                    reload[tier] = r
                    usable = pos + r
                    c.reloaded_tokens += r * bt
                    link = self.links.get(tier)
                    if link is not None:
                        link.submit(cost.kv_bytes(r * bt))
                    stored = min(pos + r, d + dev.new_blocks)  # a full device may store less
                    if self._moving and stored > pos:
                        self._move(TierMove(tuple(hashes[pos:stored].tolist()), tier, Tier.DEVICE))
                c.prefill_s_saved += plan.recompute_s - plan.time_s
                saved += plan.recompute_s - plan.time_s
                onboard_s = plan.time_s if onboard_s < 0 else max(onboard_s, plan.time_s)
            pos += k
        if onboard_s < 0:
            onboard_s = cost.prefill_time(prompt_tokens - d * bt, d * bt)
        if self._write_hits and d:
            # Selective write-through (SGLang HiCache's write_through_selective): a device hit
            # the filter now admits is backed up at once instead of waiting for its eviction.
            self.write_down(Tier.DEVICE, hashes[:d], d, on_evict=False)
        return TieredAccess(
            device_blocks=d,
            host_blocks=found[Tier.HOST],
            disk_blocks=found[Tier.DISK],
            reload_blocks=reload,
            new_blocks=dev.new_blocks,
            onboard_s=onboard_s,
            prefill_s_saved=saved,
            handle=dev.handle,
            tree=self.device.tree,
        )

    def _load(self, tier: Tier) -> float:
        link = self.links.get(tier)
        return link.load if link is not None else 0.0

    def prefetch(self, hashes: Sequence[BlockHash]) -> dict[Tier, int]:
        """Copies the lower-tier part of ``hashes``' cached prefix onto the device now, ahead of
        its request (a session's next turn); returns the blocks moved from each tier. A later
        ``access`` finds them on the device. Prefetches always reload: they are off the
        request's critical path, so only the link's time is spent."""
        hashes = as_block_hashes(hashes)
        m = self.device.match(hashes)
        end, moved = m.num_blocks, {tier: 0 for tier in LOWER_TIERS}
        start = end
        for tier, cache in self.lower:
            if end >= len(hashes):
                break
            k = cache.match(hashes).num_blocks
            if k > end:
                moved[tier] = k - end
                end = k
        if end == start:
            return moved
        # Store first: the device's evictions (written down) free the slots the copies fill.
        left = self.device.insert(hashes[:end], match=m).new_blocks
        pos = start
        for tier in LOWER_TIERS:
            k = moved[tier] = min(moved[tier], left)
            if not k:
                continue
            left -= k
            self._counters[tier].prefetched_blocks += k
            link = self.links.get(tier)
            if link is not None:
                link.submit(self.cost.kv_bytes(k * self.block_tokens))
            if self._moving:
                self._move(TierMove(tuple(hashes[pos : pos + k].tolist()), tier, Tier.DEVICE))
            pos += k
        return moved

    # --- writing down --------------------------------------------------------------------

    def write_down(self, src: Tier, path: BlockHashes, num_blocks: int, *, on_evict: bool) -> int:
        """Writes the last ``num_blocks`` blocks of ``path`` (a full prefix held by ``src``)
        down, with any ancestors a lower tier lacks. The next tier takes them up to the last
        block its filter admits; blocks it refuses are offered to the tier below it
        (write-around), and what no tier takes is dropped. Returns the blocks written.
        Called by the tier observers."""
        run = path[len(path) - num_blocks :]
        base = len(path) - num_blocks
        placed = written_total = 0
        for dst in self._lower_than[src]:
            keep = self.filters[dst].admitted_prefix(run)
            if keep > placed:
                prefix = path[: base + keep]
                stored = self.caches[dst].insert(prefix)
                written = stored.new_blocks
                self._counters[dst].written_blocks += written
                written_total += written
                # A tier too small (or too locked) for the whole run passes the rest down.
                placed = max(placed, min(keep, stored.cached_blocks - base))
                if written and self._moving:
                    end = stored.cached_blocks
                    self._move(TierMove(tuple(prefix[end - written : end].tolist()), src, dst))
            if placed == num_blocks:
                break
        if on_evict:
            self._counters[src].dropped_blocks += num_blocks - placed
        return written_total

    # --- block level, passed to the device -----------------------------------------------

    @property
    def capacity_blocks(self) -> int:
        return self.device.capacity_blocks

    @property
    def num_cached_blocks(self) -> int:
        return self.device.num_cached_blocks

    def lock(self, handle: Node) -> None:
        self.device.lock(handle)

    def unlock(self, handle: Node) -> None:
        self.device.unlock(handle)

    def take_events(self) -> list[KVEvent]:
        """Drains every tier's events (``record_events``): device first, then host, then disk;
        each event's ``tier`` says where its blocks are."""
        events: list[KVEvent] = []
        for cache in self.caches.values():
            events.extend(cache.take_events())
        return events

    def add_mover(self, mover: Mover) -> None:
        """Calls ``mover(move)`` for every copy between tiers as soon as it is decided, inside
        the cache operation: a demotion while the evicted device block's bytes are still in
        its pool slot (the slot may be handed out again within the same operation, but is not
        written before the operation returns), a reload after the device stored the block.
        This is how real tensors follow the cache (``kvtide.tensors``)."""
        self._movers.append(mover)
        self._moving = True

    def _move(self, move: TierMove) -> None:
        if self.config.record_moves:
            self._moves.append(move)
        for mover in self._movers:
            mover(move)

    def take_moves(self) -> list[TierMove]:
        """Drains the copies between tiers since the last call (``record_moves``), in the
        order to carry them out: a request's demotions (which free device slots) come before
        the reloads that fill them."""
        moves, self._moves = self._moves, []
        return moves

    def stats(self) -> TieredStats:
        tiers = {}
        for tier, cache in self.caches.items():
            c = self._counters[tier]
            tiers[tier] = TierStats(
                tier=tier,
                capacity_blocks=cache.capacity_blocks,
                cached_blocks=cache.num_cached_blocks,
                hit_tokens=c.hit_tokens,
                reloaded_tokens=c.reloaded_tokens,
                written_blocks=c.written_blocks,
                evicted_blocks=cache.tree.num_evicted_total,
                dropped_blocks=c.dropped_blocks,
                prefetched_blocks=c.prefetched_blocks,
                prefill_s_saved=c.prefill_s_saved,
            )
        return TieredStats(self._lookups, self._prompt_tokens, tiers, self.device.stats())
