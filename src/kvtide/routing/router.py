"""Router: one policy over a replica set, with the bookkeeping every caller needs.

The simulator and the gateway drive the same object: ``route`` at arrival, ``prefill_done``
at the first token (with the engine's reported cached tokens, for regret, or ``report`` when
they come later, in a stream's last chunk), ``complete`` at the end. Policies and
``ReplicaState`` can also be driven directly; this is the short path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from kvtide.core.hashing import BlockHashes
from kvtide.errors import UsageError
from kvtide.routing.consistency import IndexHealth
from kvtide.routing.decision import RouteDecision
from kvtide.routing.index import RemovalFeed
from kvtide.routing.pace import PrefillPace
from kvtide.routing.policies import BasePolicy, RoutingPolicy
from kvtide.routing.replica import ReplicaState
from kvtide.routing.request import RouteRequest
from kvtide.routing.watch import EvictionWatch
from kvtide.types import ReplicaId


class Router:
    """``health`` defaults to the policy's context's, so regret reports reach the policy.
    ``route`` refuses (``UsageError``) a request hashed at another block size than the
    policy's ``RoutingContext.block_tokens``: its hashes could never match the index.
    With an index that reports its removals (``GlobalPrefixIndex``), each predicted hit is
    watched until the first token, so that ``IndexHealth`` does not blame the index for a
    prefix the engine evicted while the request waited (``routing.watch``). First tokens of
    requests sent where nothing of this router's was queued teach the context's
    ``PrefillPace`` how the engines' prefill compares with the TTFT model."""

    def __init__(
        self,
        policy: RoutingPolicy,
        replicas: Iterable[ReplicaState],
        health: IndexHealth | None = None,
    ) -> None:
        self.policy = policy
        if health is None:
            health = policy.ctx.health if isinstance(policy, BasePolicy) else IndexHealth()
        self.health = health
        self.replicas: dict[ReplicaId, ReplicaState] = {r.replica_id: r for r in replicas}
        self._list = list(self.replicas.values())
        # The block size every request's hashes must be at: the index and the engines use it.
        self.block_tokens = policy.ctx.block_tokens if isinstance(policy, BasePolicy) else None
        self.num_in_flight = 0
        """Requests routed and not yet completed or cancelled."""
        # After set_policy: policies replaced while requests they routed were in flight
        # (oldest first, each with how many are left), and the ids routed since the swap.
        self._retired: list[tuple[RoutingPolicy, int]] = []
        self._fresh: set[object] = set()
        index = policy.ctx.index if isinstance(policy, BasePolicy) else None
        self.watch: EvictionWatch | None = None
        if isinstance(index, RemovalFeed):
            self.watch = EvictionWatch()
            index.subscribe_removals(self.watch.removed)
        # requests whose predicted prefix was evicted before their first token, reported later
        self._evicted_queued: set[int] = set()
        # the engines' pace against the TTFT model: requests sent to a replica with no prefill
        # queued, (dispatch time, predicted prefill s) until their first token
        ctx = policy.ctx if isinstance(policy, BasePolicy) else None
        self.pace: PrefillPace | None = ctx.pace if ctx is not None else None
        self._clock = ctx.clock if ctx is not None else None
        self._paced: dict[int, tuple[float, float]] = {}

    def set_policy(self, policy: RoutingPolicy) -> None:
        """Routes with ``policy`` from the next request on, over the same replicas (and the
        same index and health, which live in the context, not the policy). Requests already
        in flight complete with the policy that routed them, so its in-flight bookkeeping
        stays whole; it is dropped once they are all done. (After two swaps in quick
        succession the retired policies' completions are told to the oldest first.)"""
        block_tokens = policy.ctx.block_tokens if isinstance(policy, BasePolicy) else None
        if block_tokens != self.block_tokens:
            raise UsageError(
                f"the new policy works at {block_tokens}-token blocks, the router at "
                f"{self.block_tokens}: keep RoutingContext.block_tokens"
            )
        left = self.num_in_flight - sum(n for _, n in self._retired)
        if left > 0:
            self._retired.append((self.policy, left))
        self._fresh = set()
        self.policy = policy

    def add_replica(self, replica: ReplicaState) -> None:
        self.replicas[replica.replica_id] = replica
        self._list = list(self.replicas.values())

    def remove_replica(self, replica: ReplicaId) -> None:
        self.replicas.pop(replica, None)
        self._list = list(self.replicas.values())

    def route(
        self, request: RouteRequest, among: Sequence[ReplicaState] | None = None
    ) -> RouteDecision:
        """Chooses a replica and books the request there (policy and replica state).
        ``among`` narrows the choice (the gateway: replicas serving the request's model,
        outside slow start's cap, not tried already); default: every replica."""
        if self.block_tokens is not None and request.block_tokens != self.block_tokens:
            raise UsageError(
                f"request {request.request_id!r} is hashed at {request.block_tokens}-token "
                f"blocks, but this router's policy works at {self.block_tokens} "
                "(RoutingContext.block_tokens): hash it at the engines' block size"
            )
        decision = self.policy.choose(request, self._list if among is None else among)
        self.policy.on_dispatch(request, decision)
        self.replicas[decision.replica].dispatch(_prefill_tokens(request, decision))
        self.num_in_flight += 1
        watch = self.watch
        if watch is not None and decision.cached_blocks and request.num_blocks:
            last = min(decision.cached_blocks, request.num_blocks) - 1
            watch.watch(id(request), decision.replica, request.block_hashes[last])
        if self._retired:
            self._fresh.add(id(request))
        if decision.ttft_s and not decision.queue_tokens and self._clock is not None:
            # nothing of ours queued there: the prediction is the request's own prefill
            self._paced[id(request)] = (self._clock.now(), decision.ttft_s)
        return decision

    @property
    def cold_head_blocks(self) -> int | None:
        """The leading blocks the policy reads of a prompt whose held prefix ends within them
        (``held_blocks``); None where it may read them all (``BasePolicy.cold_head_blocks``)."""
        policy = self.policy
        return policy.cold_head_blocks if isinstance(policy, BasePolicy) else None

    def held_blocks(self, hashes: BlockHashes) -> int:
        """The longest prefix of ``hashes`` a replica holds or is expected to hold."""
        policy = self.policy
        return policy.held_blocks(hashes) if isinstance(policy, BasePolicy) else len(hashes)

    def blocks_known(self, request: RouteRequest, hashes: Callable[[], BlockHashes]) -> None:
        """``request`` was routed on its first blocks (``cold_head_blocks``); ``hashes()``
        gives all of them, for a follow-up that shares the first: the policy's provisional
        view of the replica it chose grows to them, as if it had had them when it routed
        (``hashes`` is called only if the policy still holds entries for ``request``)."""
        policy = self.policy
        if isinstance(policy, BasePolicy):
            policy.on_blocks_known(request, hashes)

    def _policy_of(self, request: RouteRequest) -> RoutingPolicy:
        """The policy that routed ``request``, which is ending now."""
        self.num_in_flight = max(self.num_in_flight - 1, 0)
        retired = self._retired
        if not retired:
            return self.policy
        key = id(request)
        if key in self._fresh:
            self._fresh.discard(key)
            return self.policy
        policy, left = retired[0]
        if left > 1:
            retired[0] = (policy, left - 1)
        else:
            retired.pop(0)
            if not retired:
                self._fresh = set()
        return policy

    def prefill_done(
        self,
        request: RouteRequest,
        decision: RouteDecision,
        reported_cached_tokens: int | None = None,
        *,
        on_time: bool = True,
    ) -> None:
        """The first token came back; ``reported_cached_tokens`` is what the engine reused
        (OpenAI ``usage.prompt_tokens_details.cached_tokens``) when known, else ``report``
        it when it comes (a stream's last chunk). ``on_time=False``: told later than the
        first token (a whole non-streamed answer, a stream with no output chunk), so its
        time says nothing of the engine's prefill pace."""
        r = self.replicas.get(decision.replica)
        if r is not None:
            r.prefill_done(_prefill_tokens(request, decision), request.prompt_tokens)
        paced = self._paced.pop(id(request), None)
        if on_time and paced is not None and self.pace is not None and self._clock is not None:
            self.pace.observe(paced[1], self._clock.now() - paced[0])
        # the request holds its blocks from here: a later eviction is not the queue's doing
        evicted = self.watch.settle(id(request)) if self.watch is not None else False
        if reported_cached_tokens is not None:
            self.health.report(
                decision.replica,
                decision.cached_tokens,
                reported_cached_tokens,
                evicted_queued=evicted,
            )
        elif evicted:
            self._evicted_queued.add(id(request))

    def report(
        self, request: RouteRequest, decision: RouteDecision, reported_cached_tokens: int
    ) -> None:
        """What the engine reused, learned after ``prefill_done`` (a stream's ``usage``)."""
        evicted = self._settle(request)
        self.health.report(
            decision.replica,
            decision.cached_tokens,
            reported_cached_tokens,
            evicted_queued=evicted,
        )

    def _settle(self, request: RouteRequest) -> bool:
        """Whether the request's predicted prefix was evicted before its first token; stops
        tracking it."""
        key = id(request)
        self._paced.pop(key, None)
        evicted = self.watch.settle(key) if self.watch is not None else False
        if key in self._evicted_queued:
            self._evicted_queued.discard(key)
            return True
        return evicted

    def complete(self, request: RouteRequest, decision: RouteDecision, output_tokens: int) -> None:
        r = self.replicas.get(decision.replica)
        if r is not None:
            r.complete(request.prompt_tokens + output_tokens)
        self._settle(request)
        self._policy_of(request).on_complete(request, decision.replica)

    def cancel(self, request: RouteRequest, decision: RouteDecision) -> None:
        """The request ended before its first token (error, abort)."""
        r = self.replicas.get(decision.replica)
        if r is not None:
            r.cancel(_prefill_tokens(request, decision))
        self._settle(request)
        self._policy_of(request).on_complete(request, decision.replica)


def _prefill_tokens(request: RouteRequest, decision: RouteDecision) -> int:
    return max(request.prompt_tokens - decision.cached_tokens, 0)
