"""``cost``: route to the smallest estimated cost in seconds: this request's time to first
token plus the delay its prefill adds to the requests already on the replica.

TTFT(replica) = queue wait (its queued prefill tokens at the prefill rate)
              + the prompt's own prefill s given what that replica holds: device-tier blocks
                are free, host/disk blocks are reloaded or recomputed, whichever is sooner
                (overlapped layer by layer, as the cost model's ``onboard_time``).
cost(replica) = TTFT + n x s + w x e / R, with n the requests in flight there
                (``num_requests``: this router's and, in a gateway, those the engine reports
                beyond them), e the tokens the prompt must write into that replica's device
                cache (the prompt less its device-tier hit), R the prefill rate in tokens/s
                and w = ``evict_weight`` (default 0: off).
Why n x s: continuous batching shares each iteration among the running sequences (processor
sharing), so s seconds of prefill delay each of the n requests already there by up to s (a
waiting request's first token, a decoding one's next tokens). It is the M/M/1 marginal cost
s / (1 - rho) with 1 + n for 1 / (1 - rho) (E[n] = rho / (1 - rho)), read from the replica's
load instead of estimated. Without it the estimate only counts prefill not yet done, which a
random arrival mostly finds empty at low load: a replica holding one block every prompt
shares (a chat template's default system prompt) then wins every request by that block's
prefill, and the others, or an engine restarted with an empty cache, get none.
Its weight (``inflight_weight``, default 1: n x s as above) trades the requests in flight's
delay, mostly their next tokens, against this request's first token. Weighted fully, a burst
of long prompts piles onto the replicas running the fewest requests, behind their queued
prefill, while a replica with little queued but many short requests decoding gets none: TTFT
p99 against TPOT. ``kvtide sweep`` over five 500-request windows of the Mooncake trace
(requests 0, 2,500, 5,000, 7,500, 10,000; docs/gateways.md, run 28), `cost` -> weight 0.25:
TTFT p99 3.50 / 3.72 / 4.61 / 4.97 / 4.56 s -> 3.69 / 2.83 / 3.32 / 4.04 / 3.57 (sglang-router's
rule: 3.79 / 2.48 / 3.15 / 3.41 / 3.79), p50 within 0.1 s, TPOT p50 +8% to +40% (33-56 ->
37-68 ms; sglang's rule 57-197 ms); weight 0: p99 2.52-3.31 s with TPOT up to 5x. On run 4's
chat sizing it changed hits by at most 0.3 points. Live (run 28, with ``deadline_k=10``):
Mooncake's first window p99 12.2 -> 10.3 and 9.9 s, a later one's about even, chat's cached
ratio and median more variable (64.7% / 347 ms, then 61.7% / 525). Not the default: it moves
every decision, and the built-ins simulated are mixed.
The weight is an exchange rate, not an estimate to correct: over 24 Mooncake windows
(``bench/trace_windows.py``, run 29, with ``deadline_k=10``) weights 1 / 0.25 / 0.1 / 0 put
TTFT p99 at x1.36 / x1.17 / x1.01 / x0.96 of sglang-router's rule and TPOT p50 at 41 / 51 / 64
/ 90 ms (the rule's 75), p50 30% below it at every weight. Counting only the requests still
decoding when this prefill would start (the simulator knows their remaining outputs) left the
tail where it was: a replica that prefills advances its decoders a token per chunk, so nearly
all of them still are. On the built-ins weight 0.1 loses up to 1.9 points of hits at 16Ki.
Why w x e / R (cache pressure): a warm prefix cache is full (vLLM and SGLang keep a freed
block cached until its space is needed: their free pool is the LRU cache), so every token a
prefill writes takes the place of a cached one, and the expected price of that eviction is the
recompute it causes later: e evicted tokens x the probability they would have been hit again
(w) x 1 / R seconds each. TTFT + n x s alone is myopic about it: it sends a half-cached prompt
from a replica running one request to an idle one, where it recomputes what is cached
elsewhere, duplicates it and pushes out other sessions' histories; under pressure that loses
hits the rest of the fleet then pays for in queueing. The replica holding the prompt writes
only its new part, an empty one all of it, so the term weighs each placement by what it
evicts. ``evict_weight`` = w; the default 0 leaves it out. w = 1 (an evicted token is
recomputed once) in ``kvtide simulate`` on chat sessions whose fleet KV is half what they need
(docs/gateways.md, run 4), before the holder rule below: hits 58.8% -> 59.7%, TTFT p99
2.73 -> 2.40 s; on the default ``kvtide simulate`` 79.1% -> 79.0%, p99 115 -> 122 ms; with the
holder rule it adds nothing (68.1% -> 68.2% over 8 seeds). It charges every replica as if
full; the room check below is where occupancy (the index's ``held_blocks`` against the
engine's capacity) is used.
The holder keeps its prefix (``affinity_share``, default 0.2): when an eligible replica holds
at least that share of the prompt's blocks, the request goes to the replica(s) holding the
longest prefix and the cost only breaks ties among them, as long as the holder runs at most
``holder_slack`` (default 16) requests more than the least loaded replica and its queued
prefill is within the work cap below plus ``holder_extra`` (default 2) of this request's cold
prefills. The rule binds only where a copy elsewhere would evict something:
- room: any other eligible replica whose device KV has room for the whole prompt (the index's
  ``held_blocks`` against ``ReplicaState.capacity_blocks``, which a gateway reads from vLLM's
  ``cache_config_info``) competes with the holders on cost, since it copies the prompt without
  pushing anything out (an engine restarted empty, a fleet not yet warm);
- in hot decisions (``reason == "hot"``) the rule binds to the holder of a private prefix
  (a conversation's history: the requests in flight placed on that prefix are within one
  replica's share), and to holders of a hot one only while they have nothing queued, so that
  a hot prefix is never pinned to its one holder beside idle replicas (run 5's first version
  of the rule did that live) nor a session moved off its history because its system prompt
  is hot (run 16: 8 seeds of the chat sizing, hits 66.7% -> 67.4%, TTFT p50 45 -> 38 ms,
  p99 1.143 -> 1.147 s);
- without occupancy (capacities unknown, or an index store that does not count, as Redis's, or
  the gateway's text mode, whose shadow counts its own placements in text chunks, not what
  the engines hold) the rule is off.
Why the rule: the score is one request's, but under KV pressure what decides the hit ratio is
where each shared prefix lives. A new session of a system prompt, or the next turn of a
conversation, that the score moves off the holder because it runs a request or two writes a
second copy of that prefix on another replica; copies of shared prefixes then fill the
fleet's KV and push out the sessions' histories. ``kvtide simulate`` on chat sessions whose
fleet KV is half what they need (docs/gateways.md, runs 4 and 10), seed 0: the score alone left
1.47 replicas per session and 2.1 per system prompt, the holder rule 1.18 and 1.56,
sglang-router's rule (longest match above 30%, a 64-request imbalance guard, an approximate
tree that never forgets a placement) 1.00 and 1.00. Over 8 seeds (run 10): hits 65.6% -> 66.7%
(sglang's rule 70.2%), TTFT p50 49 -> 45 ms (35), p99 1.17 -> 1.14 s (1.61); Mooncake's first
500 requests 7.4% either way (every decision there is hot: all its prompts share block 0); the
default ``kvtide simulate`` 79.1% either way.
Why a holder's cap is two prefills above the others': the holder saves the request its
prefill of what it holds (up to one prefill s), and the fleet the eviction a copy elsewhere
would cause (one more s at an evicted token recomputed once, as ``evict_weight`` = 1 reads
it), so it is worth up to 2 s more queue than a replica that would copy the prompt. Measured
(docs/gateways.md, run 17) on run 4's chat sizing, 8 seeds: 0 (holders under the same cap as
the score, before run 17) -> 2: hits 67.4% -> 68.3%, TTFT p50 38 -> 34 ms, p99 1.147 ->
1.058 s (1: 67.5%; 1.5: 68.0%; 3: 68.4%; ``inf``, the slack alone: 68.4%, p99 1.201 s); the
built-in workloads the same or up to 2 points better in hits, but chat at 16Ki (-0.3); live,
on the chat workload, no change beyond the runs' spread (59.6% against 59.9%, medians).
Below the share (a chat template's one shared block) the cost decides as before; the
bounded-load cap and hot-prefix spreading below apply first, so a hot prefix still spreads.
The slack is the price: once every replica is full, an engine restarted empty and filled
again gets none of the holders' sessions until they run ``holder_slack`` more requests than
it (decoding sequences, which on a memory-bound decode cost each other little); a tighter
slack gives the hits back (8: 67.2%, 16: 68.1%, 32 and more: 68.3%, measured with the first
version of the rule). That first version (run 5) bound hot decisions too and, under two hot
prefixes on engines at their batch limit, pinned each prefix to the one engine holding it
whole, leaving 2 of 4 engines idle beside queues in 19-21 of ~40 samples; it was off by
default from then until run 10.
The engines' queue order (``deadline_k``, default 0: off). The rules above send a request
where its prefix is, but vLLM's scheduler (and SGLang's, and the emulated engine's) takes no
reference on a waiting request's cached blocks until it admits it: the requests admitted
before it write new KV, and LRU evicts the prefix it was sent for (live, on the chat workload,
17% of the cached tokens predicted, docs/gateways.md run 18). With ``deadline_k`` = k every
decision carries a deadline, ``RouteDecision.deadline_s`` = k x the request's own predicted
prefill on the chosen replica (what it holds there costs nothing; logarithmic beyond one
iteration's prefill, ``deadline_chunk`` below) in the engines' seconds (the
TTFT model's times the pace the router learns from first tokens, ``routing.pace``), and the
caller sends arrival + deadline in milliseconds as the request's ``priority``
(``engine_priority``; lower first): the gateway in Unix time, to engines run with vLLM's
``--scheduling-policy priority`` (SGLang: ``--enable-priority-scheduling
--schedule-low-priority-values-first``); the simulator on its clock, to engines with
``scheduling_policy: priority``. A request whose prefix is cached has little to prefill and an
early deadline, so it is admitted before the queue ahead evicts its prefix; a cold prompt is
passed only by requests arriving less than its deadline after it, so none waits
without bound (a static priority by uncached tokens has no such bound: chat p99 1.058 ->
1.287 s). Measured (docs/gateways.md, run 19), engines admitting by priority: ``kvtide
sweep`` on run 4's chat sizing, 8 seeds: k = 0 -> 3: hits 68.3% -> 69.0%, TTFT p50 34 -> 30
ms, p99 1.058 -> 1.009 s (k = 1: 68.5%, 1.004 s; 10: 69.6%, 0.940 s; 30: 69.5%, 1.158 s);
Mooncake's first 500 requests: 7.6% -> 7.8%, p50 0.665 -> 0.574 s, p99 3.50 -> 3.67 s; the
built-in workloads at 16Ki and 64Ki per replica, 3 seeds: hits -0.2 to +1.3 points, p99 from
-57% (agent, 16Ki) to +40% (burst, 64Ki: 0.147 -> 0.206 s), where k = 10 loses 3.6 points
on mixed at 16Ki. Live (``bench/gateways.py --scheduling-policy priority``), chat, 2 runs:
61.1% -> 62.2%, p50 616 -> 527 ms, p99 25.1 -> 19.2 s; Mooncake, one run: 7.4% -> 7.9%, p50
2.12 -> 1.97 s, p99 10.8 -> 11.6 s. Off by default: the engines must be configured for it
(vLLM refuses a ``priority`` otherwise).
The deadline's shape (``deadline_chunk``, default 8192 tokens; 0: k x s throughout). With s
the request's own prefill and c the prefill of one engine iteration's token budget (vLLM's
``max_num_batched_tokens``: 8192 by default for its OpenAI server on a GPU of 70 GiB or more,
and the emulated engine's), the deadline is k c ln(1 + s / c): about k s for a prefill well
inside one iteration, logarithmic in s beyond. The order of any two deadlines at the same
arrival is unchanged (the function increases with s); what changes is how long later arrivals
may pass a long prompt. Linear, a prompt prefilled over several iterations (32k tokens: four)
could be passed for k of its own multi-second prefills, and such prompts are the absolute TTFT
tail: a k large enough to let short cached turns through a backlog, which is what a median in
overload needs (live chat, run 27: k = 3 -> 10, p50 550 -> 339 ms), stretched Mooncake's
p99 (11.7 -> 13.3 s). Measured (docs/gateways.md, run 28), ``kvtide sweep``, engines admitting
by priority, k = 10 with c against k = 3 and k = 10 without: run 4's chat sizing at time
scales 0.1202, 0.07 and 0.05 (load rising into overload), 6 seeds: TTFT p50 28 / 140 / 478 ms
(k = 3: 30 / 246 / 550; k = 10 linear: 27 / 138 / 478), p99 1.02 / 3.47 / 4.82 s (1.07 /
3.58 / 5.16; 0.94 / 3.62 / 4.61), hits 0.1-0.9 points above k = 3's and within 0.4 of
k = 10 linear's; five 500-request windows of the Mooncake trace (from requests 0, 2,500,
5,000, 7,500, 10,000): p99 3.63 / 3.39 / 4.89 / 5.15 / 5.02 s (k = 3: 3.67 / 3.54 / 4.90 /
5.25 / 4.90; k = 10 linear: 3.94 / 3.57 / 5.01 / 5.76 / 6.13), p50 within 0.03 s of k = 3's
but on the last window (0.60 against 0.68 s);
the built-in workloads at 16Ki and 64Ki, 3 seeds: mixed at 16Ki 54.3% hits (k = 3: 55.9%,
k = 10 linear: 52.4%), agent at 16Ki p99 1.46 s (1.17, 1.46), elsewhere hits within a
point of k = 3's and p99 from -12% (mixed at 64Ki) to +7% (rag at 64Ki). Live, 2 runs each:
chat 64.5% cached, TTFT p50 362 ms, p99 18.2 s (k = 3 linear: 62.8%, 395 ms, 16.3 s);
Mooncake's first 500 requests 7.72%, 1.86 s, 12.2 s (7.74%, 1.89 s, 12.3 s). The setting for
engines that admit by priority is k = 10 with this shape.
Guard rails, so that router replicas without a coordinator agree and no replica melts:
- a hard bounded-load cap on work in seconds (``load="work"``, the default): with q_r the
  seconds of prefill queued at replica r (the queue term of the estimate) and s the request's
  own prefill with nothing cached, r is eligible only while

      q_r <= (1 + eps) * (sum_r q_r + s) / n + s,

  i.e. after placement no replica holds more than (1+eps) x the average work plus two of this
  request's prefills. It is Mirrokni-Thorup-Zadimoghaddam's ceil((1+eps) x average) with work
  for balls: their ceil is a slack of up to one ball, which for unequal balls is at most one
  (cold) prefill of the ball being placed; the extra ``+ s`` is the minimum slack that keeps
  the cap from binding when queues are near empty (about one request in flight per replica,
  where ceil((1+eps) x average requests) lets few replicas qualify and affinity is lost).
  What it still guarantees: a request routed on a wrong index entry waits at most
  eps x average + 2 s more than on an average replica (eps x average + (2 + ``holder_extra``)
  s where the holder rule placed it), and no prefix herds onto one replica beyond that. With
  an exact estimate ``cost``'s own choice already stays under it (r wins only if
  q_r + s_r < q_min + s <= cap); the cap binds where the choice is narrowed (hot-prefix
  spreading, the holder rule) or the estimate is wrong. Cold prefixes keep chash's cap on
  request counts, which needs no estimate, so router replicas agree. ``load="requests"``
  keeps the older cap on request counts (a replica at ceil((1+eps) x average) requests is not
  eligible);
- a cold prefix (no replica holds ``min_cached_blocks``) goes where ``chash`` sends it;
- a hot prefix, whose requests in flight exceed one replica's share of all requests in flight,
  is spread over the ceil(its load / share) replicas of highest rendezvous weight for its key,
  and over any replica running less than that share;
- while the index health says the index is wrong, everything goes where ``chash`` sends it.
Optimistic updates (``provisional=True``): the index answer is merged with the router's own
decisions, each crediting its replica with the request's full blocks while the request is in
flight and ``provisional_hold_s`` (default: the worst event lag seen) after it, so that a
follow-up arriving before the engine's events still finds the replica that computed its prefix
(see ``provisional.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from kvtide.core.hashing import BlockHashes
from kvtide.errors import ConfigError
from kvtide.routing.chash import (
    RingCache,
    bounded_choice,
    prefix_key,
    rendezvous_top,
    tie_break,
)
from kvtide.routing.decision import RouteDecision
from kvtide.routing.index import Occupancy, PrefixMatch
from kvtide.routing.policies import BasePolicy, RoutingContext, check_epsilon
from kvtide.routing.provisional import provisional_entries
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.routing.ttft import TtftModel
from kvtide.types import ReplicaId, Tier

K = TypeVar("K")


def service_time(
    model: TtftModel, prompt_tokens: int, block_tokens: int, blocks: tuple[int, int, int]
) -> float:
    """Seconds to make a prompt resident and prefilled when its first ``blocks`` =
    (device, host, disk) blocks are held in those tiers."""
    d, h, k = blocks
    dt = min(d * block_tokens, prompt_tokens)
    lower = min((h + k) * block_tokens, prompt_tokens - dt)
    new = prompt_tokens - dt - lower
    if lower == 0:
        return model.prefill_time(new, dt)
    load_s = 0.0
    ht = min(h * block_tokens, lower)
    if ht:
        load_s += model.onboard_time(ht, ht, 0, Tier.HOST)
    if lower - ht:
        load_s += model.onboard_time(lower - ht, lower - ht, 0, Tier.DISK)
    with_reload = max(load_s, model.prefill_time(new, dt + lower))
    recompute = model.prefill_time(new + lower, dt)
    return min(with_reload, recompute)


class CostAware(BasePolicy):
    name = "cost"

    def __init__(
        self,
        ctx: RoutingContext,
        epsilon: float = 0.25,
        key_blocks: int = 16,
        vnodes: int = 160,
        min_cached_blocks: int = 1,
        hot_replication: bool = True,
        load: str = "work",
        provisional: bool = True,
        provisional_hold_s: float | None = None,
        evict_weight: float = 0.0,
        affinity_share: float = 0.2,
        holder_slack: int = 16,
        holder_extra: float = 2.0,
        deadline_k: float = 0.0,
        deadline_chunk: int = 8192,
        inflight_weight: float = 1.0,
    ) -> None:
        super().__init__(ctx)
        self.deadline_k = _finite_weight("deadline_k", deadline_k)
        if not (
            isinstance(deadline_chunk, int | float)
            and 0 <= deadline_chunk < math.inf
            and deadline_chunk == int(deadline_chunk)
        ):
            raise ConfigError(
                f"cost deadline_chunk must be a whole number of tokens >= 0, got {deadline_chunk!r}"
            )
        self.deadline_chunk = int(deadline_chunk)
        self.inflight_weight = _finite_weight("inflight_weight", inflight_weight)
        if not holder_extra >= 0:
            raise ConfigError(f"cost holder_extra must be >= 0, got {holder_extra!r}")
        self.holder_extra = float(holder_extra)
        if not 0.0 <= affinity_share <= 1.0:
            raise ConfigError(f"cost affinity_share must be in [0, 1], got {affinity_share!r}")
        self.affinity_share = float(affinity_share)
        if not holder_slack >= 0:
            raise ConfigError(f"cost holder_slack must be >= 0, got {holder_slack!r}")
        self.holder_slack = int(holder_slack)
        if not evict_weight >= 0:
            raise ConfigError(f"cost evict_weight must be >= 0, got {evict_weight!r}")
        self.evict_weight = float(evict_weight)
        if load not in ("work", "requests"):
            raise ConfigError(f"cost load must be 'work' or 'requests', got {load!r}")
        self.load = load
        self.epsilon = check_epsilon(epsilon)
        if key_blocks < 1 or min_cached_blocks < 1:
            raise ConfigError("key_blocks and min_cached_blocks must be >= 1")
        self.key_blocks = int(key_blocks)
        self.min_cached_blocks = int(min_cached_blocks)
        self.hot_replication = bool(hot_replication)
        self.rings = RingCache(int(vnodes))
        self.index = ctx.require_index(self.name)
        self._held = self.index.held_blocks if isinstance(self.index, Occupancy) else None
        self.provisional = provisional_entries(ctx, provisional_hold_s) if provisional else None
        # a prompt held nowhere beyond its key's blocks is routed on them (the match ends
        # there; the key and the whole-prompt key read them); a follow-up's match through the
        # provisional entries needs the rest (``on_blocks_known``)
        self.cold_head_blocks = self.key_blocks
        self.model = ctx.ttft_model
        self.prefill_tokens_per_s = self.model.prefill_tokens_per_s()
        # one engine iteration's prefill (its token budget), the deadline's scale (``_deadline``)
        self._chunk_s = self.model.prefill_time(self.deadline_chunk, 0) if deadline_chunk else 0.0
        self._inflight: dict[int, int] = {}  # prefix key -> requests in flight
        self._inflight_at: dict[tuple[int, ReplicaId], int] = {}  # ... on each replica
        self._inflight_full: dict[int, int] = {}  # whole-prompt key -> requests in flight
        # the cached prefix each request in flight was placed on (the chained hash of its
        # last block) -> requests in flight placed on it; and those prefixes by (whole-prompt
        # key, replica), which is all ``on_complete`` is told
        self._inflight_hold: dict[int, int] = {}
        self._holds_of: dict[tuple[int, ReplicaId], list[int]] = {}

    def prefix_match(self, request: RouteRequest) -> PrefixMatch:
        return self._match(request.block_hashes, request.prefix_match)

    def held_blocks(self, hashes: BlockHashes) -> int:
        return self._match(hashes).max_blocks

    def _match(self, hashes: BlockHashes, match: PrefixMatch | None = None) -> PrefixMatch:
        """The index's answer for ``hashes`` (or ``match``, a shared store's), with this
        router's provisional entries merged in."""
        if match is None:
            match = self.index.match(hashes)
        if self.provisional is not None:
            match = self.provisional.merge(match, hashes)
        return match

    def on_blocks_known(self, request: RouteRequest, hashes: Callable[[], BlockHashes]) -> None:
        entries = self.provisional
        if entries is not None and request.request_id and entries.holds(request.request_id):
            entries.extend(request.request_id, hashes())

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> RouteDecision:
        cands = self.healthy(replicas)
        key = prefix_key(request, self.key_blocks)
        if not self.ctx.health.is_trusted:
            return self._hashed(request, cands, key, "fallback")
        match = self.prefix_match(request)
        if match.max_blocks < self.min_cached_blocks:
            return self._hashed(request, cands, key, "cold")
        total = sum([r.num_requests for r in cands])
        if self.load == "work":
            eligible = self.under_work_cap(cands, request.prompt_tokens)
        else:
            cap = math.ceil((1.0 + self.epsilon) * (total + 1) / len(cands))  # as load_cap()
            eligible = [r for r in cands if r.num_requests < cap]
        capped = eligible
        reason = "affinity"
        if self.hot_replication and len(cands) > 1:
            spread = self._spread(cands, eligible, key, total, request, match)
            if spread is not None:
                eligible, reason = spread, "hot"
        held = self._held
        if (
            self.affinity_share > 0.0
            and held is not None
            and all([r.capacity_blocks > 0 for r in eligible])
        ):
            # holders answer to a work cap holder_extra of this request's prefills wider than
            # the score's (see the docstring): computed only where the holder rule runs
            pool = eligible
            if self.load == "work" and self.holder_extra > 0:
                wider = self.under_work_cap(cands, request.prompt_tokens, self.holder_extra)
                if len(wider) > len(capped):
                    pool = wider
                    if reason == "hot":
                        pool = self._spread(cands, wider, key, total, request, match) or eligible
            cap = min([r.num_requests for r in cands]) + self.holder_slack
            holders = self._holders(
                [r for r in pool if r.num_requests <= cap], match, request.num_blocks
            )
            if (
                holders is not None
                and reason == "hot"
                and self._hold_is_hot(
                    request, match.any_tier.get(holders[0].replica_id, 0), total, len(cands)
                )
            ):
                # a hot prefix binds only where it starts at once: no idle replica beside
                # a holder's queue
                holders = [r for r in holders if r.queued_prefill_tokens == 0] or None
            if holders is not None:
                # a replica with room for the whole prompt copies it evicting nothing: it
                # competes with the holders on cost
                room = [
                    r
                    for r in eligible
                    if r not in holders
                    and r.capacity_blocks - held(r.replica_id) >= request.num_blocks
                ]
                eligible = holders + room
        return self._cheapest(request, eligible, match, key, reason)

    def _holders(
        self, eligible: list[ReplicaState], match: PrefixMatch, num_blocks: int
    ) -> list[ReplicaState] | None:
        """The eligible replicas holding the longest cached prefix of this request, when that
        prefix is at least ``affinity_share`` of its blocks; else None (the cost decides)."""
        held = match.any_tier
        best = max([held.get(r.replica_id, 0) for r in eligible], default=0)
        if best < self.min_cached_blocks or best < self.affinity_share * num_blocks:
            return None
        return [r for r in eligible if held.get(r.replica_id, 0) == best]

    def _hold_is_hot(self, request: RouteRequest, blocks: int, total: int, n: int) -> bool:
        """Whether the requests in flight placed on this request's first ``blocks`` blocks
        (counting this one) exceed one replica's share of all requests in flight: the holder
        rule must not pin a hot prefix to its holders. Below the hot key's depth every
        request of the key shares the prefix, so it is hot with the key."""
        if blocks <= min(self.key_blocks, request.num_blocks):
            return True
        load = self._inflight_hold.get(int(request.block_hashes[blocks - 1]), 0) + 1
        return load > (total + 1) / n

    def work_cap_s(
        self, cands: Sequence[ReplicaState], prompt_tokens: int, extra: float = 0.0
    ) -> float:
        """The most seconds of queued prefill a replica may hold and still take a request of
        ``prompt_tokens``, with ``extra`` more of that request's prefills for a holder (see the
        module docstring)."""
        s = self.model.prefill_time(prompt_tokens, 0)
        queued_s = sum([r.queued_prefill_tokens for r in cands]) / self.prefill_tokens_per_s
        return (1.0 + self.epsilon) * (queued_s + s) / len(cands) + (1.0 + extra) * s

    def under_work_cap(
        self, cands: list[ReplicaState], prompt_tokens: int, extra: float = 0.0
    ) -> list[ReplicaState]:
        if extra == math.inf:  # no cap (and no inf x 0 where a prompt is empty)
            return list(cands)
        cap_tokens = self.work_cap_s(cands, prompt_tokens, extra) * self.prefill_tokens_per_s
        # never empty: the least loaded replica holds at most the average <= the cap
        return [r for r in cands if r.queued_prefill_tokens <= cap_tokens]

    def _spread(
        self,
        cands: list[ReplicaState],
        eligible: list[ReplicaState],
        key: int,
        total: int,
        request: RouteRequest,
        match: PrefixMatch,
    ) -> list[ReplicaState] | None:
        """The replicas a hot prefix may go to now, or None when the prefix is not hot.

        Hot: its requests in flight (counting this one) exceed one replica's share of all
        requests in flight. It then lives on the k = ceil(load / share) replicas of
        highest rendezvous weight, each taking at most ceil(load / k) of its requests in flight.
        A replica holding more of this request than the hot prefix itself (its session, say)
        stays eligible: spreading the shared part must not cost the private part's reuse.
        So does any replica running less than one replica's share (the cost then weighs its
        cold prefill against the homes' queues): two hot prefixes, each half the load, each
        get 3 of 4 replicas, and where both draw the same 3 (one pair in four) the fourth
        would otherwise sit idle beside their queues (bench/gateways.py's hot phase, live:
        an engine idle beside a queue in 12 of 36 samples of one such draw before, in 2 of
        94 samples of three draws after).
        """
        share = (total + 1) / len(cands)
        load = self._inflight.get(key, 0) + 1
        if share < 1.0 or load <= share:
            return None
        k = min(len(cands), math.ceil(load / share))
        home = set(rendezvous_top(key, [r.replica_id for r in cands], k))
        per_replica = math.ceil(load / k)
        at = self._inflight_at
        key_len = min(self.key_blocks, request.num_blocks)
        full_load = self._inflight_full.get(_full_key(request, key), 0) + 1
        # a deeper hold is private (a session's history) unless the whole prompt is hot too
        deep = key_len if full_load <= share else request.num_blocks
        held = match.any_tier
        out = [
            r
            for r in eligible
            if held.get(r.replica_id, 0) > deep
            or (r.replica_id in home and at.get((key, r.replica_id), 0) < per_replica)
            or r.num_requests + 1 <= share
        ]
        return out or [r for r in eligible if r.replica_id in home] or None

    def _cheapest(
        self,
        request: RouteRequest,
        eligible: list[ReplicaState],
        match: PrefixMatch,
        key: int,
        reason: str,
    ) -> RouteDecision:
        bt = request.block_tokens
        p = request.prompt_tokens
        inv_rate = 1.0 / self.prefill_tokens_per_s
        # seconds of later recompute per token written (evicting a cached one): see above
        evict_s = self.evict_weight * inv_rate
        w = self.inflight_weight  # the delay to the requests in flight against its own TTFT
        model = self.model
        best: list[ReplicaState] = []
        best_s = math.inf
        best_blocks = (0, 0, 0)
        dev, host, disk = match.within_tier
        dev_get = dev.get
        if host is dev and disk is dev:  # nothing below the device tier: the common fast path
            memo1: dict[int, float] = {}
            best_d = 0
            for r in eligible:
                d = dev_get(r.replica_id, 0)
                service_s = memo1.get(d)
                if service_s is None:
                    service_s = memo1[d] = service_time(model, p, bt, (d, 0, 0))
                cost_s = (
                    r.queued_prefill_tokens * inv_rate
                    + (1 + w * r.num_requests) * service_s
                    + max(p - d * bt, 0) * evict_s
                )
                # equal costs (a memory-bound prefill): the one holding more wins
                if cost_s < best_s or (cost_s == best_s and d > best_d):
                    best_s, best, best_d = cost_s, [r], d
                elif cost_s == best_s and d == best_d:
                    best.append(r)
            best_blocks = (best_d, 0, 0)
        else:
            memo: dict[tuple[int, int, int], float] = {}
            for r in eligible:
                rid = r.replica_id
                d = dev_get(rid, 0)
                h = host.get(rid, 0)
                blocks = (d, h - d, disk.get(rid, 0) - h)
                service_s = memo.get(blocks)
                if service_s is None:
                    service_s = memo[blocks] = service_time(model, p, bt, blocks)
                cost_s = (
                    r.queued_prefill_tokens * inv_rate
                    + (1 + w * r.num_requests) * service_s
                    + max(p - d * bt, 0) * evict_s
                )
                if cost_s < best_s or (cost_s == best_s and blocks > best_blocks):
                    best_s, best, best_blocks = cost_s, [r], blocks
                elif cost_s == best_s and blocks == best_blocks:
                    best.append(r)
        chosen = best[0] if len(best) == 1 else tie_break(key, best)
        cached = sum(best_blocks)
        own_s = service_time(model, p, bt, best_blocks)
        delay_s = w * chosen.num_requests * own_s  # to the requests in flight: not its TTFT
        ttft_s = best_s - delay_s - max(p - best_blocks[0] * bt, 0) * evict_s
        return RouteDecision(
            chosen.replica_id,
            self.name,
            reason,
            cached_blocks=cached,
            cached_tokens=min(cached * bt, p),
            onboard_blocks=best_blocks[1] + best_blocks[2],
            queue_tokens=chosen.queued_prefill_tokens,
            ttft_s=ttft_s,
            score=best_s,
            deadline_s=self._deadline(own_s) if self.deadline_k else None,
        )

    def _hashed(
        self, request: RouteRequest, cands: list[ReplicaState], key: int, reason: str
    ) -> RouteDecision:
        r, _ = bounded_choice(self.rings.ring(cands), key, cands, self.epsilon)
        deadline_s = None
        if self.deadline_k:  # nothing cached is counted on: the whole prompt's prefill
            deadline_s = self._deadline(self.model.prefill_time(request.prompt_tokens, 0))
        return RouteDecision(
            r.replica_id,
            self.name,
            reason,
            queue_tokens=r.queued_prefill_tokens,
            deadline_s=deadline_s,
        )

    def _deadline(self, own_s: float) -> float:
        """``deadline_k`` of the request's own predicted prefill ``own_s`` (TTFT-model
        seconds) up to one iteration's prefill c (``deadline_chunk`` tokens), logarithmic in
        it beyond: k c ln(1 + s / c), in the engines' seconds (the learned pace). With
        ``deadline_chunk=0``, k s throughout."""
        c = self._chunk_s
        slack = own_s if c <= 0.0 else c * math.log1p(own_s / c)
        return self.deadline_k * slack * self.ctx.pace.factor

    def on_dispatch(self, request: RouteRequest, decision: RouteDecision) -> None:
        if self.provisional is not None and request.request_id:
            self.provisional.record(request.request_id, decision.replica, request.block_hashes)
        key = prefix_key(request, self.key_blocks)
        self._inflight[key] = self._inflight.get(key, 0) + 1
        at = (key, decision.replica)
        self._inflight_at[at] = self._inflight_at.get(at, 0) + 1
        full = _full_key(request, key)
        self._inflight_full[full] = self._inflight_full.get(full, 0) + 1
        blocks = min(decision.cached_blocks, request.num_blocks)
        if blocks:
            hold = int(request.block_hashes[blocks - 1])
            self._holds_of.setdefault((full, decision.replica), []).append(hold)
            self._inflight_hold[hold] = self._inflight_hold.get(hold, 0) + 1

    def on_complete(self, request: RouteRequest, replica: ReplicaId) -> None:
        if self.provisional is not None and request.request_id:
            self.provisional.done(request.request_id)
        key = prefix_key(request, self.key_blocks)
        _decrement(self._inflight, key)
        _decrement(self._inflight_at, (key, replica))
        full = _full_key(request, key)
        _decrement(self._inflight_full, full)
        holds = self._holds_of.get((full, replica))
        if holds:
            _decrement(self._inflight_hold, holds.pop())
            if not holds:
                del self._holds_of[(full, replica)]


def _finite_weight(option: str, value: float) -> float:
    """``value`` as a float, or a ConfigError naming ``option`` unless it is finite and >= 0."""
    if not 0.0 <= value < math.inf:
        raise ConfigError(f"cost {option} must be a finite number >= 0, got {value!r}")
    return float(value)


def _full_key(request: RouteRequest, key: int) -> int:
    """The key of the whole prompt's full blocks (the last chained hash covers them all)."""
    return int(request.block_hashes[-1]) if request.num_blocks else key


def _decrement(counts: dict[K, int], key: K) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
