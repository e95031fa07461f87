"""One engine replica: continuous batching with chunked prefill over a core KVCache.

Each iteration takes the running sequences first (a decode token each, or the next chunk of a
prefill) and then admits waiting requests in arrival order while the token budget lasts, as
vLLM v1's scheduler does. KV lives in the real ``KVCache``: at admission a request's cached
prefix is matched and locked and every other block it needs up to its next token is reserved
from the pool, after an O(1) check that they fit (a request that cannot fit evicts nothing).
A full prompt block enters the cache when the chunk computing it is scheduled (other requests
of that iteration may share it, as in vLLM) and is announced (``BlockStored``) only when that
iteration completes. When the pool runs dry the newest running request is preempted and later
recomputed; ``abort`` drops a request wherever it is. A request whose prompt KV another engine
computed (disaggregated prefill) loads the part it lacks over the NIC, parked with its blocks
while other requests run, as vLLM's NixlConnector parks it in WAITING_FOR_REMOTE_KVS.

Driven by a Clock: ``schedule()`` plans an iteration (or a run of decode-only iterations that
nothing can change), the caller lets its time pass, and ``complete()`` applies it. The
simulator does that on a ManualClock; an emulated engine server can do it on a WallClock.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvtide.clock import Clock
from kvtide.core.cache import KVCache, Match
from kvtide.core.events import KVEvent
from kvtide.core.hashing import BlockHashes
from kvtide.core.node import Node
from kvtide.core.tiers import TieredCache
from kvtide.engine.prefix_source import NoSource, PrefixSource
from kvtide.engine.timing import DecodeRun, IterationTimer
from kvtide.errors import CapacityError, ConfigError, UsageError
from kvtide.types import Request

SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Batching limits of one engine.

    ``max_batched_tokens`` is the per-iteration token budget (vLLM's ``max_num_batched_tokens``);
    ``max_decode_steps`` bounds how many decode-only iterations one ``schedule()`` may fuse when
    nothing but time can change the batch. ``prefill_only`` makes a disaggregated prefill
    instance: a request ends with its first token. ``scheduling_policy`` is vLLM's:
    ``"fcfs"`` admits waiting requests in arrival order and preempts the newest running one;
    ``"priority"`` admits them by (priority, arrival), lower first, a preempted request going
    back to its place in that order, and preempts the running request last in it.
    """

    max_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_decode_steps: int = 256
    prefill_only: bool = False
    scheduling_policy: str = "fcfs"

    def __post_init__(self) -> None:
        if self.max_batched_tokens < 1:
            raise ConfigError("max_batched_tokens must be >= 1")
        if self.max_num_seqs < 1:
            raise ConfigError("max_num_seqs must be >= 1")
        if self.max_decode_steps < 1:
            raise ConfigError("max_decode_steps must be >= 1")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ConfigError(
                f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                f"got {self.scheduling_policy!r}"
            )


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one finished request, in seconds on the engine's clock."""

    request_id: str
    arrival_s: float
    first_token_s: float
    finish_s: float
    prompt_tokens: int
    output_tokens: int
    hit_tokens: int
    """Prompt tokens found cached at the first admission, in any tier or fetched."""
    host_hit_tokens: int
    """Of those, tokens found in host memory (reloaded or, if cheaper, recomputed)."""
    disk_hit_tokens: int
    fetched_tokens: int
    """Of those, tokens fetched from elsewhere (another replica, a global pool)."""
    prefill_tokens: int
    """Tokens this request prefilled, recomputation after preemption included."""
    num_preemptions: int


