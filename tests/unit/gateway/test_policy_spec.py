"""What the gateway makes of ``--policy`` in each prompt mode: text mode's shadow index (the
gateway's own decisions in text chunks, not what the engines hold) turns off what needs the
engines' events unless the spec asks for it; token mode runs the policy as the simulator
does."""

from __future__ import annotations

from kvtide.gateway.app import Gateway
from kvtide.gateway.config import GatewayConfig, ReplicaSpec
from kvtide.routing.cost import CostAware
from kvtide.text import smollm2

SPECS = (ReplicaSpec("http://r0", "m"), ReplicaSpec("http://r1", "m"))


def _cost(policy: str, tokenizer: bool) -> CostAware:
    gw = Gateway(GatewayConfig(replicas=SPECS, policy=policy), smollm2() if tokenizer else None)
    assert gw.prompts.is_exact == tokenizer
    assert isinstance(gw.router.policy, CostAware)
    return gw.router.policy


def test_text_mode_turns_off_the_holder_rule_and_provisional_entries() -> None:
    cost = _cost("cost", tokenizer=False)
    assert cost.affinity_share == 0.0 and cost.provisional is None


def test_text_mode_keeps_what_the_spec_asks_for() -> None:
    cost = _cost("cost:affinity_share=0.3:provisional=true", tokenizer=False)
    assert cost.affinity_share == 0.3 and cost.provisional is not None


def test_token_mode_runs_the_policy_as_given() -> None:
    cost = _cost("cost", tokenizer=True)
    assert cost.affinity_share == 0.2 and cost.provisional is not None
