"""Tenants: API keys (stored hashed) -> tenant, its secret cache salt and its limits.

Keys file (YAML), reloaded on SIGHUP::

    tenants:
      - name: acme
        key_sha256: 9f86d081...        # sha256 hex of the API key; keys never stored in clear
        max_concurrency: 8             # optional, else limits.max_concurrency
        tokens_per_minute: 200000      # optional, else limits.tokens_per_minute (0: none)

Tokens per minute: a request is admitted on its prompt and ``max_tokens`` (429 with
``Retry-After`` when the tenant's bucket lacks them), then charged what the engine's ``usage``
says it took, more or less; the bucket may go below empty, and the next requests wait.

A tenant's salt is HMAC-SHA256(tenant secret, name): the gateway sends it as the engines'
``cache_salt`` in place of anything the client sent, and hashes the tenant's blocks in a
namespace keyed by it, so no tenant can reach another's cached prefix.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvtide.clock import Clock
from kvtide.errors import ConfigError
from kvtide.gateway.config import Limits, read_yaml
from kvtide.gateway.status import RATE_LIMITED, UNAUTHORIZED, ApiError

DEFAULT_TENANT = "default"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(slots=True)
class Tenant:
    name: str
    salt: str
    """Hex cache salt sent to the engines ("" for the keyless default tenant)."""
    max_concurrency: int
    tokens_per_minute: int
    in_flight: int = 0
    bucket_tokens: float = 0.0
    bucket_s: float = 0.0
    unshared: int = 0
    """Tokens charged here since the last exchange with the other gateway replicas
    (``--state redis://``)."""
    extra: dict[str, object] = field(default_factory=dict)


class TokenBucket:
    """Tokens per minute as a bucket of one minute's allowance, refilled continuously."""

    @staticmethod
    def take(tenant: Tenant, tokens: int, now_s: float) -> float | None:
        """Takes ``tokens`` or returns the seconds until they would be there."""
        rate = tenant.tokens_per_minute
        if rate <= 0:
            return None
        level = TokenBucket._refilled(tenant, now_s)
        need = min(tokens, rate)  # a request above a minute's allowance waits for a full one
        if level >= need:
            tenant.bucket_tokens = level - tokens
            return None
        return (need - level) / (rate / 60.0)

    @staticmethod
    def spend(tenant: Tenant, tokens: float, now_s: float) -> None:
        """Takes ``tokens`` (a refund when negative) whether or not they are there: the
        bucket may go below empty, and the next requests wait until it refills."""
        if tenant.tokens_per_minute > 0:
            tenant.bucket_tokens = TokenBucket._refilled(tenant, now_s) - tokens

    @staticmethod
    def _refilled(tenant: Tenant, now_s: float) -> float:
        """The bucket brought to ``now_s`` (at most a minute's allowance); its level."""
        rate = tenant.tokens_per_minute
        level = min(rate, tenant.bucket_tokens + (now_s - tenant.bucket_s) * rate / 60.0)
        tenant.bucket_tokens, tenant.bucket_s = level, now_s
        return level


class TenantTable:
    """Key hash -> tenant. Without a keys file every request is the default tenant."""

    def __init__(self, secret: bytes, limits: Limits, clock: Clock) -> None:
        self.secret = secret
        self.limits = limits
        self.clock = clock
        self.by_key_hash: dict[str, Tenant] = {}
        self.by_name: dict[str, Tenant] = {}
        self.default = Tenant(DEFAULT_TENANT, "", limits.max_concurrency, limits.tokens_per_minute)
        self.requires_key = False
        self.shared = False
        """Other gateway replicas share the limits (``--state redis://``): count what is
        charged here for them (``take_unshared``)."""

    def salt_for(self, name: str) -> str:
        return hmac.new(self.secret, name.encode(), hashlib.sha256).hexdigest()[:32]

    def load(self, path: str | None) -> None:
        """(Re)reads the keys file; tenants keep their counters across a reload."""
        if path is None:
            self.requires_key = False
            return
        raw = read_yaml(path)
        entries = raw.get("tenants")
        if not isinstance(entries, list):
            raise ConfigError(f"{path}: expected 'tenants:' with a list of entries")
        by_key: dict[str, Tenant] = {}
        by_name: dict[str, Tenant] = {}
        for i, entry in enumerate(entries):
            tenant, key_hash = self._entry(path, i, entry)
            old = self.by_name.get(tenant.name)
            if old is not None:  # keep in-flight counts and bucket state
                old.max_concurrency = tenant.max_concurrency
                old.tokens_per_minute = tenant.tokens_per_minute
                tenant = old
            by_key[key_hash] = by_name.setdefault(tenant.name, tenant)
        self.by_key_hash, self.by_name = by_key, by_name
        self.requires_key = True

    def _entry(self, path: str, i: int, entry: object) -> tuple[Tenant, str]:
        where = f"{path}: tenants[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: expected a mapping")
        unknown = set(entry) - {"name", "key_sha256", "max_concurrency", "tokens_per_minute"}
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
        name, key_hash = entry.get("name"), str(entry.get("key_sha256", "")).lower()
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}.name: expected a non-empty string")
        if not _HEX64.match(key_hash):
            raise ConfigError(f"{where}.key_sha256: expected 64 hex digits (sha256 of the key)")
        conc = entry.get("max_concurrency", self.limits.max_concurrency)
        tpm = entry.get("tokens_per_minute", self.limits.tokens_per_minute)
        if not isinstance(conc, int) or conc < 1 or not isinstance(tpm, int) or tpm < 0:
            raise ConfigError(f"{where}: max_concurrency >= 1 and tokens_per_minute >= 0")
        return Tenant(name, self.salt_for(name), conc, tpm), key_hash

    def authenticate(self, authorization: str | None) -> Tenant:
        """The tenant of an ``Authorization: Bearer KEY`` header."""
        if not self.requires_key:
            return self.default
        if not authorization or not authorization.startswith("Bearer "):
            raise ApiError(UNAUTHORIZED, "missing API key (Authorization: Bearer KEY)")
        tenant = self.by_key_hash.get(hash_key(authorization[7:].strip()))
        if tenant is None:
            raise ApiError(UNAUTHORIZED, "invalid API key")
        return tenant

    def admit(self, tenant: Tenant, tokens: int) -> None:
        """Books one request of about ``tokens`` tokens, or raises a 429 with Retry-After."""
        if tenant.in_flight >= tenant.max_concurrency:
            raise ApiError(
                RATE_LIMITED,
                f"tenant {tenant.name!r}: {tenant.max_concurrency} concurrent requests",
                retry_after_s=1.0,
            )
        wait_s = TokenBucket.take(tenant, tokens, self.clock.now())
        if wait_s is not None:
            raise ApiError(
                RATE_LIMITED,
                f"tenant {tenant.name!r}: {tenant.tokens_per_minute} tokens per minute",
                retry_after_s=float(math.ceil(wait_s)),
            )
        tenant.in_flight += 1
        if self.shared and tenant.tokens_per_minute > 0:
            tenant.unshared += tokens

    def settle(self, tenant: Tenant, charged: int, used: int) -> None:
        """Books what a request took once the engine's ``usage`` tells (``used``: its prompt
        and completion tokens) against what ``admit`` charged before it ran (its prompt and
        ``max_tokens``, 16 where a chat request set none and the engine may write thousands):
        a tokens-per-minute limit counts the tokens served, not the ones asked for."""
        if tenant.tokens_per_minute > 0:
            TokenBucket.spend(tenant, used - charged, self.clock.now())
            if self.shared:
                tenant.unshared += used - charged

    def take_unshared(self) -> dict[str, int]:
        """Each limited tenant's tokens charged here since the last call (what the other
        gateway replicas are told)."""
        out = {}
        for tenant in self._limited():
            out[tenant.name] = tenant.unshared
            tenant.unshared = 0
        return out

    def spent_elsewhere(self, spent: Mapping[str, int]) -> None:
        """Tokens the other gateway replicas charged these tenants: taken from the buckets
        here, so N replicas hold a tenant to its one limit (within a sync period's admits)."""
        now_s = self.clock.now()
        for name, tokens in spent.items():
            tenant = self.default if name == DEFAULT_TENANT else self.by_name.get(name)
            if tenant is not None and tokens:
                TokenBucket.spend(tenant, tokens, now_s)

    def _limited(self) -> list[Tenant]:
        tenants = [self.default, *self.by_name.values()]
        return [t for t in tenants if t.tokens_per_minute > 0]

    @staticmethod
    def release(tenant: Tenant) -> None:
        tenant.in_flight = max(tenant.in_flight - 1, 0)
