"""Tenants: API keys (stored hashed) -> tenant, its secret cache salt and its limits.

Keys file (YAML), reloaded on SIGHUP::

    tenants:
      - name: acme
        key_sha256: 9f86d081...        # sha256 hex of the API key; keys never stored in clear
        max_concurrency: 8             # optional, else limits.max_concurrency
        tokens_per_minute: 200000      # optional, else limits.tokens_per_minute (0: none)

Tokens per minute: a request is admitted on its prompt and ``max_tokens`` (429 with
``Retry-After`` when the tenant's bucket lacks them; at most a minute's allowance is booked),
then charged what the engine's ``usage`` says it took, or, for a stream that ended before its
usage event, the tokens streamed; the bucket may go below empty, and the next requests wait. A
request the engine refused, or that never reached an engine's output, is charged nothing.

A tenant's salt is HMAC-SHA256(tenant secret, name): the gateway sends it as the engines'
``cache_salt`` in place of anything the client sent, and hashes the tenant's blocks in a
namespace keyed by it, so no tenant can reach another's cached prefix.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvtide.clock import Clock
from kvtide.errors import ConfigError
from kvtide.gateway.config import Limits, is_sha256_hex, read_yaml
from kvtide.gateway.status import RATE_LIMITED, UNAUTHORIZED, ApiError

DEFAULT_TENANT = "default"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header (None: no such header)."""
    if not authorization or not authorization.startswith("Bearer "):
        return None
    return authorization[7:].strip()


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
        """Takes ``booked(tenant, tokens)`` or returns the seconds until they would be there."""
        rate = tenant.tokens_per_minute
        if rate <= 0:
            return None
        level = TokenBucket._refilled(tenant, now_s)
        need = TokenBucket.booked(tenant, tokens)
        if level >= need:
            tenant.bucket_tokens = level - need
            return None
        return (need - level) / (rate / 60.0)

    @staticmethod
    def booked(tenant: Tenant, tokens: int) -> int:
        """What admitting a request of about ``tokens`` tokens takes from the bucket: at most
        a minute's allowance. A request above it waits for a full bucket and empties it;
        the rest is charged once the request is settled on what it took, so one admission
        leaves no debt (a ``max_tokens`` of ten million, refused by the engine, would
        otherwise shut the tenant out for days)."""
        rate = tenant.tokens_per_minute
        return min(tokens, rate) if rate > 0 else tokens

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
        """(Re)reads the keys file; tenants keep their counters across a reload. All or
        nothing: a file with one bad entry changes no tenant (the running limits stay)."""
        if path is None:
            self.requires_key = False
            return
        raw = read_yaml(path)
        entries = raw.get("tenants")
        if not isinstance(entries, list):
            raise ConfigError(f"{path}: expected 'tenants:' with a list of entries")
        # every entry checked before any limit is applied to a live tenant
        checked = [self._entry(path, i, entry) for i, entry in enumerate(entries)]
        by_key: dict[str, Tenant] = {}
        by_name: dict[str, Tenant] = {}
        for new, key_hash in checked:
            tenant = by_name.get(new.name)
            if tenant is None:  # a name's first entry gives its limits
                tenant = by_name[new.name] = self._renewed(new)
            by_key[key_hash] = tenant
        self.by_key_hash, self.by_name = by_key, by_name
        self.requires_key = True

    def _renewed(self, new: Tenant) -> Tenant:
        """The running tenant of ``new``'s name with ``new``'s limits (its in-flight count
        and bucket kept), or ``new`` for a name not seen before."""
        old = self.by_name.get(new.name)
        if old is None:
            return new
        old.max_concurrency = new.max_concurrency
        old.tokens_per_minute = new.tokens_per_minute
        return old

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
        if not is_sha256_hex(key_hash):
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
        key = bearer_key(authorization)
        if key is None:
            raise ApiError(UNAUTHORIZED, "missing API key (Authorization: Bearer KEY)")
        tenant = self.by_key_hash.get(hash_key(key))
        if tenant is None:
            raise ApiError(UNAUTHORIZED, "invalid API key")
        return tenant

    def admit(self, tenant: Tenant, tokens: int) -> int:
        """Books one request of about ``tokens`` tokens, or raises a 429 with Retry-After;
        the tokens booked (``TokenBucket.booked``), what ``settle`` is later told."""
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
        booked = TokenBucket.booked(tenant, tokens)
        if self.shared and tenant.tokens_per_minute > 0:
            tenant.unshared += booked
        return booked

    def settle(self, tenant: Tenant, charged: int, used: int) -> None:
        """Books what a request took once it is over (``used``: its prompt and completion
        tokens, 0 for one that the engine refused or never ran) against what ``admit``
        charged before it ran (its prompt and ``max_tokens``, 16 where a chat request set
        none and the engine may write thousands): a tokens-per-minute limit counts the
        tokens served, not the ones asked for."""
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
        named = {t.name: t for t in self._active()}
        for name, tokens in spent.items():
            tenant = named.get(name)
            if tenant is not None and tokens:
                TokenBucket.spend(tenant, tokens, now_s)

    def _limited(self) -> list[Tenant]:
        return [t for t in self._active() if t.tokens_per_minute > 0]

    def _active(self) -> list[Tenant]:
        """The tenants a request can be of: the keys file's, or the keyless default one
        alone. Not both: a keys-file tenant may be named "default" too."""
        return list(self.by_name.values()) if self.requires_key else [self.default]

    @staticmethod
    def release(tenant: Tenant) -> None:
        tenant.in_flight = max(tenant.in_flight - 1, 0)
