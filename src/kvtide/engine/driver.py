"""The drive loop of one engine: arrivals, aborts and wake-ups in, per-request step outputs out.

The simulator's event loop (on a ManualClock) and the engine server's asyncio task (on a
WallClock) both drive a ``Scheduler`` through this class, so they share one model of time:

    driver = EngineDriver(scheduler)
    driver.add(request, hashes, now)        # a request arrived
    driver.abort(request_id, now)           # its client went away -> bool
    outputs = driver.on_wake(now)           # apply what is due by now -> list[StepOutput]
    driver.next_wake_s                      # call on_wake again then (None: idle)

The driver keeps the model's own timeline: the iteration after one that ended at ``t`` starts
at ``t`` even if ``on_wake`` comes late (a timer that wakes a few ms late does not make the
engine slower), but never before the arrival of a request it admits. Calling ``on_wake`` early
does nothing but report tokens already due. A new arrival or an abort cuts a fused decode run
short at the step boundary after ``now``, where a real engine would notice it; so does a
request's remote KV arriving (a disaggregated decode's load), and an engine with nothing to run
but such a load sleeps until it has arrived.

With ``stream_tokens`` (the default, for servers) every generated token is one ``StepOutput``
at its own time, inside fused decode runs too, and ``next_wake_s`` is the next token's time.
Without it (the simulator) only first tokens and finishes are reported and ``next_wake_s`` is
the end of the planned iteration or run, so a decode run stays one event.

``on_wake(now, defer_plan=True)`` (the server) returns an iteration's outputs before planning
the next iteration, so that a wall-clock caller can send its tokens first; the plan, at the same
start time on the same state, is made by the next call into the driver, whichever it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtide.core.events import KVEvent
from kvtide.core.hashing import BlockHashes
from kvtide.engine.scheduler import Batch, RequestRecord, Scheduler, Sequence
from kvtide.types import Request


@dataclass(frozen=True, slots=True)
class StepOutput:
    """One request's progress at one engine step.

    ``num_generated`` counts the request's output tokens once this step's token is out (the
    token's index is ``num_generated - 1``). ``cached_tokens`` is set on the first token only:
    the prompt tokens found cached, as vLLM reports them in
    ``usage.prompt_tokens_details.cached_tokens`` (the local hit in whole blocks, at most
    ``prompt - 1`` tokens, reloaded blocks included, plus the tokens fetched after it: a
    remote prefill's count to the whole prompt). ``fetched_tokens`` (first token only) is the
    fetched part of it. ``hit_tokens`` (first token only) is the engine's own hit count: every
    cached full block, the recomputed last one and host hits that were recomputed included.
    ``finish_reason`` is ``"length"`` when the request reached its output limit (its
    ``record`` is set then), ``"abort"`` when it was aborted, else ``None``.
    """

    request_id: str
    num_generated: int
    time_s: float
    is_first_token: bool = False
    cached_tokens: int = 0
    hit_tokens: int = 0
    fetched_tokens: int = 0
    finish_reason: str | None = None
    record: RequestRecord | None = None


class EngineDriver:
    """Runs ``scheduler`` iteration by iteration on the caller's clock readings."""

    __slots__ = (
        "_added_s",
        "_batch",
        "_emitted",
        "_outbox",
        "_plan_s",
        "_steps",
        "scheduler",
        "stream",
    )

    def __init__(self, scheduler: Scheduler, *, stream_tokens: bool = True) -> None:
        self.scheduler = scheduler
        self.stream = stream_tokens
        self._batch: Batch | None = None
        self._steps = 0  # steps of ``_batch`` that will have run when it is applied
        self._emitted = 0  # steps of ``_batch`` whose tokens were already reported (streaming)
        self._added_s = float("-inf")  # latest arrival no plan has seen yet
        self._outbox: list[StepOutput] = []
        self._plan_s: float | None = None  # the next iteration's start, not planned yet

    # --- input ----------------------------------------------------------------------------

    def add(
        self,
        request: Request,
        hashes: BlockHashes,
        now: float,
        *,
        arrival_s: float | None = None,
        first_token_s: float | None = None,
        priority: int = 0,
        remote_tokens: int = 0,
        hold_kv: bool = False,
    ) -> None:
        """Queues ``request`` (its full prompt blocks hash to ``hashes``) arriving at ``now``.
        ``arrival_s`` overrides the arrival recorded (a request re-routed after a failure);
        ``first_token_s``: prefilled elsewhere; ``priority``: its place among the waiting
        under the ``"priority"`` policy; ``remote_tokens``: prompt tokens whose KV another
        engine holds, to be loaded; ``hold_kv``: its blocks kept past its end until
        ``release_held`` (see ``Scheduler.add``). Raises ``CapacityError`` if it can never
        fit."""
        self._plan()  # the iteration before the arrival is planned without it
        self.scheduler.add(
            request,
            hashes,
            arrival_s=now if arrival_s is None else arrival_s,
            first_token_s=first_token_s,
            priority=priority,
            remote_tokens=remote_tokens,
            hold_kv=hold_kv,
        )
        self._added_s = now
        self._notice(now)

    def abort(self, request_id: str, now: float) -> bool:
        """Drops request ``request_id`` (waiting or running, mid-prefill or mid-decode) and
        releases its KV; the next ``on_wake`` reports it with ``finish_reason="abort"``.
        ``False`` if the engine does not hold it (finished, never added)."""
        self._plan()
        batch = self._batch
        done = 0
        if batch is not None and batch.num_steps > 1:
            # The run's steps done by now produced their tokens (streamed, if streaming): they
            # count, though the run is applied only at its end, which no longer carries it.
            done = self._emitted if self.stream else self._steps_done(batch, now)
        seq = self.scheduler.abort(request_id, run_steps_done=done)
        if seq is None:
            return False
        self._outbox.append(StepOutput(request_id, seq.num_generated, now, finish_reason="abort"))
        self._notice(now)
        return True

    def release_held(self, request_id: str, now: float) -> bool:
        """Frees a finished ``hold_kv`` request's blocks at ``now`` (the next plan may admit
        what waited for them); ``False`` if none is held by that id."""
        self._plan()
        if not self.scheduler.release_held(request_id):
            return False
        self._notice(now)
        return True

    def _steps_done(self, batch: Batch, now: float) -> int:
        """Steps of the run in flight that ended by ``now``."""
        steps = min(batch.steps_by(now), self._steps)
        return steps if batch.end_s(steps) <= now else steps - 1

    def _notice(self, now: float) -> None:
        """Something changed at ``now``: start an idle engine, or end a fused decode run at
        the step boundary after ``now`` so that the next plan sees the change."""
        batch = self._batch
        if batch is None:
            self._start(now)
            return
        if batch.num_steps > 1 and self._steps > 1:
            steps = batch.steps_by(now)
            if steps < self._steps:
                self._steps = steps

    # --- output ---------------------------------------------------------------------------

    @property
    def next_wake_s(self) -> float | None:
        """When ``on_wake`` must be called next; ``None`` while there is nothing in flight."""
        self._plan()
        batch = self._batch
        if batch is None:
            return self.scheduler.next_ready_s
        if self.stream and self._emitted + 1 < self._steps:
            return batch.end_s(self._emitted + 1)
        return batch.end_s(self._steps)

    def on_wake(self, now: float, *, defer_plan: bool = False) -> list[StepOutput]:
        """Applies every iteration that has ended by ``now``, plans the next ones, and returns
        the step outputs due by ``now``, in the order the driver learned of them (aborts
        since the last call included). With ``defer_plan`` it returns after the first
        iteration that yields outputs, its successor not planned yet (``next_wake_s`` plans
        it, and may be ``now`` or earlier: call again)."""
        self._plan()
        while True:
            batch = self._batch
            if batch is None:
                # idle but for remote KV on its way: the engine resumes when it has arrived
                ready_s = self.scheduler.next_ready_s
                if ready_s is None or ready_s > now:
                    break
                self._start(ready_s if ready_s >= self._added_s else self._added_s)
                continue
            end_s = batch.end_s(self._steps)
            if self.stream and self._emitted + 1 < self._steps:
                self._stream_run(batch, min(now, end_s))
            if end_s > now:
                break
            self._apply(batch, end_s)
            start_s = end_s if end_s >= self._added_s else self._added_s
            if defer_plan and self._outbox:
                self._plan_s = start_s
                break
            self._start(start_s)
        out, self._outbox = self._outbox, []
        return out

    def _plan(self) -> None:
        if self._plan_s is not None:
            start_s, self._plan_s = self._plan_s, None
            self._start(start_s)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def take_events(self) -> list[KVEvent]:
        """The KV events of the iterations applied since the last call."""
        return self.scheduler.take_events()

    def drain(self) -> list[tuple[Request, float]]:
        """Drops every request (the replica failed) and the iteration in flight; returns the
        requests with their arrival times, oldest first."""
        self._batch = None
        self._plan_s = None
        self._steps = self._emitted = 0
        self._outbox = []
        return [(seq.request, seq.arrival_s) for seq in self.scheduler.drain()]

    # --- the loop -------------------------------------------------------------------------

    def _start(self, start_s: float) -> None:
        scheduler = self.scheduler
        batch = scheduler.schedule(start_s)
        self._batch = batch
        self._steps = batch.num_steps if batch is not None else 0
        self._emitted = 0
        ready_s = scheduler.next_ready_s
        if batch is not None and ready_s is not None and ready_s > start_s and self._steps > 1:
            # remote KV arriving mid-run ends the run at the step boundary after it, as an
            # arrival would: the parked request joins the next iteration
            self._steps = min(self._steps, batch.steps_by(ready_s))

    def _stream_run(self, batch: Batch, until_s: float) -> None:
        """Reports the decode tokens of the steps before the run's last that end by
        ``until_s`` (the last step's are reported when the run is applied)."""
        k = self._emitted + 1
        last = self._steps
        out = self._outbox
        while k < last:
            time_s = batch.end_s(k)
            if time_s > until_s:
                break
            for seq in batch.decode:
                out.append(StepOutput(seq.request.request_id, seq.num_generated + k, time_s))
            k += 1
        self._emitted = k - 1

    def _apply(self, batch: Batch, end_s: float) -> None:
        records = self.scheduler.complete(batch, self._steps)
        self._batch = None
        by_id = {r.request_id: r for r in records} if records else None
        out = self._outbox
        stream = self.stream
        for seq, _ in batch.prefill:
            if seq.is_prefilling:
                continue  # a chunk before the last yields no token
            first = seq.num_generated == 1
            record = by_id.get(seq.request.request_id) if by_id is not None else None
            if first or record is not None or stream:
                out.append(self._output(seq, end_s, first, record))
        if stream and self._emitted < self._steps:  # else a cut run's last step is out
            for seq in batch.decode:
                record = by_id.get(seq.request.request_id) if by_id is not None else None
                out.append(self._output(seq, end_s, False, record))
        elif by_id is not None:
            for seq in batch.decode:
                record = by_id.get(seq.request.request_id)
                if record is not None:
                    out.append(self._output(seq, end_s, False, record))

    @staticmethod
    def _output(
        seq: Sequence, time_s: float, first: bool, record: RequestRecord | None
    ) -> StepOutput:
        return StepOutput(
            seq.request.request_id,
            seq.num_generated,
            time_s,
            is_first_token=first,
            cached_tokens=seq.cached_tokens if first else 0,
            hit_tokens=max(seq.hit_tokens, 0) if first else 0,
            fetched_tokens=seq.fetched_tokens if first else 0,
            finish_reason="length" if record is not None else None,
            record=record,
        )
