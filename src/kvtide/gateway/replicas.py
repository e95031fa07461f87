"""The engines behind the gateway: routing state, health, ejection and slow start.

A replica is routable when it is up (not ejected), not draining, serves the request's model
and, while in slow start after an ejection, has fewer requests in flight than its allowance
(which doubles per success: gradual re-admission, as Envoy's slow start does).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from kvtide.clock import Clock
from kvtide.gateway.config import Failover, ReplicaSpec
from kvtide.routing import ReplicaState
from kvtide.types import ReplicaId

PRIORITY_RETRY_S = 60.0
"""How long a replica that refused a ``priority`` gets none (``Replica.takes_priority``)."""


class Replica:
    __slots__ = (
        "allowance",
        "answered",
        "base_model",
        "consecutive_failures",
        "draining",
        "eject_s",
        "ejected_until_s",
        "failover",
        "health_failures",
        "in_flight",
        "is_down",
        "models",
        "others",
        "others_scraped",
        "others_shared",
        "priority_refused_s",
        "scraped",
        "spec",
        "state",
    )

    def __init__(self, spec: ReplicaSpec, failover: Failover, block_tokens: int) -> None:
        self.spec = spec
        self.failover = failover
        self.state = ReplicaState(spec.replica_id, block_tokens=block_tokens)
        self.models: frozenset[str] = frozenset([spec.model] if spec.model else [])
        self.base_model: str | None = spec.model
        """The model its KV events' blocks without a LoRA adapter belong to: ``spec.model``,
        else the one /v1/models lists with no ``parent`` (adapters name their base there);
        None until read."""
        self.in_flight = 0
        self.consecutive_failures = 0
        self.health_failures = 0  # of those, the ones health checks counted
        self.is_down = False
        self.answered = False
        """It has answered once (its models, a health check or a request). Until then it is
        routable (presumed up until ``eject_after`` failures) but not counted ready: an engine
        still loading must not make a gateway ready that would answer 502."""
        self.ejected_until_s = 0.0
        self.eject_s = failover.eject_s
        self.allowance: int | None = None  # None: no slow-start cap
        self.draining = False
        self.scraped: dict[str, float] = {}
        self.others = 0  # requests from other gateways counted in state.num_requests
        self.others_scraped = 0
        self.others_shared = 0
        self.priority_refused_s: float | None = None  # when it last refused a priority

    @property
    def replica_id(self) -> ReplicaId:
        return self.state.replica_id

    @property
    def url(self) -> str:
        return self.spec.url

    def count_others(self, *, scraped: int | None = None, shared: int | None = None) -> None:
        """Requests other gateways sent here, from the engine's metrics or the shared load
        counters (the larger wins), kept inside ``state.num_requests`` on top of ours."""
        if scraped is not None:
            self.others_scraped = scraped
        if shared is not None:
            self.others_shared = shared
        others = max(self.others_scraped, self.others_shared)
        state = self.state
        state.num_requests = max(state.num_requests + others - self.others, 0)
        self.others = others

    def takes_priority(self, now_s: float) -> bool:
        """Whether to send it a ``priority``: yes unless it refused one (an engine not started
        to schedule by priority) less than ``PRIORITY_RETRY_S`` ago; then it is asked again,
        since an engine restarted with the policy takes them."""
        refused = self.priority_refused_s
        return refused is None or now_s - refused >= PRIORITY_RETRY_S

    @property
    def is_up(self) -> bool:
        """Not ejected and not draining: it takes requests, now or once a slot frees."""
        return not (self.is_down or self.draining)

    def can_take(self) -> bool:
        """Up, and under its slow-start allowance (the gateway's cap is the set's)."""
        return self.is_up and (self.allowance is None or self.in_flight < self.allowance)

    def succeeded(self) -> None:
        self.consecutive_failures = self.health_failures = 0
        self.answered = True
        if self.allowance is not None:
            self.allowance *= 2
            if self.allowance >= 64:
                self.allowance = None
                self.eject_s = self.failover.eject_s

    def failed(self, now_s: float) -> bool:
        """Counts a failure; returns True when it ejects the replica."""
        self.consecutive_failures += 1
        if self.is_down or self.consecutive_failures < self.failover.eject_after:
            return False
        self.eject(now_s)
        return True

    def health_failed(self, now_s: float) -> bool:
        """A failed health check: a failure like a request's; True when it ejects."""
        self.health_failures += 1
        return self.failed(now_s)

    def health_passed(self) -> None:
        """A passing health check clears the failures health checks counted, not the
        requests': an engine that answers /health but fails every completion is ejected
        after ``eject_after`` of them, however many checks pass between (each check cleared
        them all, so at moderate traffic it never was)."""
        self.consecutive_failures = max(self.consecutive_failures - self.health_failures, 0)
        self.health_failures = 0
        self.answered = True

    def eject(self, now_s: float) -> None:
        self.is_down = True
        self.state.healthy = False
        self.ejected_until_s = now_s + self.eject_s
        self.eject_s = min(self.eject_s * 2, self.failover.max_eject_s)

    def readmit(self) -> None:
        """Back after an ejection, in slow start."""
        self.is_down = False
        self.state.healthy = not self.draining
        self.consecutive_failures = self.health_failures = 0
        self.allowance = self.failover.slow_start_requests


