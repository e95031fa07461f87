"""A queue in front of the fleet under a cap of requests per replica: overload protection.

Without a cap (``limits.max_in_flight_per_replica: 0``, the default) a request is routed on
arrival and waits, where it must, in its engine's queue, which nothing bounds. With a cap, a
request that finds every replica serving its model at the cap waits here, first come first
served per model, for at most ``timeouts.queue_s``, behind at most ``limits.max_queued``
others (then a 503 with ``Retry-After``, as sglang-router's ``--max-concurrent-requests``
queue answers), and is routed when a replica frees a slot, on the cache and load of that
moment (late binding, as the Gateway API Inference Extension's flow control holds requests
in front of saturated pods).

What it costs, measured (docs/gateways.md, run 13): a request can no longer wait for the one
replica holding its prefix; it goes to the first with room. On the chat workload, whose
engines queue for KV rather than for batch slots, a cap of 8 cut the cached-token ratio from
60.4% to 47.1% and timed out 41 of 817 requests; under two hot prefixes, spread over every
engine already, it changed nothing. So it bounds what reaches an engine; it is not a routing
improvement. Set it at or above what an engine runs at once (vLLM's ``max_num_seqs``). The
cap counts this gateway's own requests: with N gateway replicas give each 1/N of it. A
disaggregated request's legs wait apart: its prefill for a replica that prefills, its decode
for one that decodes, each in its own line (a full decode pool never holds up prefills).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import Callable

from kvtide.gateway.metrics import GatewayMetrics
from kvtide.gateway.replicas import ReplicaSet, Stage
from kvtide.gateway.status import QUEUE_FULL, QUEUE_TIMEOUT, ApiError
from kvtide.types import ReplicaId

_Line = tuple[str, Stage]
"""Who waits together: a model's requests (or one leg of its disaggregated ones)."""


class _Waiter:
    __slots__ = ("exclude", "future", "line", "woken")

    def __init__(self, line: _Line, exclude: ReplicaId | None) -> None:
        self.line = line
        self.exclude = exclude
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.woken = False
        """Handed a free slot and not yet resumed (then it must use it or pass it on)."""


class Admission:
    """Requests waiting for a replica with room: one line per model, in arrival order (a
    model whose replicas are full never holds up another's)."""

    def __init__(
        self,
        replicas: ReplicaSet,
        metrics: GatewayMetrics,
        now_s: Callable[[], float],
        max_queued: int,
        timeout_s: float,
    ) -> None:
        self.replicas = replicas
        self.metrics = metrics
        self.now_s = now_s
        self.max_queued = max_queued
        self.timeout_s = timeout_s
        self._lines: dict[_Line, deque[_Waiter]] = {}  # no empty line kept: {} is nobody waiting
        self._woken: Counter[_Line] = Counter()  # per line: slots handed out, not yet taken

    def __len__(self) -> int:
        return sum(len(line) for line in self._lines.values())

    async def wait(self, model: str, exclude: ReplicaId | None = None, stage: Stage = None) -> None:
        """Returns once a replica serving ``model`` (other than ``exclude``; for ``stage``, a
        disaggregated request's leg, one of its role) can take a request now, with no await
        between that check and the caller's routing; at once without a cap, or when no such
        replica serves the model at all (routing then says so). Raises a 503 ``ApiError``
        when the queue is full or no slot frees within ``timeout_s``."""
        replicas = self.replicas
        if not replicas.cap:
            return
        key = (model, stage)
        line = self._lines.get(key)
        if not line and not self._woken[key] and replicas.candidates(model, exclude, stage):
            return
        if not replicas.serving(model, exclude, stage):
            return
        waiting = len(self)
        if waiting >= self.max_queued:
            self.metrics.child(self.metrics.rejected, "queue_full").inc()
            raise ApiError(
                QUEUE_FULL,
                f"{waiting} requests already wait for a replica with room (limits.max_queued)",
                retry_after_s=1.0,
            )
        waiter = _Waiter(key, exclude)
        self._enqueue(waiter)
        start = self.now_s()
        gauge = self.metrics.queued
        gauge.inc()
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    await waiter.future
                    self._took(waiter)
                    if replicas.candidates(model, exclude, stage) or not replicas.serving(
                        model, exclude, stage
                    ):
                        return
                    # the slot went elsewhere (a replica shared with another model's waiters,
                    # an ejection meanwhile): back to the head of the line
                    waiter.future = asyncio.get_running_loop().create_future()
                    self._enqueue(waiter, first=True)
        except TimeoutError:
            self.metrics.child(self.metrics.rejected, "queue_timeout").inc()
            raise ApiError(
                QUEUE_TIMEOUT,
                f"no replica serving {model!r} had room within {self.timeout_s:g} s "
                f"(timeouts.queue_s)",
                retry_after_s=1.0,
            ) from None
        finally:
            gauge.dec()
            self.metrics.queue_wait.observe(self.now_s() - start)
            if waiter.woken:  # cancelled (client gone) or timed out as its slot came: pass it on
                self._took(waiter)
                self.release()
            else:  # still in line (its future was cancelled with it): O(line), rare
                self._dequeue(waiter)

    def _enqueue(self, waiter: _Waiter, first: bool = False) -> None:
        line = self._lines.setdefault(waiter.line, deque())
        if first:
            line.appendleft(waiter)
        else:
            line.append(waiter)

    def _dequeue(self, waiter: _Waiter) -> None:
        line = self._lines.get(waiter.line)
        if line is None:
            return
        with contextlib.suppress(ValueError):
            line.remove(waiter)
        if not line:
            del self._lines[waiter.line]

    def _took(self, waiter: _Waiter) -> None:
        waiter.woken = False
        self._woken[waiter.line] -= 1
        if self._woken[waiter.line] <= 0:
            del self._woken[waiter.line]

    def release(self) -> None:
        """Slots may have freed (a request ended, a replica came back, was added, or the cap
        was raised): wakes the first waiters that can be routed now, one per free slot."""
        if not self._lines:
            return
        replicas = self.replicas
        woken = self._woken
        for key, line in list(self._lines.items()):
            model, stage = key
            room: dict[ReplicaId | None, int] = {}  # by the replica a retry excludes
            for waiter in list(line):
                exclude = waiter.exclude
                if exclude not in room:
                    cands = replicas.candidates(model, exclude, stage)
                    room[exclude] = sum(replicas.room(r) for r in cands) - woken[key]
                if room[exclude] <= 0:
                    if exclude is None:
                        break  # a retry behind has fewer candidates: no room for it either
                    continue
                room[exclude] -= 1
                self._dequeue(waiter)
                waiter.woken = True
                woken[key] += 1
                waiter.future.set_result(None)
