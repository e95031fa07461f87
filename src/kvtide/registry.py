"""Building a component chosen by name (an eviction policy, an admission filter, a router)."""

from __future__ import annotations

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
    try:
        return factory(*args, **dict(options or {}))
    except TypeError as exc:
        raise ConfigError(f"bad options for {kind} {name!r}: {exc}") from exc