class ReplicaSet:
    def __init__(self, failover: Failover, block_tokens: int, clock: Clock, cap: int = 0) -> None:
        self.failover = failover
        self.block_tokens = block_tokens
        self.clock = clock
        self.by_id: dict[ReplicaId, Replica] = {}
        self.cap = cap
        """Requests in flight through this gateway per replica (``limits.
        max_in_flight_per_replica``); 0: no cap. A replica at the cap takes no more until
        one ends (``gateway.admission`` holds the rest)."""
        self._turn = 0

    def __iter__(self) -> Iterator[Replica]:
        return iter(list(self.by_id.values()))

    def __len__(self) -> int:
        return len(self.by_id)

    def add(self, spec: ReplicaSpec) -> Replica:
        replica = Replica(spec, self.failover, self.block_tokens)
        self.by_id[replica.replica_id] = replica
        return replica

    def get(self, replica_id: str) -> Replica | None:
        return self.by_id.get(ReplicaId(replica_id))

    def remove(self, replica_id: ReplicaId) -> Replica | None:
        return self.by_id.pop(replica_id, None)

    def models(self) -> list[str]:
        out: set[str] = set()
        for r in self.by_id.values():
            out |= r.models
        return sorted(out)

    def candidates(
        self, model: str, exclude: ReplicaId | None = None, stage: Stage = None
    ) -> list[Replica]:
        """The replicas serving ``model`` that can take a request now (for one ``stage`` of
        a disaggregated request: the replicas whose ``role`` is not the other stage's)."""
        cap = self.cap
        other = _OTHER_STAGE[stage]
        return [
            r
            for r in self.by_id.values()
            if model in r.models
            and r.can_take()
            and r.replica_id != exclude
            and (not cap or r.in_flight < cap)
            and r.spec.role != other
        ]

    def disaggregated(self, model: str) -> bool:
        """Whether ``model``'s completions are prefilled and decoded apart: a replica serving
        it has a ``role`` (``gateway.config.ROLES``)."""
        return any(model in r.models and r.spec.role != "both" for r in self.by_id.values())

    def home(
        self, replica_id: ReplicaId | None, model: str, exclude: ReplicaId | None = None
    ) -> Replica | None:
        """``replica_id``'s replica where it serves ``model`` and is up, under no cap: the
        one that can answer a request continuing what it stored (``ResponseHomes``)."""
        if replica_id is None or replica_id == exclude:
            return None
        replica = self.by_id.get(replica_id)
        if replica is None or model not in replica.models or not replica.is_up:
            return None
        return replica

    def least_loaded(
        self, model: str, exclude: ReplicaId | None = None, stage: Stage = None
    ) -> Replica | None:
        """The candidate for ``model`` with the fewest requests in flight (this gateway's and,
        as last scraped or shared, the others'), ties taken in turn; for the requests that
        prefix routing has no part in (``Proxy.pass_through``) and a disaggregated request's
        decode (the simulator's hand-off rule: ``sim.fleet``)."""
        cands = self.candidates(model, exclude, stage)
        if not cands:
            return None
        self._turn += 1
        k = self._turn % len(cands)
        return min(cands[k:] + cands[:k], key=_load)

    def serving(self, model: str, exclude: ReplicaId | None = None, stage: Stage = None) -> bool:
        """Whether a replica serves ``model`` (for ``stage``: in that role) and is up (full or
        not)."""
        other = _OTHER_STAGE[stage]
        return any(
            model in r.models and r.is_up and r.replica_id != exclude and r.spec.role != other
            for r in self.by_id.values()
        )

    def room(self, replica: Replica) -> int:
        """More requests ``replica`` can take now, under the cap and its slow start."""
        limits = [n for n in (self.cap, replica.allowance) if n]
        if not limits:
            return 1 << 30
        return max(min(limits) - replica.in_flight, 0)

    def serves(self, model: str) -> bool:
        return any(model in r.models for r in self.by_id.values())


Stage = Literal["prefill", "decode"] | None
"""Which part of a disaggregated request a replica is chosen for; None: the whole of one."""

_OTHER_STAGE: dict[Stage, str | None] = {None: None, "prefill": "decode", "decode": "prefill"}


def _load(replica: Replica) -> int:
    return replica.in_flight + replica.others