class Sequence:
    """A request inside the engine: its progress and the KV it holds."""

    __slots__ = (
        "arrival_s",
        "cached_tokens",
        "disk_hit_tokens",
        "fetched_tokens",
        "first_token_s",
        "handle",
        "hashes",
        "hit_tokens",
        "hold_kv",
        "host_hit_tokens",
        "is_prefilled",
        "kv_capacity_tokens",
        "load_s",
        "num_computed",
        "num_generated",
        "num_preemptions",
        "num_target",
        "num_tokens",
        "onboard_s",
        "order",
        "output_limit",
        "prefill_tokens",
        "priority",
        "private",
        "ready_s",
        "remote_tokens",
        "request",
        "tree_blocks",
    )

    def __init__(
        self, request: Request, hashes: BlockHashes, arrival_s: float, is_prefilled: bool
    ) -> None:
        self.request = request
        self.hashes = hashes
        self.arrival_s = arrival_s
        self.is_prefilled = is_prefilled
        self.priority = 0  # vLLM's scheduling priority: lower is admitted first
        self.order = 0  # arrival rank in this engine: the last tie-break
        self.first_token_s: float | None = None
        self.handle: Node | None = None
        self.tree_blocks = 0
        self.private = array("i")
        self.num_computed = 0  # tokens whose KV is in memory (hits included)
        self.num_target = 0  # tokens to hold before the next token can be produced
        self.num_generated = 0
        self.num_tokens = request.prompt_tokens  # prompt + generated: a decode step's context
        self.kv_capacity_tokens = 0  # tokens the blocks it holds can store
        self.output_limit = max(1, request.output_tokens)
        self.hit_tokens = -1  # -1 until first admitted
        self.cached_tokens = 0  # what vLLM reports as usage's cached_tokens (see _count_hits)
        self.fetched_tokens = 0
        self.host_hit_tokens = 0
        self.disk_hit_tokens = 0
        self.onboard_s = 0.0  # transfer time charged to the first chunk's iteration
        self.remote_tokens = 0  # prompt tokens whose KV another engine holds, until loaded
        self.hold_kv = False  # keep its blocks past its end, for another engine to read
        self.load_s = 0.0  # the remote load's NIC time, from admission until parked
        self.ready_s = 0.0  # when a parked request's remote KV has arrived
        self.prefill_tokens = 0
        self.num_preemptions = 0

    @property
    def output_tokens(self) -> int:
        return self.output_limit

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < self.num_target

    @property
    def context_tokens(self) -> int:
        """Tokens of KV a decode step of this sequence attends to (its new token included)."""
        return self.num_tokens

    def generate(self, tokens: int) -> None:
        self.num_generated += tokens
        self.num_tokens += tokens


@dataclass(slots=True)
class Batch:
    """One planned iteration, or a run of ``run.num_steps`` decode-only iterations."""

    start_s: float
    prefill: list[tuple[Sequence, int]]
    decode: list[Sequence]
    run: DecodeRun
    events: list[KVEvent] = field(default_factory=list)
    """The cache's KV events of planning this iteration, published when it completes."""

    @property
    def num_steps(self) -> int:
        return self.run.num_steps

    def end_s(self, steps: int | None = None) -> float:
        return self.start_s + self.run.elapsed_s(self.run.num_steps if steps is None else steps)

    def steps_by(self, now_s: float) -> int:
        """Steps done once the step in flight at ``now_s`` has finished."""
        return self.run.steps_by(now_s - self.start_s)


@dataclass(slots=True)
class EngineStats:
    busy_s: float = 0.0
    num_iterations: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    num_preemptions: int = 0
    num_finished: int = 0
    num_aborted: int = 0
    hit_tokens: int = 0
    fetched_tokens: int = 0
    prompt_tokens: int = 0
    shared_prefill_blocks: int = 0
    """Prompt blocks a request computed that another request cached while it waited for its
    chunk (two requests prefilling one uncached prefix at once): computed twice, held once,
    since the second copy is shared when it enters the cache."""


