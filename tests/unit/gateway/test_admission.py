"""gateway.admission in-process: first come first served, one wake per free slot, a slot
handed to a waiter that is cancelled before it runs goes to the next one, and nothing waits
without a cap or without a replica serving the model."""

from __future__ import annotations

import asyncio

import pytest

from kvtide.clock import WallClock
from kvtide.gateway.admission import Admission
from kvtide.gateway.config import Failover, ReplicaSpec
from kvtide.gateway.metrics import GatewayMetrics
from kvtide.gateway.replicas import Replica, ReplicaSet
from kvtide.gateway.status import ApiError


def _fleet(cap: int, n: int = 1) -> tuple[ReplicaSet, list[Replica], Admission]:
    replicas = ReplicaSet(Failover(), 16, WallClock(), cap=cap)
    added = [replicas.add(ReplicaSpec.parse(f"http://127.0.0.1:{9000 + i}=m")) for i in range(n)]
    admission = Admission(replicas, GatewayMetrics(), WallClock().now, 64, 5.0)
    return replicas, added, admission


async def _dispatch(
    admission: Admission, replicas: ReplicaSet, name: str, order: list[str]
) -> None:
    """A request: wait for room, then take a slot on the first candidate, as the proxy does."""
    await admission.wait("m")
    (chosen, *_) = replicas.candidates("m")
    chosen.in_flight += 1
    order.append(name)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _end(admission: Admission, replica: Replica) -> None:
    replica.in_flight -= 1
    admission.release()


def test_waiters_get_freed_slots_in_arrival_order() -> None:
    async def scenario() -> list[str]:
        replicas, (r,), admission = _fleet(cap=2)
        r.in_flight = 2
        order: list[str] = []
        tasks = []
        for name in "abcde":
            tasks.append(asyncio.create_task(_dispatch(admission, replicas, name, order)))
            await _settle()
        assert len(admission) == 5 and order == []
        _end(admission, r)
        await _settle()
        assert order == ["a"]
        _end(admission, r)
        _end(admission, r)  # two slots at once: two wakes, in order
        await _settle()
        assert order == ["a", "b", "c"] and r.in_flight == 2
        _end(admission, r)
        _end(admission, r)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["a", "b", "c", "d", "e"]


def test_a_slot_given_to_a_waiter_cancelled_before_it_ran_goes_to_the_next() -> None:
    async def scenario() -> list[str]:
        replicas, (r,), admission = _fleet(cap=1)
        r.in_flight = 1
        order: list[str] = []
        a = asyncio.create_task(_dispatch(admission, replicas, "a", order))
        await _settle()
        b = asyncio.create_task(_dispatch(admission, replicas, "b", order))
        await _settle()
        _end(admission, r)  # a is handed the slot ...
        a.cancel()  # ... and its client leaves before it runs
        await _settle()
        await b
        assert a.cancelled()
        return order

    assert asyncio.run(scenario()) == ["b"]


def test_a_new_arrival_waits_behind_the_queue_even_beside_a_free_slot() -> None:
    async def scenario() -> list[str]:
        replicas, (r,), admission = _fleet(cap=1)
        r.in_flight = 1
        order: list[str] = []
        first = asyncio.create_task(_dispatch(admission, replicas, "first", order))
        await _settle()

        async def arrive_as_the_slot_frees() -> None:
            _end(admission, r)  # the slot is promised to `first`, which has not run yet ...
            await _dispatch(admission, replicas, "late", order)  # ... when this one arrives

        late = asyncio.create_task(arrive_as_the_slot_frees())
        await _settle()
        assert order == ["first"]
        _end(admission, r)
        await asyncio.gather(first, late)
        return order

    assert asyncio.run(scenario()) == ["first", "late"]


def test_a_replica_with_room_elsewhere_takes_the_waiter() -> None:
    async def scenario() -> Replica:
        replicas, (r0, r1), admission = _fleet(cap=1, n=2)
        r0.in_flight = r1.in_flight = 1
        order: list[str] = []
        task = asyncio.create_task(_dispatch(admission, replicas, "x", order))
        await _settle()
        _end(admission, r1)
        await task
        return r1

    assert asyncio.run(scenario()).in_flight == 1


def test_no_cap_or_no_replica_never_waits() -> None:
    async def scenario() -> None:
        replicas, (r,), admission = _fleet(cap=0)
        r.in_flight = 10_000
        await asyncio.wait_for(admission.wait("m"), 0.1)  # no cap: at once
        replicas.cap = 1
        r.is_down = True
        await asyncio.wait_for(admission.wait("m"), 0.1)  # none up: routing will say so
        await asyncio.wait_for(admission.wait("other"), 0.1)
        assert len(admission) == 0

    asyncio.run(scenario())


def test_a_full_queue_refuses_at_once() -> None:
    async def scenario() -> None:
        _, (r,), admission = _fleet(cap=1)
        admission.max_queued = 1
        r.in_flight = 1
        held = asyncio.create_task(admission.wait("m"))
        await _settle()
        with pytest.raises(ApiError) as caught:
            await admission.wait("m")
        assert caught.value.status.code == "queue_full"
        held.cancel()
        await _settle()
        assert len(admission) == 0

    asyncio.run(scenario())


def test_a_model_with_room_is_not_held_behind_another_models_line() -> None:
    async def scenario() -> None:
        replicas = ReplicaSet(Failover(), 16, WallClock(), cap=1)
        a = replicas.add(ReplicaSpec.parse("http://127.0.0.1:9000=a"))
        replicas.add(ReplicaSpec.parse("http://127.0.0.1:9001=b"))
        admission = Admission(replicas, GatewayMetrics(), WallClock().now, 64, 5.0)
        a.in_flight = 1
        held = asyncio.create_task(admission.wait("a"))
        await _settle()
        assert len(admission) == 1
        await asyncio.wait_for(admission.wait("b"), 0.1)  # b's replica is free: at once
        assert len(admission) == 1
        _end(admission, a)
        await asyncio.wait_for(held, 1.0)
        assert len(admission) == 0

    asyncio.run(scenario())


def test_a_disaggregated_requests_legs_wait_for_their_own_roles() -> None:
    """Under a cap, a decode leg waits for a decode replica and a prefill leg for a prefill
    one, each in its own line: a full decode pool holds up no prefill, and a free prefill
    replica does not let a decode leg through to find no decoder (a 503)."""

    async def scenario() -> None:
        replicas = ReplicaSet(Failover(), 16, WallClock(), cap=1)
        pre = replicas.add(ReplicaSpec.parse("http://127.0.0.1:9000=m,role=prefill"))
        dec = replicas.add(ReplicaSpec.parse("http://127.0.0.1:9001=m,role=decode"))
        admission = Admission(replicas, GatewayMetrics(), WallClock().now, 64, 5.0)
        dec.in_flight = 1  # the decode pool is full, the prefill replica free
        await asyncio.wait_for(admission.wait("m", stage="prefill"), 1.0)  # at once
        decode = asyncio.create_task(admission.wait("m", stage="decode"))
        await _settle()
        assert not decode.done() and len(admission) == 1
        pre.in_flight = 1  # a prefill leg runs; a second one waits in its own line
        prefill = asyncio.create_task(admission.wait("m", stage="prefill"))
        await _settle()
        assert len(admission) == 2
        _end(admission, pre)  # the prefill replica frees: only the prefill leg goes
        await _settle()
        assert prefill.done() and not decode.done()
        _end(admission, dec)
        await _settle()
        assert decode.done() and len(admission) == 0
        assert replicas.least_loaded("m", stage="decode") is dec

    asyncio.run(scenario())
