"""Prefix identity: namespaces and request hashing shared by the simulator and the gateway."""

from __future__ import annotations

import numpy as np

from kvtide.core.hashing import hash_tokens
from kvtide.routing.identity import RequestHasher, namespace_seed, route_request
from kvtide.types import Request, TenantId


def _request(tenant: str, tokens: int = 64) -> Request:
    ids = np.arange(tokens, dtype=np.int32)
    return Request("r1", 0.0, tokens, 8, 16, token_ids=ids, tenant=TenantId(tenant), session_id="s")


def test_default_hasher_shares_the_model_namespace_across_tenants() -> None:
    hasher = RequestHasher(16, "m")
    a, b = hasher(_request("a")), hasher(_request("b"))
    assert a == b
    assert a == hash_tokens(np.arange(64), 16, namespace_seed("m"))


def test_tenant_seeds_separate_every_block() -> None:
    def seed_for(t: TenantId) -> int:
        return namespace_seed("m", tenant_salt=t.encode())

    hasher = RequestHasher(16, "m", seed_for)
    a, b = hasher(_request("a")), hasher(_request("b"))
    assert len(a) == len(b) == 4
    assert not set(a.tolist()) & set(b.tolist())


def test_namespace_seed_differs_by_model_salt_and_lora() -> None:
    seeds = {
        namespace_seed("m"),
        namespace_seed("n"),
        namespace_seed("m", b"x"),
        namespace_seed("m", lora="adapter"),
    }
    assert len(seeds) == 4


def test_route_request_carries_the_request_fields() -> None:
    req = _request("t", tokens=40)
    route = route_request(req, RequestHasher(16)(req), 16)
    assert (route.num_blocks, route.prompt_tokens, route.output_tokens) == (2, 40, 8)
    assert (route.request_id, route.tenant, route.session_id) == ("r1", "t", "s")
