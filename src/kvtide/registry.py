"""Building a component chosen by name (an eviction policy, an admission filter, a router)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TypeVar

from kvtide.errors import ConfigError

T = TypeVar("T")


def build_named(
    kind: str,
    registry: Mapping[str, Callable[..., T]],
    name: str,
    *args: object,
    options: Mapping[str, object] | None = None,
) -> T:
    """``registry[name](*args, **options)``; an unknown name or a bad option is a ConfigError
    that names the ``kind`` and lists the valid names."""
    factory = registry.get(name)
    if factory is None:
        valid = ", ".join(sorted(registry))
        raise ConfigError(f"unknown {kind} {name!r} (valid: {valid})")
    mistyped = _mistyped(factory, options or {})
    if mistyped is not None:
        raise ConfigError(f"bad options for {kind} {name!r}: {mistyped}")
    try:
        return factory(*args, **dict(options or {}))
    except TypeError as exc:
        raise ConfigError(f"bad options for {kind} {name!r}: {exc}") from exc


def _mistyped(factory: Callable[..., object], options: Mapping[str, object]) -> str | None:
    """The first option given as text where the factory's default is a number or a boolean
    (``x=abc``), named: passed on, a truthy string would switch a flag on unnoticed and a
    number's TypeError (a comparison, an arithmetic) names no option."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return None
    for key, value in options.items():
        param = params.get(key)
        if param is None or not isinstance(value, str):
            continue
        default = param.default
        if isinstance(default, bool):
            return f"{key} must be true or false, got {value!r}"
        if isinstance(default, int | float):
            return f"{key} must be a number, got {value!r}"
    return None
