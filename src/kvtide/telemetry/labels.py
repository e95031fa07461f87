"""Bounded tenant labels: the busiest tenants by name, everyone else as ``other``.

A tenant gets its own label the first time it is among the busiest (by prompt tokens) while a
slot is free, and keeps it: a series never changes meaning, and counters stay monotonic.
"""

from __future__ import annotations

from collections.abc import Mapping

OTHER = "other"
DEFAULT = "default"
"""The label of requests without a tenant (an empty label value would read as absent)."""


class TenantLabels:
    __slots__ = ("limit", "named")

    def __init__(self, limit: int = 8) -> None:
        if limit < 0:
            raise ValueError("the tenant label limit must be >= 0")
        self.limit = limit
        self.named: dict[str, str] = {}

    def assign(self, traffic: Mapping[str, int]) -> None:
        """Names the busiest unnamed tenants of ``traffic`` (tenant -> prompt tokens) while
        slots are free."""
        free = self.limit - len(self.named)
        if free <= 0:
            return
        fresh = [t for t in traffic if t not in self.named]
        fresh.sort(key=lambda t: (-traffic[t], t))
        for tenant in fresh[:free]:
            self.named[tenant] = tenant or DEFAULT

    def label(self, tenant: str) -> str:
        return self.named.get(tenant, OTHER)
