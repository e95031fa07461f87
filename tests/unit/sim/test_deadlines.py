"""``cost:deadline_k=K`` in the simulator: every request reaches its engine with the deadline
a gateway would send as vLLM's ``priority``, and engines scheduling by priority admit the
requests whose prefix they hold before it is pushed out. Without deadlines the priority
policy is FCFS (every priority 0), and engines that would ignore the deadlines are refused."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from tests.unit.sim.test_queue_evictions import SCARCE

from kvtide.core.hashing import BlockHashes
from kvtide.engine.driver import EngineDriver
from kvtide.engine.scheduler import EngineConfig
from kvtide.errors import ConfigError
from kvtide.sim.fleet import Fleet
from kvtide.sim.scenario import Scenario, run
from kvtide.types import Request

BY_PRIORITY = dataclasses.replace(SCARCE, engine=EngineConfig(scheduling_policy="priority"))


def test_priority_scheduling_without_deadlines_is_fcfs() -> None:
    fcfs, by_priority = run(SCARCE), run(BY_PRIORITY)
    assert by_priority.summary == fcfs.summary
    assert by_priority.diagnostics == fcfs.diagnostics


def test_deadlines_keep_predicted_prefixes_from_eviction_in_queues() -> None:
    plain = run(BY_PRIORITY)
    sent: list[tuple[float, int]] = []  # (arrival, priority) of each request an engine got

    class Spy:
        """The replica's driver, recording the priority each request is added with."""

        def __init__(self, driver: EngineDriver) -> None:
            self.driver = driver

        def add(self, request: Request, hashes: BlockHashes, now: float, **kw: Any) -> None:
            sent.append((now, kw["priority"]))
            self.driver.add(request, hashes, now, **kw)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.driver, name)

    def record(fleet: Fleet, loop: object, model: object) -> None:
        for replica in fleet.replicas:
            replica.driver = Spy(replica.driver)  # type: ignore[assignment]

    deadlines = run(BY_PRIORITY.with_(router="cost:deadline_k=3"), observe=record)
    assert deadlines.summary.requests == plain.summary.requests
    assert (
        deadlines.diagnostics["evicted_queued_tokens"]
        < 0.9 * plain.diagnostics["evicted_queued_tokens"]
    )
    assert deadlines.summary.hit_ratio > plain.summary.hit_ratio
    # each priority is the deadline in ms on the simulator's clock: at or after the arrival,
    # and not in arrival order (a later request with less to prefill goes first)
    assert len(sent) == deadlines.summary.requests
    assert all(round(now * 1000) <= priority for now, priority in sent)
    priorities = [priority for _, priority in sorted(sent)]
    assert priorities != sorted(priorities)


def test_deadlines_on_fcfs_engines_are_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="scheduling-policy priority"):
        SCARCE.with_(router="cost:deadline_k=3")
    Scenario(router="cost:deadline_k=0")  # no deadlines: nothing for the engines to honour
