"""Router specs: one parser for the simulator's --router and the gateway's --policy."""

from __future__ import annotations

import pytest

from kvtide.clock import ManualClock
from kvtide.errors import ConfigError
from kvtide.routing import GlobalPrefixIndex, RoutingContext
from kvtide.routing.cost import CostAware
from kvtide.routing.specs import build_policy, needs_index, parse_router, policy_names


def test_parse_router_types_each_option() -> None:
    name, options = parse_router("cost:epsilon=0.5:key_blocks=8:provisional=false:load=work")
    assert name == "cost"
    assert options == {"epsilon": 0.5, "key_blocks": 8, "provisional": False, "load": "work"}


def test_parse_router_rejects_an_option_without_value() -> None:
    with pytest.raises(ConfigError, match="expected NAME:key=value"):
        parse_router("cost:epsilon")


def test_build_policy_passes_options_to_the_registry_object() -> None:
    ctx = RoutingContext(index=GlobalPrefixIndex(), clock=ManualClock())
    policy = build_policy("cost:epsilon=0.5", ctx)
    assert isinstance(policy, CostAware)
    assert policy.epsilon == 0.5


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("cost:epsilon=x", "epsilon must be a number, got 'x'"),
        ("cost:holder_extra=abc", "holder_extra must be a number, got 'abc'"),
        ("cost:provisional=maybe", "provisional must be true or false, got 'maybe'"),
        ("cost:bogus=1", "unexpected keyword argument 'bogus'"),
    ],
)
def test_an_option_of_the_wrong_kind_is_named(spec: str, message: str) -> None:
    # text where a number or a flag is expected: never passed on (a truthy 'maybe' would
    # turn a flag on unnoticed), and the error names the option
    ctx = RoutingContext(index=GlobalPrefixIndex(), clock=ManualClock())
    with pytest.raises(ConfigError, match=message):
        build_policy(spec, ctx)
    assert build_policy("cost:load=requests", ctx).load == "requests"  # type: ignore[attr-defined]


def test_unknown_router_lists_the_valid_names() -> None:
    with pytest.raises(ConfigError, match=r"valid: .*round_robin"):
        build_policy("nope", RoutingContext(clock=ManualClock()))


def test_needs_index_follows_the_registry() -> None:
    assert needs_index("cost:epsilon=1") and needs_index("precise")
    assert not needs_index("round_robin") and not needs_index("chash")
    assert "cost" in policy_names()