class Scheduler:
    """Continuous batching for one replica over ``cache`` (its pool is the engine's KV).

    With ``tiers`` (whose device tier must be ``cache``) prompts are looked up through the
    tiered cache's ``access``: host and disk hits are reloaded or recomputed as its cost model
    decides, and device evictions are written down. ``source`` offers prompt blocks held
    elsewhere (other replicas). Reloads and fetches count as hits; the part of their transfer
    time that the request's own prefill does not hide is added to the iteration that starts it.
    ``network_s(tokens)`` is the NIC time of loading ``tokens`` tokens of a request's remote
    prefill (``add(..., remote_tokens=)``); such loads take turns on the NIC and stall no
    iteration.
    """

    def __init__(
        self,
        config: EngineConfig,
        cache: KVCache,
        timer: IterationTimer,
        clock: Clock,
        source: PrefixSource | None = None,
        tiers: TieredCache | None = None,
        network_s: Callable[[int], float] | None = None,
    ) -> None:
        if tiers is not None and tiers.device is not cache:
            raise ConfigError("the engine's cache must be the tiered cache's device tier")
        self.config = config
        self.cache = cache
        self.tiers = tiers
        self.timer = timer
        self.clock = clock
        self.source: PrefixSource = source or NoSource()
        self.network_s = network_s
        self.block_tokens = cache.config.block_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.loading: deque[Sequence] = deque()
        """Admitted requests waiting for their remote KV, holding their blocks, by ``ready_s``."""
        self.held: dict[str, Sequence] = {}
        """Finished requests whose blocks stay theirs until ``release_held`` (``add(...,
        hold_kv=True)``: a prefill whose KV a decode engine will read)."""
        self._nic_free_s = 0.0  # when the NIC has finished the remote loads given to it
        self._by_priority = config.scheduling_policy == "priority"
        self._arrivals = 0
        self.stats = EngineStats()
        self._ready_events: list[KVEvent] = []
        self._planned: Batch | None = None  # the batch between schedule() and complete()

    # --- intake ---------------------------------------------------------------------------

    def add(
        self,
        request: Request,
        hashes: BlockHashes,
        *,
        arrival_s: float | None = None,
        first_token_s: float | None = None,
        priority: int = 0,
        remote_tokens: int = 0,
        hold_kv: bool = False,
    ) -> None:
        """Queues ``request`` whose full prompt blocks hash to ``hashes``. With
        ``first_token_s`` the request was prefilled elsewhere (a decode instance after
        disaggregated prefill): its prompt KV arrives computed and its first token is out.
        ``priority`` orders it among the waiting under the ``"priority"`` policy.
        ``remote_tokens``: the prompt's first tokens whose KV another engine computed (vLLM's
        ``do_remote_prefill``); what the local prefix lacks of them is loaded at admission
        (see ``_load_remote``), then the rest of the prompt is computed here. ``hold_kv``: when
        it finishes its blocks stay referenced, neither free nor evictable, until
        ``release_held`` (vLLM's ``delay_free_blocks`` for a ``do_remote_decode`` request,
        whose KV the decode engine reads after the prefill's answer)."""
        if not 0 <= remote_tokens <= request.prompt_tokens:
            raise UsageError(
                f"remote_tokens must lie in [0, {request.prompt_tokens}], got {remote_tokens}"
            )
        if remote_tokens and self.network_s is None:
            raise UsageError("a remote prefill's KV needs an engine with network_s")
        need = self._blocks_for(request.prompt_tokens + max(1, request.output_tokens))
        if need > self.cache.capacity_blocks:
            raise CapacityError(
                f"request {request.request_id} needs {need} blocks; the engine has "
                f"{self.cache.capacity_blocks}"
            )
        when = self.clock.now() if arrival_s is None else arrival_s
        seq = Sequence(request, hashes, when, first_token_s is not None)
        if first_token_s is not None:
            seq.first_token_s = first_token_s
            seq.generate(1)
        seq.priority = priority
        seq.remote_tokens = remote_tokens
        seq.hold_kv = hold_kv
        seq.order = self._arrivals
        self._arrivals += 1
        if self._by_priority:
            self._enqueue(seq)
        else:
            self.waiting.append(seq)

    def _enqueue(self, seq: Sequence) -> None:
        """Puts ``seq`` in its place among the waiting by (priority, arrival) (the
        ``"priority"`` policy: vLLM's request order), scanning from the back, where a new
        arrival of equal priority belongs."""
        waiting = self.waiting
        key = _rank(seq)
        i = len(waiting)
        while i and _rank(waiting[i - 1]) > key:
            i -= 1
        waiting.insert(i, seq)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.loading)

    @property
    def num_waiting(self) -> int:
        """Requests not running: queued, or parked for their remote KV (vLLM counts both)."""
        return len(self.waiting) + len(self.loading)

    @property
    def next_ready_s(self) -> float | None:
        """When the first parked request's remote KV has arrived (it may run from then on);
        ``None`` when none is parked."""
        return self.loading[0].ready_s if self.loading else None

    @property
    def num_running(self) -> int:
        return len(self.running)

    def take_events(self) -> list[KVEvent]:
        """The KV events of the iterations completed since the last call (every tier's, when
        tiered), and of anything the cache did outside an iteration. An iteration's events
        (the blocks its prefill chunks compute, the evictions that made room) are held until
        ``complete``: a block is never announced before the iteration computing it is done,
        as vLLM publishes a step's events after its output."""
        ready = self._ready_events
        late = self._cache_events()  # the cache's own doings outside an iteration, if any
        if not ready:
            return late
        self._ready_events = []
        ready.extend(late)
        return ready

    def _cache_events(self) -> list[KVEvent]:
        if self.tiers is not None:
            return self.tiers.take_events()
        return self.cache.take_events()

    # --- planning -------------------------------------------------------------------------

    def schedule(self, start_s: float | None = None) -> Batch | None:
        """Plans the next iteration from ``start_s`` (default: now); ``None`` when there is
        nothing to run."""
        if not self.running and not self.waiting and not self.loading:
            return None
        now = self.clock.now() if start_s is None else start_s
        if self.loading:
            self._promote(now)
        budget = self.config.max_batched_tokens
        prefill: list[tuple[Sequence, int]] = []
        decode: list[Sequence] = []
        preempted = self._reserve_decode()
        for seq in self.running:
            left = seq.num_target - seq.num_computed
            if left > 0:
                chunk = left if left < budget else budget
                if chunk > 0:
                    prefill.append((seq, chunk))
                    self._cache_computed(seq, seq.num_computed + chunk)
                    budget -= chunk
            else:
                decode.append(seq)
                budget -= 1
        if not preempted or not self.running:
            budget = self._admit(budget, prefill, decode, now)
        if not prefill and not decode:
            # Nothing fits even alone, or only remote KV is on its way: the caller must wait
            # for a completion or for ``next_ready_s``. Whatever the cache did meanwhile
            # (evictions for a preemption or a parked request) is no one's computation.
            self._ready_events.extend(self._cache_events())
            return None
        if prefill:
            timer = self.timer
            chunks = [(n, s.num_computed) for s, n in prefill]
            context = sum(s.num_tokens for s in decode)
            step = timer.iteration_s(chunks, len(decode), context)
            for seq, _ in prefill:
                if seq.onboard_s:  # the fetch shares the NIC with any other in this step
                    step += seq.onboard_s
                    seq.onboard_s = 0.0
            batch = Batch(now, prefill, decode, DecodeRun(1, step), self._cache_events())
        else:
            run = self._plan_run(decode)  # may evict for the blocks it reserves ahead
            batch = Batch(now, prefill, decode, run, self._cache_events())
        self._planned = batch
        return batch

    def _plan_run(self, decode: list[Sequence]) -> DecodeRun:
        """Decode-only iterations: as many as nothing but time can change (until the first
        sequence finishes), bounded by the blocks that can be reserved ahead."""
        # Whatever kept a waiting request out this time (KV, the sequence limit) lasts until a
        # sequence finishes, and new arrivals interrupt the run (``Batch.steps_by``).
        steps = self.config.max_decode_steps
        context = 0
        for seq in decode:
            left = seq.output_limit - seq.num_generated
            if left < steps:
                steps = left
            context += seq.num_tokens
        if steps > 1:
            steps = self._reserve_ahead(decode, steps)
        return self.timer.decode_run(len(decode), context, steps)

    def _admit(
        self,
        budget: int,
        prefill: list[tuple[Sequence, int]],
        decode: list[Sequence],
        now: float,
    ) -> int:
        max_seqs = self.config.max_num_seqs
        while budget > 0 and self.waiting and len(self.running) < max_seqs:
            seq = self.waiting[0]
            if not self._allocate_prompt(seq):
                break
            self.waiting.popleft()
            if seq.load_s:
                self._park(seq, now)
                continue
            self.running.append(seq)
            if not seq.is_prefilling:  # prefilled elsewhere: it decodes right away
                decode.append(seq)
                budget -= 1
                continue
            chunk = min(seq.num_target - seq.num_computed, budget)
            prefill.append((seq, chunk))
            self._cache_computed(seq, seq.num_computed + chunk)
            budget -= chunk
        return budget

    def _park(self, seq: Sequence, now: float) -> None:
        """An admitted request waits for its remote KV holding its blocks, as vLLM parks it in
        WAITING_FOR_REMOTE_KVS: it takes no token budget and no running slot meanwhile. Loads
        take turns on the NIC (each transfer at its full rate, one after another)."""
        start = now if now > self._nic_free_s else self._nic_free_s
        seq.ready_s = self._nic_free_s = start + seq.load_s
        seq.load_s = 0.0
        self.loading.append(seq)

    def _promote(self, now: float) -> None:
        """Parked requests whose KV has arrived by ``now`` join the running ones (while there
        are running slots), to compute their last prompt token next."""
        loading, running = self.loading, self.running
        max_seqs = self.config.max_num_seqs
        while loading and loading[0].ready_s <= now and len(running) < max_seqs:
            running.append(loading.popleft())

    # --- KV -------------------------------------------------------------------------------

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def _take_blocks(self, n: int) -> array[int] | None:
        """``n`` pool blocks, evicting unlocked cached blocks if needed; ``None`` if they
        cannot all be had: then nothing is taken and nothing is evicted (the check is O(1))."""
        if n <= 0:
            return array("i")
        cache = self.cache
        pool = cache.pool
        short = n - pool.num_free
        if short > 0:
            if short > cache.num_evictable_blocks:
                return None
            cache.evict(short)
        return pool.try_allocate(n)

    def _allocate_prompt(self, seq: Sequence) -> bool:
        """Finds and locks the cached prefix and reserves every other block up to the next
        token; ``False`` (nothing taken, nothing evicted, lower tiers not consulted) if they
        do not fit. The reserved blocks stay private to the request until the prefill chunk
        that computes a full prompt block is scheduled: only then does that block enter the
        cache (``_cache_computed``), as in vLLM."""
        cache = self.cache
        req = seq.request
        bt = self.block_tokens
        target = req.prompt_tokens + seq.num_generated
        total_blocks = self._blocks_for(target)
        if seq.is_prefilled:
            # The prompt's KV arrived with the request: room for it and the next token.
            blocks = self._take_blocks(total_blocks)
            if blocks is None:
                return False
            seq.private = blocks
            seq.kv_capacity_tokens = len(blocks) * bt
            seq.num_target = seq.num_computed = target - 1
            seq.hit_tokens = max(seq.hit_tokens, 0)
            return True
        hashes = seq.hashes
        tiers = self.tiers
        # The room check needs the cached prefix locked (evictions must not take it). The
        # tiered lookup touches every tier and plans reloads, so it waits for the check: a
        # peek (no touch) locks what is surely cached meanwhile.
        match = cache.match(hashes) if tiers is None else cache.match(hashes, touch=False)
        cache.lock(match.handle)
        if total_blocks - match.num_blocks > cache.pool.num_free + cache.num_evictable_blocks:
            cache.unlock(match.handle)
            return False
        hit_blocks = match.num_blocks
        handle = match.handle
        host = disk = 0
        if tiers is None:
            usable = hit_blocks * bt
            hit = usable
        else:
            access = tiers.access(
                hashes,
                req.prompt_tokens,
                tenant=req.tenant,
                priority=req.priority,
                insert=False,
                lock=True,
            )
            cache.unlock(handle)
            handle, hit_blocks = access.handle, access.device_blocks
            usable = access.usable_blocks * bt
            hit = access.hit_blocks * bt
            host, disk = access.host_blocks * bt, access.disk_blocks * bt
            if host or disk:
                # The plan's time covers the reloads and the prefill of the rest, overlapped
                # layer by layer; the engine computes that prefill itself: only the excess is
                # the reload's.
                computed = max(target - usable, 1)
                prefill_s = tiers.cost.prefill_time(computed, min(usable, target - 1))
                seq.onboard_s = max(0.0, access.onboard_s - prefill_s)
        fetched = 0
        if seq.remote_tokens:
            usable, fetched = self._load_remote(seq, usable)
        elif usable < len(hashes) * bt:
            fetch = self.source.fetch(hashes, usable // bt)
            if fetch.num_blocks:
                usable += fetch.num_blocks * bt
                fetched = fetch.num_blocks * bt
                seq.onboard_s += fetch.seconds
        private = self._take_blocks(total_blocks - hit_blocks)
        assert private is not None, "the room was checked with the prefix locked"
        seq.handle = handle
        seq.tree_blocks = hit_blocks
        seq.private = private
        seq.kv_capacity_tokens = total_blocks * bt
        # At least the last token is always computed: it yields the next token's logits.
        seq.num_computed = min(usable, target - 1)
        seq.num_target = target
        if seq.hit_tokens < 0:
            if tiers is None:  # first admission: the cache counts and classifies the lookup
                cache.count_lookup(hashes, hit_blocks, req.prompt_tokens, tenant=req.tenant)
            self._count_hits(
                seq, max(hit, usable), usable=usable, fetched=fetched, host=host, disk=disk
            )
        return True

    def _load_remote(self, seq: Sequence, usable: int) -> tuple[int, int]:
        """A remote prefill's KV, as vLLM's NixlConnector takes it on the decode side
        (``get_num_new_matched_tokens``, pull mode): the local hit counts in whole blocks and
        at most prompt - 1 tokens, the remote's tokens after it are loaded (``load_s`` on the
        NIC), and the last prompt token is then recomputed. Once per request, as vLLM's
        connector transfers once: a request preempted later recomputes its prompt here.
        Returns the usable tokens (local and loaded) and the loaded ones."""
        remote, seq.remote_tokens = seq.remote_tokens, 0
        bt = self.block_tokens
        local = min(usable, (seq.request.prompt_tokens - 1) // bt * bt)
        loaded = remote - local
        if loaded <= 0:
            return usable, 0
        assert self.network_s is not None, "add() refuses remote tokens without network_s"
        seq.load_s = self.network_s(loaded)
        return local + loaded, loaded

    def _cache_computed(self, seq: Sequence, tokens: int) -> None:
        """Puts the prompt's full blocks among its first ``tokens`` tokens into the cache (a
        scheduled chunk computes them), moving their room from the request's private
        reservation, and moves its lock down to the new end. Blocks that another request
        cached meanwhile are shared, and the room reserved for them goes back to the pool.
        Their ``BlockStored`` events leave with the iteration's (see ``complete``)."""
        c = tokens // self.block_tokens
        hashes = seq.hashes
        if c > len(hashes):
            c = len(hashes)
        have = seq.tree_blocks
        if c <= have:
            return
        cache = self.cache
        handle = seq.handle
        assert handle is not None and handle.end_depth == have
        k = c - have
        private = seq.private
        cache.pool.free(private[-k:])
        del private[-k:]
        # The locked handle is still the end of the request's cached prefix: insert from it
        # without walking (and touching) the path again.
        start = Match(have, handle, cache.tree, cache.tree.version)
        req = seq.request
        access = cache.insert(hashes[:c], match=start, tenant=req.tenant, priority=req.priority)
        assert access.cached_blocks == c, "the room was reserved at admission"
        self.stats.shared_prefill_blocks += k - access.new_blocks
        cache.lock(access.handle)
        cache.unlock(handle)
        seq.handle = access.handle
        seq.tree_blocks = c

    def _count_hits(
        self,
        seq: Sequence,
        hit: int,
        *,
        usable: int,
        fetched: int = 0,
        host: int = 0,
        disk: int = 0,
    ) -> None:
        """``hit``: prompt tokens found cached in any tier (recomputed ones included);
        ``usable``: those whose KV the request really takes (device, reloaded, fetched)."""
        seq.hit_tokens = hit
        # vLLM caps a local prefix hit at prompt - 1 tokens in whole blocks (the last token is
        # always computed) and reports what it takes as cached_tokens, plus what a KV
        # connector loaded after it (its PrefillStats: local + external cached tokens).
        prompt = seq.request.prompt_tokens
        local = min(usable - fetched, (prompt - 1) // self.block_tokens * self.block_tokens)
        seq.cached_tokens = local + fetched
        seq.fetched_tokens = fetched
        seq.host_hit_tokens = host
        seq.disk_hit_tokens = disk
        stats = self.stats
        stats.hit_tokens += hit
        stats.fetched_tokens += fetched
        stats.prompt_tokens += seq.request.prompt_tokens

    def _grant(self, seq: Sequence, blocks: array[int]) -> None:
        seq.private.extend(blocks)
        seq.kv_capacity_tokens += len(blocks) * self.block_tokens

    def _reserve_decode(self) -> bool:
        """Gives every decoding sequence room for its next token, preempting the newest
        running sequences while the pool cannot; ``True`` if anything was preempted."""
        preempted = False
        running = self.running
        i = 0
        while i < len(running):
            seq = running[i]
            short = seq.num_tokens - seq.kv_capacity_tokens
            if short <= 0 or seq.num_computed < seq.num_target:
                i += 1
                continue
            missing = self._blocks_for(short)
            blocks = self._take_blocks(missing)
            while blocks is None:
                if self._by_priority:
                    victim = max(running, key=_rank)
                    j = running.index(victim)
                else:
                    victim, j = running[-1], len(running) - 1
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
                if j < i:  # an earlier one went: seq moved down one place
                    i -= 1
                blocks = self._take_blocks(missing)
            if blocks is None:
                continue  # seq itself was preempted; running[i] is the next one now
            self._grant(seq, blocks)
            i += 1
        return preempted

    def _reserve_ahead(self, decode: list[Sequence], steps: int) -> int:
        """Reserves blocks for ``steps`` decode steps of every sequence, or for as many steps
        as the pool allows (at least the one already reserved)."""
        bt = self.block_tokens
        # Step k (from 1) of a sequence needs num_tokens + k - 1 tokens of room: the first
        # ``slack + 1`` steps fit in the blocks it holds.
        slacks = [s.kv_capacity_tokens - s.num_tokens for s in decode]

        def blocks_for(k: int) -> int:
            return sum(-(-(k - 1 - slack) // bt) for slack in slacks if slack < k - 1)

        pool = self.cache.pool
        need = blocks_for(steps)
        if need > pool.num_free:
            self.cache.evict(need - pool.num_free)
        if need > pool.num_free:
            lo, hi = 1, steps  # the largest step count whose blocks fit
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if blocks_for(mid) <= pool.num_free:
                    lo = mid
                else:
                    hi = mid - 1
            steps = lo
        for seq, slack in zip(decode, slacks, strict=True):
            if slack < steps - 1:
                blocks = pool.try_allocate(-(-(steps - 1 - slack) // bt))
                assert blocks is not None
                self._grant(seq, blocks)
        return steps

    def _release(self, seq: Sequence) -> None:
        if seq.handle is not None:
            self.cache.unlock(seq.handle)
            seq.handle = None
        if seq.private:
            self.cache.pool.free(seq.private)
            seq.private = array("i")
        seq.tree_blocks = 0
        seq.kv_capacity_tokens = 0

    def _preempt(self, seq: Sequence) -> None:
        """Recompute-mode preemption: drop the KV, queue the request first in line again."""
        self.running.remove(seq)
        self._release(seq)
        seq.is_prefilled = False  # its KV is gone: recompute it here
        seq.num_computed = 0
        seq.num_target = 0
        seq.num_preemptions += 1
        self.stats.num_preemptions += 1
        if self._by_priority:
            self._enqueue(seq)
        else:
            self.waiting.appendleft(seq)

    # --- completion -----------------------------------------------------------------------

    def complete(self, batch: Batch, steps: int | None = None) -> list[RequestRecord]:
        """Applies the first ``steps`` steps of ``batch`` (all by default) and returns the
        requests that finished."""
        run_steps = batch.num_steps if steps is None else steps
        end_s = batch.end_s(run_steps)
        if batch.events:
            self._ready_events.extend(batch.events)
            batch.events = []
        stats = self.stats
        stats.busy_s += batch.run.elapsed_s(run_steps)
        stats.num_iterations += run_steps
        finished: list[Sequence] = []
        self._planned = None
        for seq, chunk in batch.prefill:
            seq.num_computed += chunk
            seq.prefill_tokens += chunk
            stats.prefill_tokens += chunk
            if seq.num_computed >= seq.num_target:
                seq.generate(1)
                if seq.first_token_s is None:
                    seq.first_token_s = end_s
                if self.config.prefill_only or seq.num_generated >= seq.output_tokens:
                    finished.append(seq)
        for seq in batch.decode:
            seq.num_generated += run_steps
            seq.num_tokens += run_steps
            if seq.num_generated >= seq.output_limit:
                finished.append(seq)
        stats.decode_tokens += run_steps * len(batch.decode)
        records = [self._finish(seq, end_s) for seq in finished]
        stats.num_finished += len(records)
        return records

    def _finish(self, seq: Sequence, end_s: float) -> RequestRecord:
        self.running.remove(seq)
        req = seq.request
        if seq.hold_kv:
            self.held[req.request_id] = seq
        else:
            self._release(seq)
        first = seq.first_token_s if seq.first_token_s is not None else end_s
        return RequestRecord(
            request_id=req.request_id,
            arrival_s=seq.arrival_s,
            first_token_s=first,
            finish_s=end_s,
            prompt_tokens=req.prompt_tokens,
            output_tokens=seq.output_tokens,
            hit_tokens=max(seq.hit_tokens, 0),
            host_hit_tokens=seq.host_hit_tokens,
            disk_hit_tokens=seq.disk_hit_tokens,
            fetched_tokens=seq.fetched_tokens,
            prefill_tokens=seq.prefill_tokens,
            num_preemptions=seq.num_preemptions,
        )

    # --- abort and failure ----------------------------------------------------------------

    def abort(self, request_id: str, *, run_steps_done: int = 0) -> Sequence | None:
        """Drops request ``request_id`` wherever it is (a client went away): its private
        blocks return to the pool and its lock on the cached prefix is released (those blocks
        stay cached and become evictable). The planned iteration keeps its timing but no
        longer carries it; if it decodes in a planned run, that run's first ``run_steps_done``
        steps count as done for it (their tokens were out). Returns the sequence, or ``None``
        if no such request is in the engine."""
        seq = (
            _take(self.waiting, request_id)
            or _take(self.loading, request_id)
            or _take(self.running, request_id)
        )
        if seq is None:
            return None
        planned = self._planned
        if planned is not None:
            if seq in planned.decode:
                planned.decode.remove(seq)
                if run_steps_done:
                    seq.generate(run_steps_done)
                    self.stats.decode_tokens += run_steps_done
            else:
                planned.prefill[:] = [(s, n) for s, n in planned.prefill if s is not seq]
        self._release(seq)
        self.stats.num_aborted += 1
        return seq

    def release_held(self, request_id: str) -> bool:
        """Lets a finished ``hold_kv`` request's blocks go: its prompt's stay cached (and
        evictable), the rest return to the pool. ``False`` if none is held by that id."""
        seq = self.held.pop(request_id, None)
        if seq is None:
            return False
        self._release(seq)
        return True

    @property
    def held_blocks(self) -> int:
        """Blocks the held requests keep from use."""
        return sum(s.tree_blocks + len(s.private) for s in self.held.values())

    def drain(self) -> list[Sequence]:
        """Drops every request (a crash): releases their KV, held blocks' too, and returns
        the unfinished ones, oldest first."""
        for request_id in list(self.held):
            self.release_held(request_id)
        self._planned = None
        held = [*self.running, *self.loading]
        seqs = sorted(held, key=lambda s: s.arrival_s) + list(self.waiting)
        for seq in held:
            self._release(seq)
        self.running.clear()
        self.loading.clear()
        self.waiting.clear()
        return seqs


def _take(seqs: deque[Sequence] | list[Sequence], request_id: str) -> Sequence | None:
    """Removes and returns request ``request_id`` from ``seqs``, if it is there."""
    for seq in seqs:
        if seq.request.request_id == request_id:
            seqs.remove(seq)
            return seq
    return None


def _rank(seq: Sequence) -> tuple[int, float, int]:
    """A sequence's place under the ``"priority"`` policy: priority, then arrival."""
    return (seq.priority, seq.arrival_s, seq.order)
