"""The settings of a simulated run, each with its parser and bounds: one table that the flags of
`kvtide simulate` / `kvtide study` and the keys of a sweep YAML both go through, so that a
value means the same thing, and is refused the same way, wherever it is written.

``SETTINGS[key](value, name=...)`` parses one value (``name`` is what the message calls it:
the flag ``--gpu-cache-tokens`` or the key ``sweep.yaml: grid.gpu_cache_tokens[1]``);
``flag_type(key)`` is the same parser as an argparse ``type=``. ``check_pools`` refuses pools
the simulator cannot hold once the block size is known.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtide.core.admission import ADMISSION_FILTERS
from kvtide.engine.scheduler import SCHEDULING_POLICIES
from kvtide.errors import ConfigError
from kvtide.quantities import (
    InvalidValue,
    boolean,
    duration,
    flag,
    integer,
    items,
    real,
    text,
    tokens,
)
from kvtide.sim.fleet import Outage
from kvtide.workloads.workload import MAX_REQUESTS

MAX_REPLICAS = 4096
"""More replicas than any fleet this simulator is meant for (each holds its own pool)."""
MAX_POOL_BLOCKS = 1 << 24
"""Blocks one simulated pool (device, host or disk tier of one replica) may hold: 16.8M
blocks take 64 MiB and about 20 s to set up; more would exhaust memory before the first
event (10G tokens of 16-token blocks is 625M blocks)."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: its parser, the parser's bounds, and whether ``None`` (YAML null) means
    "unset"."""

    parse: Callable[..., object]
    bounds: Mapping[str, object] = field(default_factory=dict)
    optional: bool = False
    flag: str = ""
    """The command-line flag, when it is not ``--`` plus the key with dashes."""

    def __call__(self, value: object, *, name: str) -> object:
        if value is None and self.optional:
            return None
        return self.parse(value, name=name, **self.bounds)


def _part(
    parse: Callable[..., float], part: str, label: str, name: str, value: object, **bounds: Any
) -> float:
    """One field of a compound value; an error names the field and the whole value."""
    try:
        return parse(part, name=label, **bounds)
    except InvalidValue as exc:
        raise InvalidValue(name, value, f"{label} {exc.problem} ({exc.value!r})") from None


def outage(value: object, *, name: str) -> Outage:
    """``REPLICA:START[:END]``: replica index, then seconds after the first arrival."""
    if not isinstance(value, str) or len(parts := value.split(":")) not in (2, 3):
        raise InvalidValue(name, value, "expected REPLICA:START[:END] (e.g. 0:30:60)")
    replica = _part(integer, parts[0], "REPLICA", name, value, minimum=0)
    start = _part(duration, parts[1], "START", name, value)
    end = _part(duration, parts[2], "END", name, value) if len(parts) == 3 else None
    if end is not None and not end > start:
        raise InvalidValue(name, value, "an outage must END after it STARTs")
    return Outage(int(replica), start, end)


def window(value: object, *, name: str) -> tuple[float, float]:
    """``[START, END]`` (YAML) or ``START:END``: seconds after the first arrival, END later."""
    parts: object = value.split(":") if isinstance(value, str) else value
    if not isinstance(parts, list | tuple) or len(parts) != 2:
        raise InvalidValue(name, value, "expected [START, END] in seconds")
    start = _part(duration, parts[0], "START", name, value)
    end = _part(duration, parts[1], "END", name, value)
    if not end > start:
        raise InvalidValue(name, value, "the window must END after it STARTs")
    return (start, end)


def _outages(value: object, *, name: str) -> tuple[Outage, ...]:
    return tuple(items(value, outage, name=name, min_items=0))


SCENARIO_SETTINGS: Mapping[str, Setting] = {
    "workload": Setting(text),
    "requests": Setting(integer, {"minimum": 1, "maximum": MAX_REQUESTS}, optional=True),
    "block_tokens": Setting(tokens, {"minimum": 1, "maximum": 1 << 20}, optional=True),
    "time_scale": Setting(real, {"above": 0.0, "maximum": 1e9}),
    "load": Setting(real, {"above": 0.0, "maximum": 1e6}, optional=True),
    "seed": Setting(integer, {"minimum": 0, "maximum": 2**63 - 1}),
    "model": Setting(text),
    "gpu": Setting(text),
    "tp": Setting(integer, {"minimum": 1, "maximum": 64}),
    "replicas": Setting(integer, {"minimum": 1, "maximum": MAX_REPLICAS}),
    "router": Setting(text),
    "eviction": Setting(text),
    "gpu_cache_tokens": Setting(tokens, {"minimum": 1}),
    "host_cache_tokens": Setting(tokens),
    "host_admission": Setting(text, {"choices": frozenset(ADMISSION_FILTERS)}),
    "disk_cache_tokens": Setting(tokens),
    "event_delay_s": Setting(duration, {"maximum": 1e6}, flag="--event-delay"),
    "event_loss": Setting(real, {"minimum": 0.0, "below": 1.0}),
    "outages": Setting(_outages, flag="--outage"),
    "coordinator_outage": Setting(window, optional=True),
    "decode_replicas": Setting(integer, {"minimum": 0, "maximum": MAX_REPLICAS}),
    "kv_transfer": Setting(boolean),
}
"""Fields of ``kvtide.sim.scenario.Scenario``."""
ENGINE_SETTINGS: Mapping[str, Setting] = {
    "max_batched_tokens": Setting(tokens, {"minimum": 1, "maximum": 10**8}),
    "max_num_seqs": Setting(integer, {"minimum": 1, "maximum": 10**6}),
    "max_decode_steps": Setting(integer, {"minimum": 1, "maximum": 10**6}),
    "prefill_only": Setting(boolean),
    "scheduling_policy": Setting(text, {"choices": frozenset(SCHEDULING_POLICIES)}),
}
"""Fields of ``kvtide.engine.scheduler.EngineConfig``."""
SETTINGS: Mapping[str, Setting] = {**SCENARIO_SETTINGS, **ENGINE_SETTINGS}


def flag_name(key: str) -> str:
    """The command-line flag of a setting: ``gpu_cache_tokens`` -> ``--gpu-cache-tokens``."""
    return SETTINGS[key].flag or "--" + key.replace("_", "-")


def flag_type(key: str) -> Callable[[str], object]:
    """The setting's parser as an argparse ``type=`` (one-line error naming the flag)."""
    setting = SETTINGS[key]
    return flag(setting.parse, **setting.bounds)


_POOLS = (
    ("gpu_cache_tokens", "GPU"),
    ("host_cache_tokens", "host"),
    ("disk_cache_tokens", "disk"),
)


def check_pools(sizes: Mapping[str, int], block_tokens: int, name_of: Callable[[str], str]) -> None:
    """Refuses a device, host or disk pool (``sizes`` by setting key, tokens per replica)
    larger than ``MAX_POOL_BLOCKS`` blocks, or a tier too small for one block."""
    for key, tier in _POOLS:
        size = sizes.get(key, 0)
        blocks = size // block_tokens
        if blocks > MAX_POOL_BLOCKS:
            raise ConfigError(
                f"{name_of(key)}: {size:,} tokens is {blocks:,} blocks of {block_tokens} "
                f"tokens, more than the {MAX_POOL_BLOCKS:,} a simulated {tier} pool holds"
            )
        if size and not blocks:
            raise ConfigError(f"{name_of(key)}: {size:,} tokens hold no {block_tokens}-token block")
