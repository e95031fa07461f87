"""Router specs ``NAME[:key=value...]`` to a policy from the registry: what the simulator's
``--router`` and the gateway's ``--policy`` both parse, so they build the very same objects.
"""

from __future__ import annotations

from kvtide.errors import ConfigError
from kvtide.routing.policies import RoutingContext, RoutingPolicy
from kvtide.routing.registry import NEEDS_INDEX, POLICIES, make_policy


def policy_names() -> list[str]:
    return sorted(POLICIES)


def parse_router(spec: str) -> tuple[str, dict[str, object]]:
    """``NAME[:key=value[:key=value...]]`` into a name and options (ints, floats, booleans,
    strings); the colon keeps commas free for lists of routers."""
    name, *items = spec.split(":")
    options: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in items)):
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"router {spec!r}: expected NAME:key=value[:key=value...]")
        options[key.strip()] = _value(raw.strip())
    return name.strip(), options


def _value(raw: str) -> object:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for convert in (int, float):
        try:
            return convert(raw)
        except ValueError:
            pass
    return raw


def needs_index(spec: str) -> bool:
    """Whether the policy ``spec`` names reads ``RoutingContext.index`` (default options)."""
    return parse_router(spec)[0] in NEEDS_INDEX


def build_policy(spec: str, ctx: RoutingContext) -> RoutingPolicy:
    """A policy from the registry by name, with options (``NAME[:key=value...]``)."""
    name, options = parse_router(spec)
    if name not in POLICIES:
        raise ConfigError(f"unknown router {name!r} (valid: {', '.join(policy_names())})")
    return make_policy(name, ctx, options)
