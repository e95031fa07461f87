"""`kvtide demo`'s Ctrl-C ends the whole demo even where the load absorbs the cancellation
that asyncio.run's own SIGINT handler sends: a run that returned normally would let the demo
go on to the next router (seen as an intermittent test_sigint_stops_every_child failure)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

import pytest

from kvtide.cli import demo
from kvtide.loadgen import LoadConfig


async def _absorbing_load(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """A load whose requests swallow their cancellation and return, as a client library that
    turns a cancel into an error outcome would."""
    os.kill(os.getpid(), signal.SIGINT)
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(30)  # the interrupt's cancel ends this at once
    return {}


async def _finishing_load(*args: Any, **kwargs: Any) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {}


def _drive() -> None:
    config = LoadConfig(url="http://127.0.0.1:9", model=demo.MODEL, duration_s=2.0, seed=0)
    progress = demo.Progress("cost", 0)
    spec = demo.workload_spec(1, 2.0)
    asyncio.run(demo.interruptible(demo.drive(config.url, [], progress, config, spec, None, [])))


def test_ctrl_c_is_an_interrupt_even_when_the_load_absorbs_the_cancel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(demo, "run_load", _absorbing_load)
    with pytest.raises(KeyboardInterrupt):
        _drive()
    # the handler is the interpreter's default again: a later Ctrl-C is a KeyboardInterrupt
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_run_without_ctrl_c_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "run_load", _finishing_load)
    _drive()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
