"""One engine replica driven by a Clock: continuous batching over a core KVCache, timed by the
cost model. The simulator runs it on a ManualClock; an emulated engine server on a WallClock."""

from kvtide.engine.driver import EngineDriver, StepOutput
from kvtide.engine.scheduler import Batch, EngineConfig, RequestRecord, Scheduler
from kvtide.engine.timing import DecodeRun, IterationTimer, StepCost

__all__ = [
    "Batch",
    "DecodeRun",
    "EngineConfig",
    "EngineDriver",
    "IterationTimer",
    "RequestRecord",
    "Scheduler",
    "StepCost",
    "StepOutput",
]
