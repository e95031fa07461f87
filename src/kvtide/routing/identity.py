"""Prefix identity: the hash namespace of a request and the hashes of its full blocks.

The simulator, the gateway and the engines' event translation must agree on both, or the
event-fed index never matches a request: a namespace is (model, tenant salt, LoRA adapter),
and a request's blocks are chained ``core.hashing`` hashes in it at the engines' block size.
"""

from __future__ import annotations

from collections.abc import Callable

from kvtide.core.hashing import BlockHashes, Namespace, request_block_hashes
from kvtide.routing.request import RouteRequest
from kvtide.types import Request, TenantId


def namespace_seed(
    model: str = "default", tenant_salt: bytes = b"", lora: str | None = None
) -> int:
    """The chain seed of a namespace. ``tenant_salt`` is a server-side secret per tenant
    (the gateway's), never a client's ``cache_salt``; ``b""`` shares one namespace."""
    return Namespace(model=model, tenant_salt=tenant_salt, lora=lora).seed


def cache_salt_seed(model: str, cache_salt: str | None) -> int:
    """An engine's namespace for a request carrying vLLM's ``cache_salt``: two salts never
    share a block. The salt is whatever the client sent (as in vLLM); the gateway replaces it
    with a secret per tenant, so it never reaches an engine from a client."""
    salt = b"" if cache_salt is None else b"cache_salt:" + cache_salt.encode()
    return namespace_seed(model, salt)


class RequestHasher:
    """A ``Request``'s full-block hashes at ``block_tokens`` tokens per block.

    ``seed_for`` gives a tenant's namespace seed; without it every tenant hashes in the
    model's shared namespace (the simulator's default: tenants of a trace may share blocks).
    Seeds are memoised per tenant.
    """

    __slots__ = ("_seeds", "block_tokens", "model", "seed_for")

    def __init__(
        self,
        block_tokens: int,
        model: str = "default",
        seed_for: Callable[[TenantId], int] | None = None,
    ) -> None:
        self.block_tokens = block_tokens
        self.model = model
        self.seed_for = seed_for
        self._seeds: dict[TenantId, int] = {}

    def seed(self, tenant: TenantId) -> int:
        seed = self._seeds.get(tenant)
        if seed is None:
            fn = self.seed_for
            seed = fn(tenant) if fn is not None else namespace_seed(self.model)
            self._seeds[tenant] = seed
        return seed

    def __call__(self, request: Request) -> BlockHashes:
        return request_block_hashes(request, self.block_tokens, self.seed(request.tenant))


def route_request(request: Request, hashes: BlockHashes, block_tokens: int) -> RouteRequest:
    """What a router is told about ``request`` (already hashed into ``hashes``)."""
    return RouteRequest(
        block_hashes=hashes,
        prompt_tokens=request.prompt_tokens,
        block_tokens=block_tokens,
        request_id=request.request_id,
        tenant=request.tenant,
        session_id=request.session_id,
        output_tokens=request.output_tokens,
    )
