"""Which engine holds each stored Responses answer, so that a later request naming it goes there.

A Responses request may name an earlier answer (``previous_response_id``) instead of sending
the conversation again; vLLM (with ``VLLM_ENABLE_RESPONSES_API_STORE=1``) keeps answers in the
engine process that wrote them, so any other engine answers such a request 404, and
``GET /v1/responses/{id}`` and its ``/cancel`` likewise. The gateway notes the engine and the
tenant of each answer it passes on (the id from the answer's body or its stream's
``response.created`` event) and sends the follow-ups there; prefix routing has nothing to
choose for them: the engine prepends the stored conversation itself. Another tenant naming the
id gets a 404: the engine would hand it the conversation (vLLM's store knows no tenants).

Bounded: the oldest entries go first past ``capacity`` (~200 bytes each; vLLM's own store
keeps every answer until the engine restarts). An id this gateway never saw (another gateway
replica's, or one from before a restart) is routed as any request is; where it lands on
another engine, that engine's 404 reaches the client, as it would from vLLM itself.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from kvtide.types import ReplicaId

DEFAULT_CAPACITY = 262_144
"""Stored answers remembered: ~50 MiB at most, days of an agent fleet's turns."""


class ResponseHomes:
    """Response id -> the replica that wrote it and the tenant it was written for, least
    recently used out first."""

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        on_record: Callable[[str, ReplicaId, str], None] | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.on_record = on_record
        """Told of each answer passed on here (``--state redis``: shared with the others)."""
        self._homes: OrderedDict[str, tuple[ReplicaId, str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._homes)

    def record(self, response_id: str, replica: ReplicaId, tenant: str) -> None:
        if self.on_record is not None:
            self.on_record(response_id, replica, tenant)
        self.learn(response_id, replica, tenant)

    def learn(self, response_id: str, replica: ReplicaId, tenant: str) -> None:
        """Notes a home another gateway recorded (told no one)."""
        homes = self._homes
        homes[response_id] = (replica, tenant)
        homes.move_to_end(response_id)
        if len(homes) > self.capacity:
            homes.popitem(last=False)

    def get(self, response_id: object) -> tuple[ReplicaId, str] | None:
        """The replica that wrote ``response_id`` (a client's value: anything) and its
        tenant, if known."""
        if not isinstance(response_id, str):
            return None
        home = self._homes.get(response_id)
        if home is not None:
            self._homes.move_to_end(response_id)
        return home

    def forget(self, replica: ReplicaId) -> None:
        """A replica removed: its answers went with it."""
        for response_id in [r for r, home in self._homes.items() if home[0] == replica]:
            del self._homes[response_id]
